"""Old runs still work: a signed churn run directory made by an older commit (tests/fixtures/oldrun,
its README says how and at which commit) is still read by today's code. It passes `seedflood
check --roster` with the roster `seedflood keys` wrote, it and each client's own log replay to the
hash the run recorded (pinned here too, so a summary rewritten along with the code is caught), a
shared-model resume restores its checkpoint and continues its log to more steps, and its churn
clients, signed, resume from its log in process. The fixture is never touched: each test works on a
copy. Controls: one flipped byte of a step record fails check and replay (its CRC), one of a seal
record fails check (its signature); a change of the log format, the header's trajectory, the hash
or the apply fails the tests that read it. Offline, a few seconds.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch

from seedflood import cli
from seedflood.core.config import runconfig
from seedflood.core.flood import protocol as proto
from seedflood.core.topology import resolve as topology
from seedflood.core.zo.replay import Applier, state_hash
from seedflood.ml.workload import Workload
from seedflood.roles import sharedmodel
from seedflood.roles.inprocess import simulate
from seedflood.rundir.layout import RunDir
from seedflood.rundir.logfile import LogReader
from seedflood.rundir.resume import resume_records

torch.set_num_threads(1)
pytestmark = pytest.mark.timeout(300)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "oldrun"
RECORDED = "4adb79a82a5fcf83a68ada06fcd654363975af7e4fae5575d3ef5ae9f7a085a0"  # its summary.json's param_hash
STEPS, CLIENTS = 6, 4
MAGIC = b"SEEDFLOOD-LOG 3\n"  # the log format it was written in: a new one must still read it
SEAL = 0x4000_0000  # a record's step with this bit: the seal record of that step


@pytest.fixture
def old(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A private copy of the fixture (run directory, keys) under tmp_path: (run, keys)."""
    keys = shutil.copytree(FIXTURE / "keys", tmp_path / "keys")
    for key in keys.glob("node-*.key"):
        key.chmod(0o600)  # git keeps no mode 600, and a key readable by others is refused
    run = shutil.copytree(FIXTURE / "run", tmp_path / "run")
    # made on one machine: the tests check formats and hashes, not that this CPU is the one it ran on
    monkeypatch.setenv("SEEDFLOOD_ANY_BUILD", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return run, keys


def config(run: Path, keys: Path, steps: int = STEPS) -> runconfig.Config:
    """The run's recorded config.yaml, pointed at the copy and its keys."""
    return runconfig.load(run / "config.yaml", [f"run.out_dir={run}", f"trust.keys={keys}", f"run.steps={steps}"])


def records_at(log: Path) -> dict[int, tuple[int, int]]:
    """Record step field (a step, or a step with SEAL) -> (byte offset, length) of each record."""
    data = log.read_bytes()
    assert data.startswith(MAGIC), data[: len(MAGIC)]
    (n,) = struct.unpack_from("<I", data, len(MAGIC))
    off, out = len(MAGIC) + 4 + n + 4, {}  # magic, header length, header, header CRC
    while off < len(data):
        step, length = struct.unpack_from("<II", data, off)
        out[step] = (off, length)
        off += 8 + length
    assert off == len(data)
    return out


def flip(log: Path, record: int) -> None:
    """Flip one bit in the middle of a record's payload."""
    off, length = records_at(log)[record]
    data = bytearray(log.read_bytes())
    data[off + 8 + length // 2] ^= 1
    log.write_bytes(bytes(data))


def replayed(capsys: pytest.CaptureFixture[str], run_dir: Path) -> dict:
    assert cli.main(["replay", str(run_dir), "--json"]) == 0
    out = capsys.readouterr()
    assert out.err == "", out.err  # no warning: every step's seals prove it
    return json.loads(out.out)


def test_the_fixture_is_a_signed_churn_run_of_six_steps_with_a_seal_before_every_step() -> None:
    cfg = runconfig.load(FIXTURE / "run" / "config.yaml")
    assert cfg.churn.settle == 1 and cfg.trust.sign and cfg.topology.nodes == CLIENTS and cfg.run.steps == STEPS
    for log in [FIXTURE / "run" / "log.bin", *sorted((FIXTURE / "run" / "clients").glob("node-*/log.bin"))]:
        assert sorted(records_at(log)) == [*range(STEPS), *(SEAL | s for s in range(STEPS))], log
    summary = json.loads((FIXTURE / "run" / "summary.json").read_text())
    assert summary["final"]["param_hash"] == RECORDED and summary["client_hashes"] == [RECORDED] * CLIENTS


def test_the_old_run_passes_check_with_the_roster_keys_wrote(old, capsys) -> None:
    run, keys = old
    assert cli.main(["check", str(run), "--roster", str(keys / "roster.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "ok": True,
        "steps": STEPS,
        "checkpoints": ["step_000003"],
        "signed": True,
        "roster": str(keys / "roster.json"),
    }


def test_the_old_run_and_each_clients_log_replay_to_the_hash_it_recorded(old, capsys) -> None:
    run, _ = old
    assert replayed(capsys, run) == {"steps": STEPS, "param_hash": RECORDED}
    for node in range(CLIENTS):
        assert replayed(capsys, run / "clients" / f"node-{node}")["param_hash"] == RECORDED


def test_control_a_flipped_byte_of_a_step_record_fails_check_and_replay(old, capsys) -> None:
    run, keys = old
    flip(run / "log.bin", 3)
    assert cli.main(["check", str(run), "--roster", str(keys / "roster.json")]) == 2
    assert "(step 3) is corrupt: frame checksum mismatch" in capsys.readouterr().err
    assert cli.main(["replay", str(run)]) == 2
    assert "(step 3) is corrupt" in capsys.readouterr().err


def test_control_a_flipped_byte_of_a_seal_record_fails_check(old, capsys) -> None:
    run, keys = old
    flip(run / "log.bin", SEAL | 2)
    assert cli.main(["check", str(run), "--roster", str(keys / "roster.json")]) == 2
    assert "step 2 fails its signatures" in capsys.readouterr().err


def test_the_old_run_resumes_from_its_checkpoint_and_log_to_more_steps(old, capsys) -> None:
    """`seedflood simulate` on the run directory with more steps: its resume reads the old header
    (refusing other settings), restores checkpoint step 3, replays the logged steps after it and
    appends steps 6 and 7, which replay to the hash it ends on."""
    run, keys = old
    before = (run / "log.bin").read_bytes()
    argv = ["simulate", "--config", str(run / "config.yaml"), "--set", f"trust.keys={keys}", "--set", "run.steps=8"]
    assert cli.main([*argv, "--set", f"run.out_dir={run}"]) == 0
    capsys.readouterr()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from_step"] == 3 and summary["steps"] == 8
    after = LogReader(run / "log.bin").read()[1]
    assert [s for s, _ in after] == list(range(8))
    assert after[:STEPS] == LogReader(FIXTURE / "run" / "log.bin").read()[1], "the old steps are kept as logged"
    assert (run / "log.bin").read_bytes()[: len(before)] == before, "appended to, never rewritten"
    # the shared model signs nothing: steps 6 and 7 carry no seal record, so replay warns and
    # `check` refuses them (a launched resume signs them); steps 0..5 keep theirs
    assert cli.main(["replay", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["param_hash"] == summary["final"]["param_hash"] != RECORDED


def test_the_old_runs_signed_churn_clients_resume_from_its_log_in_process(old) -> None:
    """The clients' side of a relaunch: today's resume takes the old log's steps (refusing a
    header whose trajectory or base model differs), and the four signed churn clients continue
    from them to step 8 on one history, which a replay from the base weights and the shared-model
    simulation resumed from the same steps reproduce. (Relaunched with `launch/churn.sh` at
    run.steps=8, the fixture ended on 4e5328f0a25f3c15 at 64bff78 with a log `check --roster`
    proves; this AVX2 machine's bits, so not pinned here.)"""
    run, keys = old
    cfg = config(run, keys, steps=8)
    top = topology.topology_of(cfg)
    p = proto.Protocol.of(cfg, top.diameter)
    w = Workload.build(cfg)
    records = resume_records(
        RunDir.of(cfg), p, proto.trajectory(cfg, p, w.train_digest()), w.loaded.base_hash, resume=True
    )
    assert [s for s, _ in records] == list(range(STEPS))
    r = simulate(cfg, resume=records)
    assert r.exits == {} and sorted(r.hashes) == list(range(CLIENTS)), r.exits
    assert [s for s, _ in r.records] == list(range(8)) and r.records[:STEPS] == records
    assert all({m.origin for m in msgs} == set(range(CLIENTS)) for _, msgs in r.records[STEPS:])
    assert all(s.forged == 0 for s in r.flood.values())
    Applier(w.direction, p).apply_all(r.records)
    assert set(r.hashes.values()) == {state_hash(w.model, w.direction)}
    # the shared model resumed from the same steps is where the launched run would be: the same bits
    shared = sharedmodel.simulate(cfg, hash_every_step=False, resume=records)
    assert shared.records == r.records and set(r.hashes.values()) == {shared.hash}
