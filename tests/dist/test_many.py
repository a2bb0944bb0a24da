"""Many clients on one machine: 32 `seedflood train` clients + the evaluator (33 processes) of a
small tiny model on a 4×8 torus, on a 2-core machine, end hash-equal to the single-process
reference (simulation.simulate of the same config).

Clients share what can be shared without giving up independence: each runs one intra-op thread
(run.threads = 0 splits the cores over the launcher's LOCAL_WORLD_SIZE), shared libraries are
mapped once, and every process reports its memory (RSS / PSS / USS) in summary.json.
Few steps and a narrow model keep it to about a minute of start-up plus seconds of training.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from seedflood.core.config import runconfig as config
from seedflood.ml import machine
from seedflood.roles.inprocess import simulate

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]
DEBUG = str(ROOT / "launch" / "configs" / "debug.yaml")
N = 32
SETTINGS = [
    "topology.kind=file",
    "topology.file=torus4x8.yaml",  # shipped in topologies/: 4 rows × 8 columns, diameter 6
    f"topology.nodes={N}",
    "run.steps=2",
    "run.threads=0",  # the automatic rule under test: cores // local processes, at least 1
    "model.tiny={hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1}",
    "task.train_examples=256",  # 8 per client: one batch each
    "eval.every=0",
    "checkpoint.every=0",
    "transport.timeout_s=300",  # 33 processes starting on 2 cores reach the rendezvous late
]


@pytest.mark.timeout(1800)  # the wait is bounded by progress (procs.Procs.wait_for); an outer bound
def test_32_client_processes_on_a_torus_match_the_in_memory_reference(run_world, procs_ok, tmp_path):
    out = tmp_path / "many"
    sets = [a for o in [*SETTINGS, f"run.out_dir={out}"] for a in ("--set", o)]
    # OMP_NUM_THREADS as a plain shell has it (torch's default: every core), not run_world's 1,
    # so the one thread each client reports comes from run.threads = 0 and LOCAL_WORLD_SIZE.
    env = {"OMP_NUM_THREADS": str(machine.cpus())}
    argv = [sys.executable, "-m", "seedflood", "train", "--config", DEBUG, *sets]
    procs = run_world(argv, N + 1, env=env, watch=[out / "log.bin"])
    procs_ok(procs)
    s = json.loads((out / "summary.json").read_text())

    torch.set_num_threads(1)
    cfg = config.load(DEBUG, [*SETTINGS, "run.out_dir=/nonexistent"])
    reference = set(simulate(cfg, hash_every_step=False).hashes.values())
    assert len(reference) == 1

    assert (s["clients"], s["topology"], s["diameter"]) == (N, "torus4x8", 6)
    assert s["consensus"] and {s["param_hash"]} == reference
    assert s["client_hashes"] == [s["param_hash"]] * N
    assert s["threads"] == [machine.threads_for(0, N + 1)] * N
    mem = [s["memory"]["evaluator"], *s["memory"]["clients"]]
    if mem[0] is not None:  # Linux: /proc/self/smaps_rollup
        assert all(0 < m["uss"] <= m["pss"] <= m["rss"] for m in mem)
        mib = [{k: round(v / 2**20) for k, v in m.items()} for m in mem]
        print(f"memory MiB: evaluator {mib[0]}, client 0 {mib[1]}, sum of PSS {sum(m['pss'] for m in mem) / 2**20:.0f}")
    print("seconds per rank (start to exit):", [round(p.seconds, 1) for p in procs])
