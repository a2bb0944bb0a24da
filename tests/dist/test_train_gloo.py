"""The real thing: 1 evaluator + 4 clients as processes over gloo, checked against references.

- after every step every client's hash is identical (run.hash_steps);
- the final hash equals the in-memory driver's, and `seedflood replay` of the evaluator's log;
- ring, grid and complete topologies end with the same hash (topology invariance);
- a crashed run resumes from its log and ends with the uninterrupted run's bits, also with
  delayed flooding;
- the end of a run never waits on a lagging evaluator; a killed peer is one line per survivor;
- a resume whose settings differ, or made on another build (build.json), is refused before anything is written;
- signed (trust.sign) and audited (trust.audit) processes end on the plain run's bits.
- `seedflood status` (and `watch --once`) over the finished ring run shows every process finished
  at the last step on the log's commit chain, its bytes per link adding up to its totals, and over the killed-peer run the survivors failed with their one line.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
import torch

import procs as harness
import runs
from oracle import oracle_hash
from procs import Procs
from seedflood.core.config import runconfig as config
from seedflood.roles.inprocess import simulate

pytestmark = [pytest.mark.dist, pytest.mark.timeout(1800)]  # the waits are bounded by progress
DEBUG = str(runs.DEBUG)
STEP_RECORD = 8 + 16 + 4 * 24  # bytes of one step record of 4 messages in log.bin


def overrides(out_dir: Path, *extra: str) -> list[str]:
    return [f"run.out_dir={out_dir}", "run.steps=6", "run.hash_steps=true", *extra]


def train(run_world, procs_ok, out_dir: Path, *extra: str) -> dict:
    procs = run_world(runs.train(*overrides(out_dir, *extra)), nprocs=5, watch=[out_dir / "log.bin"])
    procs_ok(procs)
    return json.loads((out_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def reference_hash() -> str:
    torch.set_num_threads(1)
    cfg = config.load(DEBUG, ["run.steps=6", "run.out_dir=/nonexistent"])
    hashes = set(simulate(cfg, hash_every_step=False).hashes.values())
    assert len(hashes) == 1
    return hashes.pop()


@pytest.mark.parametrize("kind", ["ring", "grid", "complete"])
def test_processes_match_the_in_memory_reference(run_world, procs_ok, tmp_path, reference_hash, kind):
    s = train(run_world, procs_ok, tmp_path / kind, f"topology.kind={kind}")
    assert s["consensus"] and s["clients"] == 4
    assert s["client_hashes"] == [reference_hash] * 4
    assert s["param_hash"] == reference_hash
    for step_hashes in zip(*s["client_step_hashes"]):
        assert len(set(step_hashes)) == 1
    assert s["bytes_per_edge_per_step"] > 0
    # the independent oracle: a plain loop over the evaluator's log, no Client/Flood/Applier/transport
    assert oracle_hash(tmp_path / kind / "config.yaml", tmp_path / kind / "log.bin") == (6, reference_hash)

    if kind == "ring":
        replay = harness.run([sys.executable, "-m", "seedflood", "replay", str(tmp_path / kind), "--json"])
        assert replay.returncode == 0, replay.stderr
        assert json.loads(replay.stdout.strip().splitlines()[-1]) == {"steps": 6, "param_hash": reference_hash}
        # ...and at an intermediate step it equals the checkpoint the evaluator wrote then.
        meta = json.loads((tmp_path / kind / "checkpoints" / "step_000006" / "meta.json").read_text())
        assert meta["param_hash"] == reference_hash
        # `seedflood eval` rebuilds the same model and scores it as the evaluator did at the end.
        scored = harness.run([sys.executable, "-m", "seedflood", "eval", str(tmp_path / kind), "--json"])
        assert scored.returncode == 0, scored.stderr
        got = json.loads(scored.stdout.strip().splitlines()[-1])
        assert got["steps"] == 6 and got["accuracy"] == s["final"]["accuracy"] and got["auc"] == s["final"]["auc"]
        check_watch(tmp_path / kind, reference_hash)


def check_watch(out: Path, reference_hash: str) -> None:
    """`seedflood status` over the finished run's status records: every client and the evaluator
    finished at the last step with the reference state, one chain digest (the one the log's steps
    hash to), traffic on every edge adding up to the totals, and a roster without changes."""
    from seedflood.roles.livestatus import Chain
    from seedflood.rundir.logfile import LogReader

    watched = harness.run([sys.executable, "-m", "seedflood", "status", str(out), "--json"])
    assert watched.returncode == 0, watched.stderr
    view = json.loads(watched.stdout)
    rows = {r["name"]: r for r in view["rows"]}
    assert sorted(rows) == ["evaluator", "node-0", "node-1", "node-2", "node-3"] and view["problems"] == []
    assert view["membership"]["members"] == [0, 1, 2, 3] and view["membership"]["changes"] == []
    for r in rows.values():
        assert (r["state"], r["step"], r["committed"], r["state_hash"]) == ("finished", 6, 5, reference_hash), r
    chain = Chain()
    for step, msgs in LogReader(out / "log.bin").read()[1]:
        chain.extend(step, msgs)
    assert view["agree"] is True and (view["step"], view["digest"]) == (5, chain.recent()[5])
    assert {r["digest"] for r in rows.values()} == {view["digest"]}
    for r in (rows[f"node-{n}"] for n in range(4)):
        assert r["peers"] == r["neighbours"] and len(r["peers"]) == 2  # a ring: both edges up
        assert r["sent"] > 0 and r["received"] > 0 and r["steps_per_s"] > 0
        # the bytes per link add up to the totals: each neighbour's and the evaluator's stream
        assert [link["peer"] for link in r["links"]] == r["neighbours"] and all(x["up"] for x in r["links"])
        assert sum(x["sent"] for x in r["links"]) + r["sent_to_evaluator"] == r["sent"]
        assert sum(x["received"] for x in r["links"]) == r["received"] and all(x["received"] for x in r["links"])
    once = harness.run([sys.executable, "-m", "seedflood", "watch", str(out), "--once"])
    assert once.returncode == 0, once.stderr
    assert f"all agree (step 5, digest {view['digest']})" in once.stdout.splitlines()[0]


def test_signed_processes_have_the_unsigned_bits_and_count_no_forgery(run_world, procs_ok, tmp_path, reference_hash):
    """trust.sign over gloo (docs/trust.md, Identities): each process loads its own key, signs
    what it originates and verifies what it receives; the run's bits are the unsigned run's; the
    evaluator verified each streamed step's signatures and its log proves them."""
    from seedflood.comm import identity

    identity.write_keys(tmp_path / "keys", 4)
    s = train(run_world, procs_ok, tmp_path / "run", "trust.sign=true", f"trust.keys={tmp_path / 'keys'}")
    assert s["consensus"] and s["client_hashes"] == [reference_hash] * 4 and s["param_hash"] == reference_hash
    assert all(f["forged"] == 0 and f["received"] > 0 for f in s["flood"]), s["flood"]
    from seedflood.rundir.logheader import read_header

    roster = identity.load_roster(tmp_path / "keys")
    assert read_header(tmp_path / "run" / "log.bin")["trust"]["public_keys"] == roster.hex()
    # the evaluator verified each step's signatures before it logged it; the log keeps them
    from seedflood.roles.sealcheck import unproven
    from seedflood.rundir import resume
    from seedflood.rundir.layout import RunDir
    from seedflood.rundir.logfile import LogReader

    reader = LogReader(tmp_path / "run" / "log.bin")
    reader.read()
    assert sorted(reader.seals) == list(range(6))
    protocol = resume.recorded(RunDir.at(str(tmp_path / "run")))[1]
    assert unproven(tmp_path / "run" / "log.bin", protocol, certified=False) is None


def test_audited_processes_have_the_unaudited_bits(run_world, procs_ok, tmp_path, reference_hash):
    """trust.audit over gloo (docs/trust.md, Verification by recomputation): each process
    recomputes its 3 peers' scalars of every step on its own bits and batch, and they all
    recompute exactly (nobody lies), so the run's bits are the unaudited run's."""
    s = train(run_world, procs_ok, tmp_path / "run", "trust.audit=1")
    assert s["consensus"] and s["client_hashes"] == [reference_hash] * 4 and s["param_hash"] == reference_hash
    for f in s["flood"]:
        assert f["audit"]["recomputed"] == 3 * 6 and f["audit"]["found"] == {} and f["audit"]["false"] == {}, f


@pytest.fixture(scope="module")
def resumed(run_world, procs_ok, tmp_path_factory) -> dict:
    """One launched 3-step run, then in its directory a resume with a changed setting (refused),
    then the resume to 6 steps: what the two tests below assert on (one 3-step launch for both)."""
    out = tmp_path_factory.mktemp("resumed") / "run"
    first = train(run_world, procs_ok, out, "run.steps=3")
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    refused = run_world(runs.train(*overrides(out, "zo.eps=0.05")), nprocs=5)
    # the same settings on another build: 2 torch threads, not the 1 the run was made with
    other_build = run_world(runs.train(*overrides(out, "run.threads=2")), nprocs=5)
    after = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    second = train(run_world, procs_ok, out)  # same directory and build: resumes at step 3
    return {
        "first": first,
        "refused": refused,
        "other_build": other_build,
        "before": before,
        "after": after,
        "second": second,
    }


def test_resume_from_the_log_reproduces_the_uninterrupted_run(resumed, reference_hash):
    assert resumed["first"]["param_hash"] != reference_hash
    second = resumed["second"]
    assert second["resumed_from_step"] == 3
    assert second["param_hash"] == reference_hash and second["consensus"]


def test_resume_with_delayed_flooding_reproduces_the_uninterrupted_run(run_world, procs_ok, tmp_path):
    """Ring of 4 with 1 hop per step: delay 1. 3 steps, then resumed to 6 from the 3-step log,
    equals 6 straight steps (the resumed clients hold step 2 pending, as the uninterrupted ones did)."""
    torch.set_num_threads(1)
    delayed = ("flood.hops_per_step=1",)
    cfg = config.load(DEBUG, ["run.steps=6", "run.out_dir=/nonexistent", *delayed])
    want = set(simulate(cfg, hash_every_step=False).hashes.values())
    out = tmp_path / "resumed"
    first = train(run_world, procs_ok, out, "run.steps=3", *delayed)
    assert first["delay"] == 1
    second = train(run_world, procs_ok, out, *delayed)
    assert second["resumed_from_step"] == 3
    assert {second["param_hash"]} == want and second["consensus"]
    assert oracle_hash(out / "config.yaml", out / "log.bin") == (6, second["param_hash"])


def test_the_end_of_a_run_does_not_wait_for_a_lagging_evaluator(run_world, procs_ok, tmp_path):
    """2 clients, a 3 s group timeout and an evaluator that scores 2800 test examples after
    every step (steps 0-6; the clients take about a second for their 6 steps): it finishes long
    after the clients (its scoring CPU, ~3x the timeout on a quiet core), and every process
    still exits 0 with a summary."""
    out = tmp_path / "lag"
    sets = overrides(out, "topology.nodes=2", "transport.timeout_s=3", "eval.every=1", "task.test_examples=2800")
    procs = run_world(runs.train(*sets), nprocs=3, watch=[out / "log.bin"])
    procs_ok(procs)
    lag = procs[0].seconds - max(p.seconds for p in procs[1:])
    assert lag > 3, f"the evaluator must lag by more than the timeout for this test to mean anything ({lag:.1f} s)"
    assert json.loads((out / "summary.json").read_text())["consensus"]


def _signal_node_2_mid_run(run_world, out: Path, sig: signal.Signals) -> list:
    """A strict ring of 4 (+ evaluator, 400 steps): `sig` to client node 2 (rank 3) once the log
    holds 2 steps. It dies of the signal; its neighbours (nodes 1 and 3) exit 1 naming it in one
    line. Returns the processes in rank order."""
    sets = overrides(out, "run.steps=400", "eval.every=0", "checkpoint.every=0")
    logged = runs.Steps(out, STEP_RECORD)  # steps in the log since its header (written at start)
    sent: list[float] = []

    def signal_when_logged(group: Procs) -> None:
        # Once: its return code shows only after the harness reaps it, and a second kill of a
        # process already gone would raise ProcessLookupError.
        if not sent and logged() >= 2:
            sent.append(group.signal("3", sig))

    procs = run_world(runs.train(*sets), nprocs=5, on_poll=signal_when_logged, watch=[out / "log.bin"])
    assert sent, "the signal must land mid-run"
    assert procs[3].returncode == -sig, procs[3].describe()
    for p in (procs[2], procs[4]):
        assert p.returncode == 1, p.describe()
        lines = [ln for ln in p.stderr.splitlines() if ln.startswith("seedflood: error:")]
        assert len(lines) == 1 and "peer node 2 (rank 3)" in lines[0], p.stderr[-2000:]
    return procs


def test_sigterm_ends_a_strict_client_as_before(run_world, tmp_path):
    """A strict client keeps Python's default SIGTERM (the graceful leave is churn's): it dies of
    it, and its neighbours name it in one line as for a kill."""
    procs = _signal_node_2_mid_run(run_world, tmp_path / "term", signal.SIGTERM)
    assert "left at step" not in procs[3].stderr


def test_a_killed_peer_is_reported_in_one_line_by_each_survivor(run_world, tmp_path):
    """SIGKILL client node 2 once the log holds 2 steps: its neighbours name it in one line."""
    out = tmp_path / "killed"
    procs = _signal_node_2_mid_run(run_world, out, signal.SIGKILL)
    for p in (procs[2], procs[4]):
        assert "Traceback" not in p.stderr, p.stderr[-2000:]
    # their status records end `failed` with that line; the killed one never wrote a final record
    watched = harness.run([sys.executable, "-m", "seedflood", "watch", str(out), "--json"])
    assert watched.returncode == 0, watched.stderr
    rows = {r["name"]: r for r in json.loads(watched.stdout)["rows"]}
    for node, p in ((1, procs[2]), (3, procs[4])):
        line = next(ln for ln in p.stderr.splitlines() if ln.startswith("seedflood: error:"))
        assert (rows[f"node-{node}"]["state"], rows[f"node-{node}"]["reason"]) == ("failed", line[18:])
    assert rows["node-2"]["state"] in ("running", "stale") and rows["node-2"]["reason"] is None


def test_a_stopped_peer_is_reported_in_one_line_after_the_timeout(run_world, tmp_path):
    """SIGSTOP client node 2 once the log holds 2 steps: with a 5 s group timeout its neighbours
    name it in one line each (exit 1) instead of hanging; the stopped process is then killed."""
    out = tmp_path / "stopped"
    sets = overrides(out, "run.steps=400", "eval.every=0", "checkpoint.every=0", "transport.timeout_s=5")
    logged = runs.Steps(out, STEP_RECORD)
    stopped: list[bool] = []

    def stop_when_logged(group: Procs) -> None:
        if stopped:
            survivors_done = all(group[str(r)].returncode is not None for r in range(5) if r != 3)
            if survivors_done and group["3"].returncode is None:
                group.signal("3", signal.SIGKILL)  # the survivors are done: end the stopped one
        elif logged() >= 2:
            group.signal("3", signal.SIGSTOP)
            stopped.append(True)

    procs = run_world(runs.train(*sets), nprocs=5, on_poll=stop_when_logged, watch=[out / "log.bin"])
    assert stopped, "the stop must land"
    for p in (procs[2], procs[4]):  # nodes 1 and 3, the ring neighbours of node 2 (rank 3)
        assert p.returncode == 1, p.describe()
        lines = [ln for ln in p.stderr.splitlines() if ln.startswith("seedflood: error:")]
        assert len(lines) == 1 and "peer node 2 (rank 3)" in lines[0], p.stderr[-2000:]
        assert "Traceback" not in p.stderr, p.stderr[-2000:]


def test_a_resume_with_changed_settings_is_refused_and_changes_nothing(resumed):
    for p in resumed["refused"]:
        assert p.returncode == 2, p.describe()
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("seedflood: error:")]
        assert len(errors) == 1 and "zo.eps (0.001 -> 0.05)" in errors[0], p.stderr[-2000:]
    assert resumed["after"] == resumed["before"]


def test_a_resume_on_another_build_is_refused_in_one_line_naming_both(resumed):
    """rundir/build.py: the run's build.json says 1 thread; every process of a resume at 2 threads
    exits 2 with rank 0's line naming both builds, and nothing on disk changes. Its control is the
    resume with the run's own build (test_resume_from_the_log_reproduces_the_uninterrupted_run)."""
    for p in resumed["other_build"]:
        assert p.returncode == 2, p.describe()
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("seedflood: error:")]
        assert len(errors) == 1 and "was made by another build" in errors[0], p.stderr[-2000:]
        assert "1 thread, cpu float32; this process:" in errors[0] and "threads (1 -> 2)" in errors[0], errors[0]
        assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert resumed["after"] == resumed["before"]


def test_wrong_world_size_fails_before_training(run_world, tmp_path):
    procs = run_world(runs.train(f"run.out_dir={tmp_path}"), nprocs=3)
    for p in procs:
        assert p.returncode == 2, p.describe()
        lines = [line for line in p.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("seedflood: error: world size 3 does not match"), p.stderr
    assert not (tmp_path / "log.bin").exists()
