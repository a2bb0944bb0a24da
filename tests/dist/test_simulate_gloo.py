"""`seedflood simulate` (one process, one model) against the real run: 1 evaluator + 4 clients over gloo.

The same config, run both ways into the same run directory path (the launched run's directory is
moved aside first, so the log header, which holds the config and its out_dir, is the same bytes):
- the same final hash, and the same hash after every step (run.hash_steps);
- a byte-identical log.bin and config.yaml, equal metrics lines but for the timing fields
  (eval_seconds, elapsed_seconds), identical checkpoint meta.json files;
- the same per-edge bytes (per edge, per step mean, cumulative) and per-node flood statistics; the
  launched bytes_total exceeds the simulated one by exactly the evaluator's channel (one pushed
  frame per step plus the end-of-stream marker: the simulation has no such channel);
- the same end-of-run summary lines on stdout, and every summary key but the launched clients'
  `cost` (their own CPU and held messages).
On a ring with one hop per step (delay 1) and on a complete graph with overlap (delay 1).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import procs as harness
import runs
from seedflood.core.flood.transport import HEADER
from seedflood.rundir.logheader import LOG_MAGIC

pytestmark = [pytest.mark.dist, pytest.mark.timeout(1800)]  # the waits are bounded by progress
DEBUG = str(runs.DEBUG)
TIMING = ("eval_seconds", "elapsed_seconds")
CASES = {
    "ring-delayed": ("topology.kind=ring", "flood.hops_per_step=1"),
    "complete-overlap": ("topology.kind=complete", "flood.overlap=true"),
}


def args(out: Path, extra: tuple[str, ...]) -> list[str]:
    sets = [
        f"run.out_dir={out}",
        "run.steps=6",
        "run.hash_steps=true",
        "eval.every=2",
        "checkpoint.every=3",
        "checkpoint.hf_model=false",
        *extra,
    ]
    return ["--config", DEBUG, *[a for s in sets for a in ("--set", s)]]


def metrics(run: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if k not in TIMING}
        for line in (run / "metrics.jsonl").read_text().splitlines()
    ]


def metas(run: Path) -> dict[str, str]:
    return {c.name: (c / "meta.json").read_text() for c in sorted((run / "checkpoints").glob("step_*"))}


@pytest.mark.parametrize("case", sorted(CASES))
def test_simulate_equals_the_launched_run(run_world, procs_ok, tmp_path, case):
    out = tmp_path / "run"
    procs = run_world(
        [sys.executable, "-m", "seedflood", "train", *args(out, CASES[case])], nprocs=5, watch=[out / "log.bin"]
    )
    procs_ok(procs)
    launched = tmp_path / "launched"
    out.rename(launched)

    # an outer bound only: one process, six tiny steps
    sim = harness.run([sys.executable, "-m", "seedflood", "simulate", *args(out, CASES[case])], timeout=900)
    assert sim.returncode == 0, sim.stderr[-3000:]

    got, want = (json.loads((d / "summary.json").read_text()) for d in (out, launched))
    assert want["consensus"] and got["consensus"] and want["delay"] == got["delay"] == 1
    assert got["param_hash"] == want["param_hash"] and got["client_hashes"] == want["client_hashes"]
    assert got["client_step_hashes"] == want["client_step_hashes"]
    assert len(want["client_step_hashes"][0]) == 6
    assert (out / "log.bin").read_bytes() == (launched / "log.bin").read_bytes()
    assert (out / "config.yaml").read_bytes() == (launched / "config.yaml").read_bytes()
    assert metrics(out) == metrics(launched)
    assert [m["step"] for m in metrics(out)] == [0, 2, 4, 6]
    assert metas(out) == metas(launched) and len(metas(out)) == 2
    for key in (
        "bytes_per_edge",
        "bytes_per_edge_per_step",
        "bytes_per_edge_cumulative",
        "bytes_per_edge_run",
        "flood",
    ):
        assert got[key] == want[key], key
    for key in ("algorithm", "consensus_distance", "bit_identical", "steps", "clients", "topology", "diameter"):
        assert got[key] == want[key], key
    # every launched key but `cost`: each launched client's own CPU and held messages (roles/cost.py),
    # a measurement of its process that one shared-model process cannot make (timing, like TIMING)
    assert set(want) - {"cost"} <= set(got) and "cost" in want
    # the launched counter also holds the evaluator's channel: per step HEADER + the step's frame
    # (the log record minus its u32 step), then the end-of-stream marker
    log = (out / "log.bin").read_bytes()
    magic = len(LOG_MAGIC)
    header = magic + 4 + int.from_bytes(log[magic : magic + 4], "little") + 4  # ... JSON, u32 header CRC
    records = len(log) - header  # u32 step, u32 len, frame
    assert want["bytes_total"] - got["bytes_total"] == records - 4 * 6 + HEADER
    # the same end-of-run summary lines as the launched evaluator prints
    assert sim.stdout.splitlines() == procs[0].stdout.splitlines()
    assert sim.stdout.splitlines()[4].startswith("consensus: all 4 clients equal the evaluator")
