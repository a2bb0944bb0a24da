"""sharedmodel.py: N clients on ONE model equal the threaded N-model reference, bit for bit.

Against `simulation.simulate` (one model and one thread per client, the real clients over the
in-memory transport): the same final hash, the same hash after every step, the same complete
steps (what the evaluator logs) and the same ByteCounter rows, on ring / torus / complete graphs
with delayed and full flooding and with overlap. The run directory `sharedmodel.run` writes
equals what the evaluator writes when it is fed the reference's steps (log bytes, metrics lines
minus timing, checkpoints), also across a resume; `seedflood simulate` prints the launched
run's summary lines and refuses bad input in one line.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from seedflood import cli
from seedflood.bench import wirecost
from seedflood.core.config import runconfig as config
from seedflood.core.flood import lockstep
from seedflood.core.flood import protocol as proto
from seedflood.core.flood.flooding import FloodError
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.transport import EOS, Inbox
from seedflood.core.topology import builders
from seedflood.core.topology import resolve as topology
from seedflood.core.wire.message import Message, encode
from seedflood.ml.workload import Workload
from seedflood.roles import sharedmodel
from seedflood.roles.evaluator import Evaluator, Settings, restore
from seedflood.roles.inprocess import simulate
from seedflood.rundir.layout import CheckpointError
from seedflood.rundir.logheader import LOG_MAGIC, log_header
from seedflood.rundir.summary import RunSummary

torch.set_num_threads(1)

BASE = [
    "model.name=tiny",
    "task.name=synthetic",
    "run.threads=1",
    "zo.lr=1.0",
    "task.batch_size=4",
    "task.train_examples=64",
    "task.dev_examples=16",
    "task.test_examples=16",
]
TIMING = ("eval_seconds", "elapsed_seconds")


def cfg_for(*overrides: str) -> config.Config:
    return config.load(None, BASE + list(overrides))


CASES = {
    "ring5-delayed": ("topology.kind=ring", "topology.nodes=5", "flood.hops_per_step=1"),
    "ring5-full": ("topology.kind=ring", "topology.nodes=5", "flood.hops_per_step=0"),
    "torus9-delayed": ("topology.kind=torus", "topology.nodes=9", "flood.hops_per_step=1"),
    "complete4-full": ("topology.kind=complete", "topology.nodes=4", "flood.hops_per_step=0"),
    "ring5-overlap-k2": ("topology.kind=ring", "topology.nodes=5", "flood.overlap=true", "zo.perturbations=2"),
    "star4-gaussian": (
        "topology.kind=star",
        "topology.nodes=4",
        "zo.direction=gaussian",
        "zo.lr=1e-3",
        "flood.hops_per_step=1",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_equals_the_threaded_n_model_reference(case):
    cfg = cfg_for(*CASES[case], "run.steps=5")
    ref = simulate(cfg)
    got = sharedmodel.simulate(cfg)
    assert set(ref.hashes.values()) == {got.hash}
    for node, hashes in ref.step_hashes.items():
        assert hashes == got.step_hashes, f"node {node} differs after some step"
    assert len(set(got.step_hashes)) == 5, "the model must change every step"
    assert got.records == ref.records
    assert [s for s, _ in got.records] == list(range(5))
    assert got.counter.rows() == ref.counter.rows()
    assert sum(n for *_, n in got.counter.rows()) > 0


@pytest.mark.parametrize("steps", [2, 3])
def test_a_run_shorter_than_its_drain_lag_hops_every_local_step_and_equals_the_reference(steps):
    """A ring of 12 at one hop a step needs more hops than 2 or 3 steps run: the drain hops every
    local step up to the one that completes step 0 (it once jumped there, and step 0 was short)."""
    cfg = cfg_for("topology.kind=ring", "topology.nodes=12", "flood.hops_per_step=1", f"run.steps={steps}")
    ref = simulate(cfg)
    got = sharedmodel.simulate(cfg)
    assert set(ref.hashes.values()) == {got.hash} and got.records == ref.records
    assert [s for s, _ in got.records] == list(range(steps))
    assert got.counter.rows() == ref.counter.rows()


def test_the_byte_count_with_overlap_equals_the_model_free_count():
    """wirecost.count(overlap=True) runs the same Lockstep schedule without a model."""
    cfg = cfg_for(
        "topology.kind=ring", "topology.nodes=6", "flood.hops_per_step=1", "flood.overlap=true", "run.steps=4"
    )
    got = sharedmodel.simulate(cfg, hash_every_step=False)
    want = wirecost.count(builders.ring(6), 4, hops_per_step=1, overlap=True)
    assert got.counter.rows() == want.rows()
    # Overlap changes when a step is applied (one step later), never what travels or when: the
    # drain runs with lag delay − 1, so the traffic is the plain run's, hop for hop.
    assert want.rows() == wirecost.count(builders.ring(6), 4, hops_per_step=1).rows()


def test_one_model_for_every_client(monkeypatch):
    builds = []
    real = Workload.build.__func__

    def counting(cls, *a, **k):
        builds.append(1)
        return real(cls, *a, **k)

    monkeypatch.setattr(Workload, "build", classmethod(counting))
    r = sharedmodel.simulate(cfg_for("topology.kind=ring", "topology.nodes=12", "run.steps=2"), hash_every_step=False)
    assert len(builds) == 1 and len(r.sim.lockstep.floods) == 12


@pytest.mark.parametrize("hops", [0, 1])
def test_stop_and_resume_equals_the_uninterrupted_run_and_the_reference(hops):
    cfg = cfg_for("topology.kind=ring", "topology.nodes=5", f"flood.hops_per_step={hops}", "run.steps=6")
    whole = sharedmodel.simulate(cfg, hash_every_step=False)
    first = sharedmodel.simulate(cfg, hash_every_step=False, stop=3)
    assert [s for s, _ in first.records] == list(range(3 - hops))  # ring of 5: diameter 2, delay 1 with 1 hop
    logged = first.records
    second = sharedmodel.simulate(cfg, hash_every_step=False, resume=logged)
    ref = simulate(cfg, hash_every_step=False, resume=logged)
    assert second.hash == whole.hash == ref.hashes[0]
    assert second.records == whole.records == ref.records
    assert second.counter.rows() == ref.counter.rows()


def test_every_node_must_hold_the_same_complete_step():
    """The lockstep refuses to hand out a step two nodes hold differently (never applied)."""
    top = builders.ring(3)
    lock = lockstep.Lockstep(top, 1, 1, 0)
    for i in top.nodes:
        lock.floods[i].originate([Message.make(i, 0, 0, 1.0)])
    lock.run_hops(0)
    store = lock.floods[2]._store[0]
    store[(0, 0, 0)] = Message.make(0, 0, 0, 2.0)  # node 2's copy of origin 0 differs
    applied = []
    with pytest.raises(FloodError, match="node 2 holds other messages of step 0"):
        lock.apply_through(0, lambda s, m: applied.append(s))
    assert applied == []


# -- the run directory ---------------------------------------------------------------------------


def dir_cfg(out: Path, *extra: str) -> config.Config:
    return cfg_for(
        "topology.kind=ring",
        "topology.nodes=5",
        "flood.hops_per_step=1",
        "run.steps=6",
        "eval.every=2",
        "checkpoint.every=3",
        "checkpoint.hf_model=false",
        f"run.out_dir={out}",
        *extra,
    )


def evaluator_fed(cfg: config.Config, records) -> dict:
    """The trusted second path: the launched evaluator's code, its own model copy, fed the
    reference's steps through an inbox (as tests/unit/roles/test_evaluator.py does)."""
    top = topology.build(cfg.topology)
    p = Protocol.of(cfg, top.diameter)
    w = Workload.build(cfg)
    start = restore(w, p, Path(cfg.run.out_dir), [])
    header = log_header(cfg, proto.trajectory(cfg, p, w.train_digest()), w.loaded.identity, w.loaded.base_hash)
    inbox = Inbox("test")
    for _, msgs in records:
        inbox.put(encode(msgs))
    inbox.put(EOS)
    ev = Evaluator(Settings.of(cfg), p, w, inbox, header, start_step=start, progress=False)
    try:
        return ev.run()
    finally:
        ev.close()


def lines(run: Path) -> list[dict]:
    """metrics.jsonl without the timing fields; log_bytes counted from the first record (the
    header holds the config, whose out_dir differs between the directories compared)."""
    header = (run / "log.bin").stat().st_size - len(log_parts(run / "log.bin")[1])
    out = []
    for ln in (run / "metrics.jsonl").read_text().splitlines():
        record = {k: v for k, v in json.loads(ln).items() if k not in TIMING}
        record["log_bytes"] -= header
        out.append(record)
    return out


def metas(run: Path) -> dict[str, str]:
    return {
        c.name: json.loads((c / "meta.json").read_text())["param_hash"] for c in (run / "checkpoints").glob("step_*")
    }


def log_parts(path: Path) -> tuple[dict, bytes]:
    """(header with config.run.out_dir removed, every record's bytes) of a message log."""
    data = path.read_bytes()
    assert data.startswith(LOG_MAGIC)
    at = len(LOG_MAGIC)
    (n,) = struct.unpack_from("<I", data, at)
    header = json.loads(data[at + 4 : at + 4 + n])
    del header["config"]["run"]["out_dir"]
    return header, data[at + 4 + n + 4 :]  # after the header's u32 CRC


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory) -> tuple[Path, dict, str]:
    """The evaluator's run directory for the reference's steps, its final record and hash."""
    out = tmp_path_factory.mktemp("ref") / "run"
    cfg = dir_cfg(out)
    ref = simulate(cfg, hash_every_step=False)
    final = evaluator_fed(cfg, ref.records)
    assert final["param_hash"] == ref.hashes[0]
    return out, final, ref.hashes[0]


def same_directory(got: Path, want: Path) -> None:
    """Equal log records (bytes) and header (but out_dir), metrics minus timing, checkpoints."""
    assert log_parts(got / "log.bin") == log_parts(want / "log.bin")
    assert lines(got) == lines(want)
    assert metas(got) == metas(want)


def test_run_writes_the_evaluators_run_directory(tmp_path, reference_dir):
    ref_dir, ref_final, ref_hash = reference_dir
    out = tmp_path / "shared"
    summary = sharedmodel.run(dir_cfg(out), progress=False).to_dict()
    same_directory(out, ref_dir)
    assert [ln["step"] for ln in lines(out)] == [0, 2, 4, 6]
    assert set(metas(out)) == {"step_000003", "step_000006"}
    assert (out / "config.yaml").read_text() == (ref_dir / "config.yaml").read_text().replace(str(ref_dir), str(out))
    assert summary["param_hash"] == ref_hash == summary["final"]["param_hash"]
    assert summary["final"] == json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert summary["final"]["accuracy"] == ref_final["accuracy"] and summary["final"]["loss"] == ref_final["loss"]
    assert json.loads((out / "summary.json").read_text()) == summary
    # the run-directory contract (common to every algorithm) and the launched summary's keys
    assert summary["algorithm"] == "seedflood" and summary["bit_identical"] is True
    assert summary["consensus_distance"] == 0.0 and summary["consensus"]
    assert summary["client_hashes"] == [ref_hash] * 5 and summary["zero_shot"]["step"] == 0
    cum = summary["bytes_per_edge_cumulative"]
    assert len(cum) == 6 and cum == sorted(cum) and cum[-1] == summary["bytes_per_edge_run"] > 0
    edges = summary["bytes_per_edge"]
    assert len(edges) == 10 and sum(edges.values()) / 10 == summary["bytes_per_edge_run"]
    assert LAUNCHED_KEYS <= set(summary)


LAUNCHED_KEYS = {
    "algorithm", "steps", "clients", "topology", "diameter", "delay", "param_hash", "client_hashes", "consensus",
    "client_step_hashes", "bytes_per_edge", "bytes_per_edge_per_step", "bytes_total", "flood", "threads", "memory",
    "zero_shot", "final", "resumed_from_step", "resumed_log_steps", "model_dir", "log", "bytes_per_edge_run",
    "bytes_per_edge_cumulative", "wall_seconds", "consensus_distance", "bit_identical",
}  # fmt: skip
"""train._evaluate's summary keys (tests/dist/test_simulate_gloo.py compares them with a real run)."""


def test_resume_continues_the_run_directory_exactly(tmp_path, reference_dir):
    """3 steps (delay 1: step 2 is held complete, not applied, by every node), then the
    same directory to 6: the log, metrics and checkpoints of the uninterrupted run."""
    ref_dir, _, ref_hash = reference_dir
    out = tmp_path / "resumed"
    first = sharedmodel.run(dir_cfg(out, "run.steps=3"), progress=False).to_dict()
    assert first["param_hash"] != ref_hash
    second = sharedmodel.run(dir_cfg(out), progress=False).to_dict()
    # 3 logged steps, of which steps 0..1 are applied on resume (delay 1): checkpoint.every=3 left
    # none within them, so the state came from the base weights (resumed_from_step: the checkpoint)
    assert second["resumed_log_steps"] == 3 and second["resumed_from_step"] == 0
    assert second["param_hash"] == ref_hash
    # the first launch scored its final step 3, which the uninterrupted run does not: one history
    # keeps it (as the launched evaluator does), so compare the lines of the uninterrupted run
    got = [ln for ln in lines(out) if not (ln["step"] == 3 and ln.get("final"))]
    assert got == lines(ref_dir)
    (h_got, r_got), (h_want, r_want) = log_parts(out / "log.bin"), log_parts(ref_dir / "log.bin")
    assert r_got == r_want and h_got["trajectory"] == h_want["trajectory"]  # the header is the first launch's
    assert metas(out) == metas(ref_dir)


def test_a_resume_under_other_settings_is_refused_and_changes_nothing(tmp_path):
    out = tmp_path / "changed"
    sharedmodel.run(dir_cfg(out, "run.steps=2"), progress=False)
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    with pytest.raises(CheckpointError, match=r"zo.eps \(0.001 -> 0.05\)"):
        sharedmodel.run(dir_cfg(out, "run.steps=4", "zo.eps=0.05"), progress=False)
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


def test_a_resume_with_another_clip_is_refused_by_name(tmp_path):
    """zo.clip is in the trajectory once set: a run directory written with clip 5 refuses a
    resume without it or with clip 10 (naming the key), and continues under clip 5."""
    out = tmp_path / "clipped"
    sharedmodel.run(dir_cfg(out, "run.steps=2", "zo.clip=5"), progress=False)
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    for other, shown in (([], "absent"), (["zo.clip=10"], "10.0")):
        with pytest.raises(CheckpointError, match=rf"settings differ: zo.clip \(5.0 -> {shown}\);"):
            sharedmodel.run(dir_cfg(out, "run.steps=4", *other), progress=False)
        assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
    assert sharedmodel.run(dir_cfg(out, "run.steps=4", "zo.clip=5"), progress=False).to_dict()["resumed_log_steps"] == 2


def test_clipped_clients_stay_bit_identical_and_equal_the_shared_model():
    """zo.clip = 1 (the bound is the median itself, so every step clamps its largest honest
    scalars): the threaded N-model run keeps every client on the same bits after every step, and
    the shared-model run ends on them; the clip changed the trajectory."""
    cfg = cfg_for(*CASES["ring5-delayed"], "run.steps=4", "zo.clip=1")
    ref = simulate(cfg)
    assert all(len(set(hs)) == 1 for hs in zip(*ref.step_hashes.values()))
    got = sharedmodel.simulate(cfg)
    assert set(ref.hashes.values()) == {got.hash} and got.records == ref.records
    unclipped = sharedmodel.simulate(cfg_for(*CASES["ring5-delayed"], "run.steps=4"), hash_every_step=False)
    assert unclipped.hash != got.hash


# -- the command ---------------------------------------------------------------------------------


def test_simulate_command_prints_the_launched_summary(tmp_path, capsys):
    out = tmp_path / "cli"
    sets = [a for o in BASE + ["run.steps=2", f"run.out_dir={out}", "checkpoint.hf_model=false"] for a in ("--set", o)]
    assert cli.main(["simulate", *sets]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "steps 2, 4 clients on ring4 (diameter 2)"
    assert printed[1].startswith("zero-shot:  accuracy") and printed[2].startswith("final:      accuracy")
    assert printed[4].startswith("consensus: all 4 clients equal the evaluator")
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (["zo.lrr=1"], "unknown key 'zo.lrr'"),
        (["task.train_examples=2"], "task.train_examples=2 is fewer than the 4 clients"),
        (["flood.step_window=1", "flood.hops_per_step=1"], "flood.step_window"),
    ],
)
def test_simulate_refuses_a_bad_config_in_one_line(tmp_path, capsys, sets, words):
    args = [a for o in BASE + [f"run.out_dir={tmp_path / 'bad'}", *sets] for a in ("--set", o)]
    assert cli.main(["simulate", *args]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("seedflood: error:") and words in err[0], err
    assert not (tmp_path / "bad").exists()


def test_simulate_sends_other_algorithms_to_baselines(tmp_path, capsys, monkeypatch):
    args = [a for o in BASE + [f"run.out_dir={tmp_path / 'b'}", "algorithm.name=dsgd"] for a in ("--set", o)]
    seen = []
    summary = RunSummary(
        algorithm="dsgd",
        steps=2,
        clients=4,
        topology="ring4",
        final={"accuracy": 0.5, "auc": None, "threshold_accuracy": 0.5, "loss": 1.0},
        zero_shot=None,
        bytes_total=0,
        bytes_per_edge_run=2048.0,
        bytes_per_edge_cumulative=[1024.0, 2048.0],
        wall_seconds=1.0,
        consensus_distance=0.25,
        bit_identical=False,
    )
    from seedflood.experiments import baselines

    monkeypatch.setattr(baselines, "run", lambda cfg, progress=True: seen.append(cfg.algorithm.name) or summary)
    assert cli.main(["simulate", *args]) == 0
    assert seen == ["dsgd"]
    out = capsys.readouterr().out
    assert "dsgd: steps 2, 4 clients on ring4" in out and "consensus distance 0.25" in out
