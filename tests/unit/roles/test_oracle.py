"""The independent oracle (tests/oracle.py) against the in-memory reference run.

A simulation of the debug config writes the log its evaluator would write (node 0's applied
steps through LogWriter); the oracle, reading those bytes with its own parser and its
own lr schedule, must reach every client's hash after every step, and must stop agreeing as soon
as one logged scalar changes (or refuse the log when the change breaks a checksum or a step).
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path

import pytest
import torch

import oracle
from seedflood.core.config import rng
from seedflood.core.config import runconfig as config
from seedflood.core.wire import message
from seedflood.roles.inprocess import SimResult, simulate
from seedflood.rundir.logfile import LogWriter
from seedflood.rundir.logheader import LOG_MAGIC, read_header

torch.set_num_threads(1)

DEBUG = Path(__file__).resolve().parents[3] / "launch" / "configs" / "debug.yaml"
COMMON = ["run.threads=1", "task.train_examples=128", "task.dev_examples=0", "task.test_examples=8"]
# Config variants: the debug run as it is (constant lr, sum, subcge merging every step), a decaying
# schedule with warmup, mean aggregation and a delayed merge, the Gaussian family, and the clip.
VARIANTS = {
    "debug": ["run.steps=4"],
    "cosine-mean-merge2": [
        "run.steps=5",
        "zo.schedule=cosine",
        "zo.warmup_steps=2",
        "zo.aggregate=mean",
        "zo.lr=4.0",
        "subspace.merge_every=2",
        "zo.perturbations=2",
    ],
    "linear-gaussian": ["run.steps=3", "zo.direction=gaussian", "zo.lr=1e-3", "zo.schedule=linear"],
    # zo.clip = 1: the bound is the median itself, so every step clamps its largest scalars
    "clip1": ["run.steps=4", "zo.clip=1"],
}


def write_log(path: Path, res: SimResult, base_hash: str, run_seed: int) -> None:
    """The log of a simulated run, as the evaluator writes it (LogWriter, one record per step)."""
    trajectory = {"run.seed": run_seed}  # a v2 log's reader derives the seeds from it
    header = {"base_identity": "tiny (test)", "base_hash": base_hash, "trajectory": trajectory, "config": {}}
    writer = LogWriter(path, header)
    for step, msgs in res.records:
        writer.append(step, msgs)
    writer.close()


@pytest.fixture(scope="module", params=list(VARIANTS))
def run(request, tmp_path_factory) -> tuple[config.Config, SimResult, Path]:
    cfg = config.load(DEBUG, COMMON + VARIANTS[request.param])
    res = simulate(cfg)
    log = tmp_path_factory.mktemp(request.param) / "log.bin"
    write_log(log, res, res.workloads[0].loaded.base_hash, cfg.run.seed)
    return cfg, res, log


def test_oracle_equals_every_client_after_every_step(run):
    cfg, res, log = run
    steps = cfg.run.steps
    assert [s for s, _ in res.records] == list(range(steps))
    final = set(res.hashes.values())
    assert len(final) == 1
    assert oracle.oracle_hash(cfg, log) == (steps, final.pop())
    for s in range(steps):
        want = {hs[s] for hs in res.step_hashes.values()}
        assert len(want) == 1
        assert oracle.oracle_hash(cfg, log, upto=s) == (s + 1, want.pop()), f"after step {s}"


def test_oracle_reads_a_config_file(run, tmp_path):
    cfg, res, log = run
    path = tmp_path / "config.yaml"
    path.write_text(config.dump(cfg))
    assert oracle.oracle_hash(path, log) == oracle.oracle_hash(cfg, log)


def _rewrite(log: Path, out: Path, edit) -> None:
    """Copy `log` to `out` with `edit(step, messages) -> messages` applied to every record,
    re-encoded with valid frames (correct counts and checksums)."""
    data = log.read_bytes()
    seed_of = functools.partial(rng.derive, read_header(log)["trajectory"]["run.seed"])
    (n,) = struct.unpack_from("<I", data, len(LOG_MAGIC))
    pos = len(LOG_MAGIC) + 4 + n + 4  # magic, u32 n, JSON header, u32 header CRC
    parts = [data[:pos]]
    while pos < len(data):
        step, length = struct.unpack_from("<II", data, pos)
        msgs = message.decode(data[pos + 8 : pos + 8 + length], seed_of=seed_of)
        frame = message.encode(edit(step, msgs))
        parts.append(struct.pack("<II", step, len(frame)) + frame)
        pos += 8 + length
    out.write_bytes(b"".join(parts))


def test_one_changed_scalar_changes_the_hash(run, tmp_path):
    cfg, res, log = run
    _, good = oracle.oracle_hash(cfg, log)
    altered = tmp_path / "altered.bin"

    def change_one(step, msgs):
        # the smallest |scalar| of step 1, scaled by 1.5 (a valid frame otherwise); the smallest,
        # because under zo.clip a scalar already clamped to the bound may stay clamped when scaled
        if step == 1:
            low = min(msgs, key=lambda m: abs(m.scalar))
            msgs = [
                message.Message.make(m.origin, m.step, m.seed, m.scalar * 1.5, m.k) if m is low else m for m in msgs
            ]
        return msgs

    _rewrite(log, altered, change_one)
    assert altered.read_bytes() != log.read_bytes()
    steps, bad = oracle.oracle_hash(cfg, altered)
    assert steps == cfg.run.steps and bad != good
    assert bad not in {h for hs in res.step_hashes.values() for h in hs}
    # Steps before the altered one still agree with the run.
    assert oracle.oracle_hash(cfg, altered, upto=0) == (1, res.step_hashes[0][0])


def test_corrupt_or_incomplete_logs_are_refused(run, tmp_path):
    cfg, _, log = run
    data = bytearray(log.read_bytes())
    # A flipped bit in the last message's scalar (bytes 16..19 of its 24-byte record): CRC fails.
    flipped = tmp_path / "flipped.bin"
    data[-24 + 16] ^= 0x01
    flipped.write_bytes(bytes(data))
    with pytest.raises(oracle.OracleError, match="checksum"):
        oracle.oracle_hash(cfg, flipped)
    # A step with one message missing, in an otherwise valid frame.
    missing = tmp_path / "missing.bin"
    _rewrite(log, missing, lambda step, msgs: msgs[1:] if step == 0 else msgs)
    with pytest.raises(oracle.OracleError, match="step 0 is not complete"):
        oracle.oracle_hash(cfg, missing)
    # A torn tail (the last 5 bytes cut off).
    torn = tmp_path / "torn.bin"
    torn.write_bytes(log.read_bytes()[:-5])
    with pytest.raises(oracle.OracleError, match="truncated"):
        oracle.oracle_hash(cfg, torn)
    # A log of other base weights.
    other = config.load(DEBUG, COMMON + ["model.tiny={seed: 1}"])
    with pytest.raises(oracle.OracleError, match="base"):
        oracle.oracle_hash(other, log)


def test_learning_rate_matches_documented_values():
    lr = oracle.learning_rate
    assert [lr(s, 3.0, "constant", 3, 100) for s in (0, 1, 2, 3)] == pytest.approx([1.0, 2.0, 3.0, 3.0])
    assert lr(60, 2.0, "linear", 10, 110) == pytest.approx(1.0)
    assert lr(50, 1.0, "cosine", 0, 100) == pytest.approx(0.5)
    assert lr(500, 1.0, "cosine", 0, 100) == pytest.approx(0.0, abs=1e-12)
