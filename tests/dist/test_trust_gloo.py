"""Peers that do not follow the protocol in a launched churn run (docs/trust.md): 1 evaluator + 4
clients as processes over gloo, `churn.settle: 1`, node 2's process patched from outside the
product (tests/adversary.py). Each adversary is left out by a committed step within its stated
bound and the others finish on one history that the log replays to; in a signed run only a
process with the node's key rejoins as that node. Split from test_churn_gloo.py (whose run
helpers it uses) so that the two files' launched runs reach two test workers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_churn_gloo import ADVERSARY, STEPS, VICTIM, WORLD, check_run, churn_sets, finish

import runs
from procs import World
from seedflood.comm import identity
from seedflood.rundir.logfile import LogReader

# Every wait below is bounded by the run's progress (procs.Procs.wait_for); this is the outer bound.
pytestmark = [pytest.mark.dist, pytest.mark.timeout(1800)]


# (kind, arg, settings, what a neighbour says, the last step its leave may commit at: the bound
# docs/trust.md states, the first step it misbehaves on; an audited liar lies from step 0)
ADVERSARIES = [
    ("scale", "10", ("trust.audit=1",), "recompute", 0),
    ("random", "1", ("trust.audit=1",), "recompute", 0),
    ("eps", "0.01", ("trust.audit=1",), "recompute", 0),
    ("garbage", "5", (), "bad frame", 5),
    ("bogus-ids", "5", (), "bad frame", 5),
    ("oversize", "5", (), "bad frame", 5),
    ("equivocate", "3", (), "two different", 3),
    ("forge", "3", ("trust.sign=true",), None, 3),
    ("replay", "3", (), None, 3),
    ("impersonate", "FLAG", ("trust.sign=true",), None, 0),
]


@pytest.mark.parametrize(
    "kind, arg, sets, said, bound",
    ADVERSARIES,
    ids=[
        "liar",
        "random-liar",
        "eps-liar",
        "garbage",
        "bogus-ids",
        "oversize",
        "equivocate",
        "forge",
        "replay",
        "impersonate",
    ],
)
def test_a_launched_adversary_is_left_out_and_the_others_finish_on_one_history(
    run_world, tmp_path, capsys, kind, arg, sets, said, bound
):
    """Node 2's process does not follow the protocol (tests/adversary.py; docs/trust.md): it
    sends 10 × its honest scalars, a random scalar in ±1 or its estimate with zo.eps 0.01 in an
    audited run (its neighbours recompute them and flood the evidence), 64 random bytes, 64 messages
    a million steps ahead or 1 MiB of random bytes in place of its frames from step 5 (each
    neighbour closes its edge), its own messages with another
    scalar to one neighbour from step 3 (the two copies flood as evidence), its own messages with
    forged signatures in a signed run (dropped and counted), the last frame it sent each neighbour
    before step 3 in place of every later one (seen, dropped; its own items never come), or it
    signs everything with a key that is not node 2's (a process without the node's key).
    Each time a committed step no later than `bound` leaves it out, and the three others and
    the evaluator end on one hash that the log replays to; signed, the evaluator verified every
    step's signatures and certificate and `seedflood check` proves the log's."""
    out = tmp_path / "run"
    extra = list(sets)
    if "trust.sign=true" in sets:
        identity.write_keys(tmp_path / "keys", 4)
        extra.append(f"trust.keys={tmp_path / 'keys'}")
    if arg == "FLAG":  # impersonate from the start: the flag exists before node 2 starts
        arg = str(tmp_path / "impostor")
        Path(arg).touch()
    argv = [sys.executable, str(ADVERSARY), str(VICTIM), kind, arg]
    procs = run_world([*argv, *runs.train(*runs.churn(out, 20, *extra))[3:]], nprocs=WORLD, watch=[out / "log.bin"])
    s = json.loads((out / "summary.json").read_text())
    for i, p in enumerate(procs):
        if i != VICTIM + 1:
            assert p.returncode == 0, p.describe()
    assert procs[VICTIM + 1].returncode != 0, procs[VICTIM + 1].describe()  # cut off or left out, it stops
    assert s["left"] == [VICTIM], s.get("membership_changes")
    survivors = [h for n, h in enumerate(s["client_hashes"]) if n != VICTIM]
    assert survivors == [s["param_hash"]] * 3 and s["consensus"]
    neighbours = procs[VICTIM].stderr + procs[VICTIM + 2].stderr  # nodes 1 and 3 of the ring
    if said is not None:
        assert said in neighbours, neighbours[-3000:]
    if kind in ("forge", "impersonate"):
        assert sum(f["forged"] for n, f in enumerate(s["flood"]) if n != VICTIM and f) > 0, s["flood"]
    reader = LogReader(out / "log.bin")
    _, records = reader.read()
    ((step, change),) = reader.changes.items()
    assert change.leave == (VICTIM,), reader.changes
    evidence = kind in ("scale", "random", "eps", "equivocate")
    assert change.audit == ((VICTIM,) if evidence else ()), reader.changes  # on evidence, else as silent
    assert step <= bound, (step, bound)
    assert all(VICTIM not in {m.origin for m in msgs} for _, msgs in records[step:])
    assert runs.replay(out) == {"steps": 20, "param_hash": s["param_hash"]}
    if "trust.sign=true" in sets:  # the evaluator verified each step's certificate; the log proves them all
        from seedflood import cli

        assert sorted(reader.seals) == list(range(20)), sorted(reader.seals)
        assert cli.main(["check", str(out), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["signed"] is True


@pytest.mark.parametrize("impostor", [False, True], ids=["genuine", "impostor"])
def test_only_a_process_with_the_nodes_key_rejoins_a_signed_run(tmp_path, impostor):
    """A signed run: node 2 is SIGKILLed after 5 steps and started again (same RANK: a new
    incarnation in the run's store), through tests/adversary.py impersonate. The genuine process
    answers the challenge of the neighbour that claims it (roles/rejoinproof.py) with node 2's key
    and rejoins by replay: all four and the evaluator end on one hash, the log records the leave
    and the join. A process without node 2's key (the flag set before the restart) is refused in
    one line and no JOIN floods; it stops, and the three others and the evaluator finish on one
    hash, the log with node 2's leave and no join. Either log replays to the final hash."""
    out = tmp_path / "run"
    keys, flag = tmp_path / "keys", tmp_path / "impostor"
    identity.write_keys(keys, 4)
    sets = churn_sets(out, "trust.sign=true", f"trust.keys={keys}")
    argv = [sys.executable, str(ADVERSARY), str(VICTIM), "impersonate", str(flag), *runs.train(*sets)[3:]]
    group = World(tmp_path / "procs", argv, WORLD, merge=True)
    group.watch(out / "log.bin")
    with group.start_all() as run:
        runs.wait_for_steps(run, out, 5)
        if impostor:
            flag.touch()  # the next process of node 2 holds another key
        run.restart(str(VICTIM + 1))
        said = finish(run)
    reader = LogReader(out / "log.bin")
    _, records = reader.read()
    changes = sorted(reader.changes.items())
    if not impostor:
        assert run.codes() == [0] * WORLD, said
        assert "refused" not in said and "rejoined by replaying" in said, said[-3000:]
        s = check_run(out, STEPS, said)
        (leave, join) = changes
        assert leave[1].leave == (VICTIM,) and join[1].join == ((VICTIM, 2),), changes
        assert sum(f["forged"] for f in s["flood"]) == 0
        return
    codes = run.codes()
    assert codes[: VICTIM + 1] + codes[VICTIM + 2 :] == [0] * (WORLD - 1) and codes[VICTIM + 1] != 0, said
    assert f"refused node {VICTIM}'s rejoin" in said and f"not signed with node {VICTIM}'s key" in said, said[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["left"] == [VICTIM] and s["consensus"], s.get("membership_changes")
    assert [h for n, h in enumerate(s["client_hashes"]) if n != VICTIM] == [s["param_hash"]] * 3
    ((_, change),) = changes  # the leave; no join
    assert change.leave == (VICTIM,) and change.join == (), changes
    assert runs.replay(out) == {"steps": STEPS, "param_hash": s["param_hash"]}
