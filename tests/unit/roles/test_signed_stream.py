"""A signed run's evaluator trusts no client it follows, and its log proves every step (docs/trust.md, What
the evaluator and the log verify): the evaluator in one process, fed a churn run's steps signed with real
Ed25519 keys (comm/identity.py) and certified by signed votes, as the attach node streams them; then
`seedflood check` and `seedflood replay` of the run directory it wrote.

One module-scoped honest run (6 steps of the debug config) is shared by the tests that read its directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import runs
from seedflood import cli
from seedflood.comm import identity
from seedflood.core.churn.agreement import GENESIS, Proof, Value, Vote, step_digest
from seedflood.core.churn.certificate import Certificate, certify
from seedflood.core.config import runconfig as config
from seedflood.core.flood import protocol as proto
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.signing import Signing
from seedflood.core.flood.stepstream import decode_signed_step, encode_step
from seedflood.core.flood.transport import EOS, Inbox
from seedflood.core.topology.resolve import build
from seedflood.core.wire import message
from seedflood.core.zo.replay import state_hash
from seedflood.ml.workload import Workload
from seedflood.roles.evaluator import Evaluator, EvaluatorError, Settings, restore
from seedflood.roles.identities import roster_record, run_tag, verifier_of
from seedflood.roles.inprocess import simulate
from seedflood.rundir.clientlog import complete_from_clients
from seedflood.rundir.layout import RunDir
from seedflood.rundir.logfile import LogReader, LogWriter
from seedflood.rundir.logheader import LOG_MAGIC, log_header

ROOT = Path(__file__).resolve().parents[3]
DEBUG = ROOT / "launch" / "configs" / "debug.yaml"
N = 4
torch.set_num_threads(1)


class Run:
    """The signed debug run's pieces: config, protocol, header, keys, and the steps' messages."""

    def __init__(self, out: Path, keys: Path) -> None:
        sets = [f"run.out_dir={out}", "checkpoint.every=3", "churn.settle=1", "trust.sign=true", f"trust.keys={keys}"]
        self.cfg = config.load(DEBUG, sets)
        self.p = Protocol.of(self.cfg, build(self.cfg.topology).diameter)
        self.w = Workload.build(self.cfg)
        trajectory = proto.trajectory(self.cfg, self.p, self.w.train_digest())
        self.header = log_header(self.cfg, trajectory, self.w.loaded.identity, self.w.loaded.base_hash)
        self.header["trust"] = roster_record(self.cfg)
        roster = identity.load_roster(keys)
        tag = run_tag(trajectory, roster.hex())
        self.signing = {
            i: Signing(i, tag, identity.load_identity(keys, i, roster).sign, roster.verify) for i in range(N)
        }

    def stream(self, records, *, lie_at: int = -1, short_at: int = -1) -> list[bytes]:
        """The attach node's pushes: each step's messages with their origins' signatures and the
        certificate of its commit (every node votes; certify keeps a quorum). `lie_at`: that
        step's node-1 scalar is altered after the commit; `short_at`: that step's certificate
        holds one vote short of a quorum."""
        prev, out = GENESIS, []
        for s, msgs in records:
            sealed = [self.signing[m.origin].seal(replace(m, sig=b"")) for m in msgs]
            value = Value(prev, frozenset(range(N)), (), step_digest(prev, s, sealed, ()))
            votes = [self.signing[o].seal(Vote(s, 0, o, 0, value).note(self.p.ids)) for o in range(N)]
            cert = certify(s, votes, value, Proof(0, frozenset(range(N)), {}), self.p.ids)
            assert cert is not None
            if s == short_at:
                cert = replace(cert, voters=cert.voters[:-1])
            if s == lie_at:
                sealed = [replace(m, scalar=m.scalar * 10) if m.origin == 1 else m for m in sealed]
            out.append(encode_step(sealed, None, cert.to_bytes()))
            prev = value.digest
        return out

    def evaluate(self, frames: list[bytes], hashes: list[str] | None = None, start: int = 0) -> Evaluator:
        """An evaluator of this run fed `frames` (the steps from `start`: a resume from the run
        directory's log and checkpoint); run to its end or its error."""
        inbox = Inbox("node 0 (the attach node)")
        for f in frames[start:]:
            inbox.put(f)
        inbox.put(EOS)
        verifier = verifier_of(self.header, self.p, certified=True)
        assert verifier is not None and verifier.churn
        settings = Settings.of(self.cfg)
        ev = Evaluator(settings, self.p, self.w, inbox, self.header, start, progress=False, verifier=verifier)
        if hashes is not None:
            ev.listeners.append(lambda *_: hashes.append(state_hash(self.w.model, self.w.direction)))
        try:
            ev.run()
        finally:
            ev.close()
        return ev


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    """The honest run: (its Run, its run directory, the steps, the state hash after each step)."""
    root = tmp_path_factory.mktemp("signed")
    keys = identity.write_keys(root / "keys", N)
    sim = simulate(config.load(DEBUG, [f"run.out_dir={root / 'sim'}"]), hash_every_step=False)
    run = Run(root / "run", keys)
    hashes: list[str] = []
    run.evaluate(run.stream(sim.records), hashes)
    assert hashes[-1] in set(sim.hashes.values()), "signed, the evaluator ends on the bits of the unsigned run"
    return run, root / "run", sim.records, hashes


def steps_logged(run_dir: Path) -> list:
    return LogReader(run_dir / "log.bin").read()[1]


@pytest.mark.parametrize("lie", ["altered scalar", "no quorum"])
def test_a_step_its_sender_cannot_prove_is_refused_never_applied_and_the_evaluator_stops_naming_it(
    honest, tmp_path, lie
):
    good, _, records, hashes = honest
    run = Run(tmp_path / "run", Path(good.cfg.trust.keys))
    frames = run.stream(records, lie_at=3) if lie == "altered scalar" else run.stream(records, short_at=3)
    with pytest.raises(EvaluatorError) as e:
        run.evaluate(frames)
    line = str(e.value)
    assert "\n" not in line and line.startswith("evaluator: refused step 3 from node 0 (the attach node)"), line
    why = "node 1's" if lie == "altered scalar" else "2 valid signed votes of the 4 voters (ballot 0 needs 3)"
    assert why in line and "(1 item refused)" in line, line
    assert steps_logged(tmp_path / "run") == records[:3], "nothing of the refused step is logged"
    assert state_hash(run.w.model, run.w.direction) == hashes[2], "the consensus it holds is the honest one"


def test_check_and_replay_prove_every_step_of_a_signed_log(honest, capsys):
    _, run_dir, records, hashes = honest
    reader = LogReader(run_dir / "log.bin")
    assert reader.read()[1] == records and sorted(reader.seals) == list(range(len(records)))
    assert cli.main(["check", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "ok": True,
        "steps": 6,
        "checkpoints": ["step_000006", "step_000003"],
        "signed": True,
    }
    assert cli.main(["replay", str(run_dir), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["param_hash"] == hashes[-1] and out.err == ""


def step_records(path: Path) -> dict[int, int]:
    """step -> byte offset of its step record (membership and seal records skipped)."""
    data = path.read_bytes()
    (n,) = struct.unpack_from("<I", data, len(LOG_MAGIC))
    off, out = len(LOG_MAGIC) + 4 + n + 4, {}
    while off < len(data):
        step, length = struct.unpack_from("<II", data, off)
        if step < 0x4000_0000:
            out[step] = off
        off += 8 + length
    return out


def rewrite_scalar(log: Path, step: int) -> None:
    """Double node 0's scalar of `step` in a log, its record's CRC made valid again."""
    data = bytearray(log.read_bytes())
    frame = step_records(log)[step] + 8
    head = message.read_head(bytes(data[frame:]))  # rewrite node 0's scalar of step 2 with a valid CRC
    body, crc_at = frame + head.layout.header_size, frame + head.layout.header_size - 4
    (scalar,) = struct.unpack_from("<f", data, body + head.layout.record_size - 4)
    struct.pack_into("<f", data, body + head.layout.record_size - 4, scalar * 2)
    end = body + head.count * head.layout.record_size
    struct.pack_into("<I", data, crc_at, zlib.crc32(bytes(data[frame + 2 : crc_at]) + bytes(data[body:end])))
    log.write_bytes(bytes(data))


def test_a_tampered_record_of_a_signed_log_is_named_by_check_and_replay(honest, tmp_path, capsys):
    run_dir = runs.copy_run_dir(honest[1], tmp_path / "run")
    rewrite_scalar(run_dir / "log.bin", 2)
    assert cli.main(["check", str(run_dir)]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "step 2 fails its signatures" in lines[0] and "node 0's" in lines[0], lines
    assert "(2 steps proven before it)" in lines[0]
    assert cli.main(["replay", str(run_dir)]) == 0
    warned = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(warned) == 1 and warned[0].startswith("seedflood: warning: ") and "step 2 fails" in warned[0]


def check_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """`seedflood ARGV` refused: exit status 2 and one line on stderr."""
    assert cli.main(argv) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("seedflood: error: "), lines
    return lines[0]


def test_check_with_the_roster_keys_wrote_passes_an_untouched_signed_log(honest, capsys):
    run_dir, roster = honest[1], honest[0].cfg.trust.keys  # the roster.json `seedflood keys` wrote
    assert cli.main(["check", str(run_dir), "--roster", roster, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "ok": True,
        "steps": 6,
        "checkpoints": ["step_000006", "step_000003"],
        "signed": True,
        "roster": roster,
    }
    assert cli.main(["check", str(run_dir), "--roster", str(Path(roster).parent)]) == 0  # or its directory
    assert (
        f"every step proven against {Path(roster).parent} (the log header records the same)" in capsys.readouterr().out
    )


@pytest.fixture(scope="module")
def forged(honest, tmp_path_factory):
    """The honest run's log rewritten by someone without the run's keys: node 1's scalar of step 3
    made 10x, its header's roster swapped for the attacker's own keys, and every message and vote
    of every step re-signed with them (CRCs, digests and certificates all valid)."""
    root = tmp_path_factory.mktemp("forged")
    attacker = identity.write_keys(root / "attacker", N)
    records = [
        (s, [replace(m, scalar=m.scalar * 10) if s == 3 and m.origin == 1 else m for m in msgs])
        for s, msgs in honest[2]
    ]
    run = Run(root / "run", attacker)
    run.evaluate(run.stream(records))
    assert steps_logged(root / "run") == records
    return root / "run"


def test_a_log_re_signed_with_an_attackers_keys_passes_check_alone_and_fails_with_the_roster(honest, forged, capsys):
    """Control: `check` alone proves the forged log against the roster in its own header, so it
    passes; with --roster (the roster.json `seedflood keys` wrote) it is refused, naming what differs."""
    assert cli.main(["check", str(forged)]) == 0
    assert "every step proven against the roster in the log header" in capsys.readouterr().out
    roster = honest[0].cfg.trust.keys
    line = check_error(capsys, ["check", str(forged), "--roster", roster])
    assert f"{forged / 'log.bin'}: the log header's roster is not {roster}: " in line, line
    assert "the public keys of nodes 0, 1, 2, 3 differ (its steps were signed with other keys)" in line, line


def test_check_names_a_roster_that_differs_in_one_key_or_in_size(honest, tmp_path, capsys):
    run_dir, keys = honest[1], json.loads(Path(honest[0].cfg.trust.keys).read_text())
    other = identity.load_roster(identity.write_keys(tmp_path / "other", N))
    one = tmp_path / "one.json"
    one.write_text(
        json.dumps(keys | {"public_keys": [*keys["public_keys"][:2], other.hex()[2], keys["public_keys"][3]]})
    )
    line = check_error(capsys, ["check", str(run_dir), "--roster", str(one)])
    assert f"the log header's roster is not {one}: node 2's public key differs" in line, line
    five = identity.write_keys(tmp_path / "five", N + 1)
    line = check_error(capsys, ["check", str(run_dir), "--roster", str(five)])
    assert f"the log header's roster holds 4 public keys, {five} 5" in line, line


def test_an_unsigned_header_differs_from_any_roster(honest):
    from seedflood.roles.identities import roster_differs

    roster = identity.load_roster(Path(honest[0].cfg.trust.keys))
    unsigned = {k: v for k, v in honest[0].header.items() if k != "trust"}
    assert roster_differs(unsigned, roster) == "the log is unsigned (its header records no roster)"
    assert roster_differs(honest[0].header, roster) is None  # control: its own roster is the same


@pytest.mark.parametrize(
    "text, words",
    [
        (None, "cannot read the roster"),
        ("{not json", "is not JSON"),
        ('{"scheme": "rsa", "nodes": 0, "public_keys": []}', "is not a roster `seedflood keys` wrote"),
        ('{"scheme": "ed25519", "nodes": 5, "public_keys": []}', "says 5 nodes but holds 0 public keys"),
        ('{"scheme": "ed25519", "nodes": 1, "public_keys": ["zz"]}', "a public key is not hex"),
    ],
    ids=["missing", "not-json", "not-a-roster", "wrong-count", "not-hex"],
)
def test_a_malformed_roster_file_is_one_line(honest, tmp_path, capsys, text, words):
    roster = tmp_path / "roster.json"
    if text is not None:
        roster.write_text(text)
    assert words in check_error(capsys, ["check", str(honest[1]), "--roster", str(roster)])


def test_a_malformed_roster_file_is_one_line_without_a_traceback_from_the_command(honest, tmp_path):
    roster = tmp_path / "roster.json"
    roster.write_text("{not json")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    p = subprocess.run(
        [sys.executable, "-m", "seedflood", "check", str(honest[1]), "--roster", str(roster)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**env, "HF_HUB_OFFLINE": "1"},
    )
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert (p.returncode, len(lines)) == (2, 1) and f"{roster} is not JSON" in lines[0], p.stderr[-2000:]


def test_a_certificate_costs_a_quorum_of_72_byte_votes_beside_the_signed_messages(honest):
    run, _, records, _ = honest
    signed = run.stream(records[:1])[0]
    unsigned = encode_step(records[0][1])
    _, _, raw = decode_signed_step(signed, 0, seed_of=run.p.seed)
    assert raw is not None
    cert = Certificate.from_bytes(raw)
    assert len(cert.voters) == 3 and len(raw) == 6 + len(cert.body) + 72 * 3
    assert len(signed) - len(unsigned) == 3 + 4 + 4 + 4 + 64 * N + len(raw)  # magic, lengths, count, signatures


@pytest.mark.parametrize("cut", ["inside the seal record", "inside the step record after it"])
def test_a_signed_log_torn_in_its_last_step_reads_as_the_steps_before(honest, tmp_path, cut):
    run_dir = runs.copy_run_dir(honest[1], tmp_path / "run")
    log = run_dir / "log.bin"
    data = log.read_bytes()
    last = step_records(log)[5]
    end = last - 40 if cut == "inside the seal record" else last + 12  # the seal record lies just before
    log.write_bytes(data[:end])
    reader = LogReader(log)
    assert reader.read()[1] == honest[2][:5] and sorted(reader.seals) == list(range(5))
    four = step_records(log)[4]
    assert reader.torn == end - (four + 8 + struct.unpack_from("<I", data, four + 4)[0]), (
        "the seal record is the tail's"
    )


def test_the_certificates_churn_clients_build_prove_their_steps(honest, tmp_path, monkeypatch):
    """In process, signed churn clients certify every step they commit (Voter.take), and the
    evaluator's check proves node 0's certificates step by step, as its stream would carry them."""
    from seedflood.core.churn import voter as voter_mod
    from seedflood.core.flood.stepstream import decode_seals, encode_seals

    good = honest[0]
    certs: dict[int, bytes] = {}
    take = voter_mod.Voter.take

    def certifying_take(self, s):
        got = take(self, s)
        if got is not None and self.agreement.node == 0:
            certs[s] = self.certificates[s]
        return got

    monkeypatch.setattr(voter_mod.Voter, "take", certifying_take)
    sets = ["churn.settle=1", "trust.sign=true", f"trust.keys={good.cfg.trust.keys}"]
    sim = simulate(config.load(DEBUG, [f"run.out_dir={tmp_path / 'sim'}", *sets]), hash_every_step=False)
    assert sorted(certs) == list(range(6))
    verifier = verifier_of(good.header, good.p, certified=True)
    assert verifier is not None
    roster = good.p.roster()
    for s, msgs in sim.records:
        signed, cert = decode_seals(encode_seals(msgs, certs[s]), msgs)
        assert verifier.check(s, signed, None, cert, roster) is None, s
    assert verifier.refused == 0


def test_a_resumed_evaluator_chains_the_certificates_on_the_steps_it_logged(honest, tmp_path):
    """Restarted after step 3 (its log and checkpoint), the evaluator takes the chain of digests
    from its own log and verifies the attach node's certificates of steps 3.. against it."""
    good, run_dir, records, hashes = honest
    out = runs.copy_run_dir(run_dir, tmp_path / "run")
    run = Run(out, Path(good.cfg.trust.keys))
    assert restore(run.w, run.p, out, records[:3]) == 3
    ev = run.evaluate(run.stream(records), start=3)
    assert ev.verifier is not None and ev.verifier.refused == 0
    assert state_hash(run.w.model, run.w.direction) == hashes[-1]
    assert steps_logged(out) == records and cli.main(["check", str(out)]) == 0


@pytest.mark.parametrize("tampered", [False, True], ids=["proven", "tampered"])
def test_steps_only_a_client_log_holds_are_taken_as_far_as_their_seals_prove_them(honest, tmp_path, tampered):
    """Rank 0 completes a signed run's log from a client's own log (complete_from_clients, with the
    evaluator's verifier): a client log keeps seal records like the run's, so every step it
    proves is taken, and an edited one ends what is taken, with one warning."""
    good, run_dir, records, _ = honest
    out = runs.copy_run_dir(run_dir, tmp_path / "run")
    client = out / "clients" / "node-1"
    client.mkdir(parents=True)
    shutil.copy(out / "config.yaml", client / "config.yaml")
    shutil.copy(out / "log.bin", client / "log.bin")
    if tampered:
        rewrite_scalar(client / "log.bin", 4)
    writer = LogWriter(out / "log.bin", good.header)
    writer.truncate_to(2)  # the evaluator's own log ends at step 1
    writer.close()
    run = Run(out, Path(good.cfg.trust.keys))
    verifier = verifier_of(run.header, run.p, certified=True)
    got = complete_from_clients(RunDir.of(run.cfg), run.p, run.header, records[:2], verifier)
    assert got == records[: 4 if tampered else 6] and steps_logged(out) == got
    assert verifier is not None and verifier.refused == (1 if tampered else 0)


def test_a_rejoined_client_holds_its_sponsors_certificates_of_the_steps_it_replayed(tmp_path, monkeypatch):
    """Signed churn on the torus: node 5 is killed before step 3 and restarts at step 7. Its
    sponsor's catch-up carries each decided step's seals, so the rejoined client holds a
    certificate of every step it replayed, and each proves its step: it can stream them to the
    evaluator should it become the attach node."""
    from test_churn import PACED, cfg_for

    from seedflood.core.churn.certificate import StepVerifier
    from seedflood.core.flood.stepstream import decode_seals, encode_seals
    from seedflood.ml import sampling
    from seedflood.roles import churn as churn_mod
    from seedflood.roles.inprocess import Event

    keys = identity.write_keys(tmp_path / "keys", 8)
    held: dict[int, tuple[int, dict[int, bytes]]] = {}
    rejoin = churn_mod.Churn.rejoin

    def keeping(self, blob, *prefix):  # prefix: the steps a log server gave (none here)
        rejoin(self, blob, *prefix)
        held[self.host.node] = (len(self.history), dict(self.certificates))

    monkeypatch.setattr(churn_mod.Churn, "rejoin", keeping)
    cfg = cfg_for("trust.sign=true", f"trust.keys={keys}", PACED, steps=16)
    r = simulate(cfg, events=[Event(3, 5, "kill"), Event(7, 5, "restart")])
    assert r.exits == {} and [c.join for c in r.changes.values() if c.join] == [((5, 1),)], (r.exits, r.changes)
    replayed, certs = held[5]
    assert replayed >= 3 and sorted(certs) == list(range(replayed))
    p = Protocol.of(cfg, build(cfg.topology).diameter)
    digest = sampling.train_digest(sampling.load_splits(cfg.task, cfg.run.seed))
    roster = identity.load_roster(keys)
    tag = run_tag(proto.trajectory(cfg, p, digest), roster.hex())
    verifier = StepVerifier(Signing(-1, tag, lambda _: b"", roster.verify), True, p.ids)
    members = p.roster()
    for s, msgs in r.records[:replayed]:
        signed, cert = decode_seals(encode_seals(msgs, certs[s]), msgs)
        assert verifier.check(s, signed, r.changes.get(s), cert, members) is None, s
        if s in r.changes:
            members.apply(r.changes[s])


def test_an_unsigned_log_is_byte_for_byte_what_it_was_before_seal_records(tmp_path):
    """Three steps (a roster change at step 2) appended without seals, as every unsigned run's
    evaluator and client do: the sha256 of the file the code before seal records wrote (99ac91c)."""
    from seedflood.core.config import rng
    from seedflood.core.membership.roster import Change
    from seedflood.core.wire.message import Message

    writer = LogWriter(tmp_path / "log.bin", {"trajectory": {"run.seed": 7, "topology.nodes": 4}})
    for s in range(3):
        members = range(3) if s == 2 else range(4)
        msgs = [Message.make(o, s, rng.derive(7, o, s, 0), 0.125 * (o + 1) - s) for o in members]
        writer.append(s, msgs, Change(2, leave=(3,)) if s == 2 else None)
    writer.close()
    digest = hashlib.sha256((tmp_path / "log.bin").read_bytes()).hexdigest()
    assert digest == "e4b53a246d0e1990bacbf049f0cd899f21f1b05f5b4ecb32fdfea2702117fed5"
    reader = LogReader(tmp_path / "log.bin")
    assert len(reader.read()[1]) == 3 and reader.seals == {}
