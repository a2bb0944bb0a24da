"""A brand-new node id joins a running launched run (docs/churn-design.md, A new id joins): 1
evaluator + 4 clients on a ring as processes, one gloo group per edge, `churn.settle: 1`,
`churn.max_nodes: 6`, signed (`trust.sign`, keys for ids 0..5: the new ids' too), paced steps.

A few steps in, one more process starts with SEEDFLOOD_NODE=4 and SEEDFLOOD_STORE at the run's
store, as launch/README.md says to start one: no rank slot, the run's world size unchanged. It
knocks through the store; a member the join rule links it to (founders 0 and 1: the fewest
links, lowest id first) claims it, challenges it (it answers with node 4's key), hands it the log
and floods its JOIN note; it replays, connects its edges at the note's hop and counts from the
step the note names. All five clients finish on the evaluator's hash, the one `seedflood replay`
of the log gives; the log records the join, and node 4's messages are in every step from its
join step and in none before. Beside it, a process started as id 6 (the run is open to 4 and 5)
and one as id 5 without node 5's key are each refused in one line (exit 2) and the run does not
notice. The newcomer takes the log's prefix from `seedflood serve-log` on the run directory
(`churn.log_server`), so its sponsor sends only the steps after it. One run shared by every assertion (CPU is scarce). The signed run covers the unsigned
path too: the challenge is the only step a signed join adds (roles/rejoinproof.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import procs
import runs
from procs import World, free_port
from seedflood.comm import identity
from seedflood.rundir.layout import CheckpointError
from seedflood.rundir.logfile import LogReader

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]
CLIENTS = 4
WORLD = CLIENTS + 1
STEPS = 30
NEW = 4  # the brand-new id; the join rule links it to founders 0 and 1
EDGES = (0, 1)
BEYOND = 6  # churn.max_nodes = 6 opens ids 4 and 5 only
KEYLESS = 5  # an id the run is open to, started without its key
PREFIX = 4  # steps logged before the newcomer starts: at least what the log server hands it
LOG_SERVER = "serve-log"  # `seedflood serve-log` on the run directory: the newcomer's prefix


def text(group: World) -> str:
    return "".join(p.stdout for p in group)


def logged(out: Path) -> int:
    """Whole steps in the evaluator's log.bin (0 before its header is there)."""
    try:
        return len(LogReader(out / "log.bin").read()[1])
    except (OSError, CheckpointError):
        return 0


def joins_logged(out: Path) -> bool:
    """The evaluator's log.bin holds a committed join."""
    try:
        reader = LogReader(out / "log.bin")
        reader.read()
    except (OSError, CheckpointError):
        return False
    return any(c.join for c in reader.changes.values())


@pytest.fixture(scope="module")
def joined(tmp_path_factory: pytest.TempPathFactory) -> tuple[World, Path, str]:
    """The run: the founders and the evaluator; once the log holds a few steps, node 4 starts
    (and the refused ids 6 and 5 beside it); every process is waited for. Returns the world, the
    run directory and everything the processes printed."""
    tmp = tmp_path_factory.mktemp("join")
    out, keys = tmp / "run", tmp / "keys"
    identity.write_keys(keys, 6)  # `seedflood keys --nodes max_nodes`
    (keys / f"node-{KEYLESS}.key").unlink()  # its process has no key of its own
    sets = runs.churn(
        out,
        STEPS,
        "topology.kind=ring",
        f"topology.nodes={CLIENTS}",
        "churn.max_nodes=6",
        "run.step_delay_s=0.3",  # paced: the newcomer's start-up spans fewer steps (no CPU spent)
        "run.hash_steps=true",
        "trust.sign=true",
        f"trust.keys={keys}",
    )
    group = World(tmp / "procs", runs.train(*sets), WORLD, merge=True)
    group.watch(out / "log.bin")
    with group.start_all() as run:
        # a log server on the evaluator's run directory, given to the newcomer only
        served = free_port()
        serve = [sys.executable, "-m", "seedflood", "serve-log", str(out), "--host", "127.0.0.1", "--port", str(served)]
        run.start(LOG_SERVER, serve, env=run.base, merge=True)
        # whole steps in log.bin, not its bytes: a signed run's records carry seals
        run.wait_for(lambda: logged(out) >= PREFIX, f"{PREFIX} steps logged", alive=run.procs)
        store = {"SEEDFLOOD_STORE": f"127.0.0.1:{run.port}"}  # the run's store: rank 0 hosts it here
        for n in (NEW, BEYOND, KEYLESS):
            argv = [*run.argv, "--set", f"churn.log_server=127.0.0.1:{served}"] if n == NEW else run.argv
            run.start(f"node{n}", argv, env={**run.base, **store, "SEEDFLOOD_NODE": str(n)}, merge=True)
        # `seedflood status` while the run goes on, once the log holds node 4's join
        run.wait_for(lambda: joins_logged(out), "node 4's join in log.bin", alive=[str(r) for r in range(WORLD)])
        status = [sys.executable, "-m", "seedflood", "status", str(out), "--json", "--store", store["SEEDFLOOD_STORE"]]
        live = procs.run(status, env=run.base)
        run.wait([p.name for p in run if p.name != LOG_SERVER])
        run.kill(LOG_SERVER)
        said = text(run)
    (out / "status-live.json").write_text(live.stdout + live.stderr)
    assert live.returncode == 0, live.stdout + live.stderr
    return run, out, said


def test_a_new_id_joins_a_launched_ring_and_all_five_finish_on_the_replayed_hash(joined):
    run, out, said = joined
    assert run.codes([str(r) for r in range(WORLD)] + [f"node{NEW}"]) == [0] * (WORLD + 1), said[-8000:]
    assert "Traceback" not in said, said[-8000:]
    assert f"node {NEW}: a new node id: knocked at the run's store" in said, said[-8000:]
    sponsor = re.search(rf"node (\d+): sponsoring node {NEW} \(incarnation 1\): joins at step (\d+)", said)
    assert sponsor is not None and int(sponsor[1]) in EDGES, said[-8000:]
    assert re.search(rf"node {NEW}: joined by replaying \d+ steps from node {sponsor[1]}", said), said[-8000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["consensus"] and s["left"] == [], s
    assert s["client_hashes"] == [s["param_hash"]] * (CLIENTS + 1), s["client_hashes"]
    assert runs.replay(out) == {"steps": STEPS, "param_hash": s["param_hash"]}
    assert sum(f["forged"] for f in s["flood"] if f) == 0  # node 4's signatures taken everywhere
    founders = [s["client_step_hashes"][n] for n in range(CLIENTS)]
    assert all(hs == founders[0] for hs in founders) and len(founders[0]) == STEPS
    # the newcomer hashed the steps it applied itself, after its catch-up: the founders' bits
    mine = s["client_step_hashes"][NEW]
    assert mine[-1] == founders[0][-1] and [h for h in mine if h is not None] == founders[0][-len(mine) :]


def test_the_newcomer_takes_a_prefix_from_the_log_server_and_its_sponsor_sends_only_the_rest(joined):
    """`churn.log_server` in a signed launched run: node 4 fetches and checks steps 0..p from
    `seedflood serve-log` (which served the run's log.bin as the evaluator wrote it) before it
    knocks; its sponsor, whose chain has the prefix's digest at p, sends the steps from p + 1
    only, and the newcomer ends on everyone's hash (the test above)."""
    run, out, said = joined
    got = re.search(rf"node {NEW}: fetched steps 0\.\.(\d+) from the log server", said)
    assert got is not None, said[-8000:]
    p = int(got[1])
    assert p >= PREFIX - 1, said[-8000:]  # the server served what the evaluator had logged by then
    assert re.search(rf"sponsoring node {NEW} \(incarnation 1\): .*steps from {p + 1}: it holds 0\.\.{p}\)", said), (
        said[-8000:]
    )
    assert re.search(
        rf"node {NEW}: joined by replaying \d+ steps from node \d \(steps 0\.\.{p} from the log server\)", said
    )
    assert "Traceback" not in run[LOG_SERVER].stdout, run[LOG_SERVER].describe()


def test_seedflood_status_shows_the_running_run_with_the_newcomer_joined(joined):
    """`seedflood status --json --store` taken while the run went on, once its log held the join:
    the processes running, the log's roster with node 4 joined at its JOIN step, the founders'
    and the evaluator's records agreeing, and the store's view of the knock and its sponsor."""
    run, out, said = joined
    view = json.loads((out / "status-live.json").read_text().splitlines()[-1])
    rows = {r["name"]: r for r in view["rows"]}
    assert {"evaluator", "node-0", "node-1", "node-2", "node-3"} <= set(rows), sorted(rows)
    assert all(rows[n]["state"] == "running" for n in ("evaluator", "node-0", "node-1")), view["rows"]
    (change,) = view["membership"]["changes"]
    e = int(re.search(rf"sponsoring node {NEW} \(incarnation 1\): joins at step (\d+)", said)[1])
    assert change["step"] == e and change["join"] == [[NEW, 1]], change
    assert view["membership"]["members"] == [0, 1, 2, 3, NEW] and view["problems"] == []
    assert view["agree"] is not False, view["odd"]
    # and the store (`--store`): every founder in its first life, node 4 the one knock, claimed by its sponsor
    sponsor = int(re.search(rf"node (\d+): sponsoring node {NEW}", said)[1])
    lives = {p["node"]: p for p in view["store"]["processes"]}
    assert view["store"]["knocks"] == 1 and sorted(lives) == [0, 1, 2, 3, NEW], view["store"]
    assert [lives[n]["incarnation"] for n in range(CLIENTS)] == [1] * CLIENTS, view["store"]
    assert lives[NEW] == {"node": NEW, "incarnation": 1, "sponsor": sponsor, "knocked": True, "waiting": False}


def test_the_log_records_the_join_and_the_newcomer_counts_from_its_join_step(joined):
    run, out, said = joined
    reader = LogReader(out / "log.bin")
    _, records = reader.read()
    assert len(records) == STEPS
    ((step, change),) = reader.changes.items()
    assert change.join == ((NEW, 1),) and change.leave == (), change
    e = int(re.search(rf"sponsoring node {NEW} \(incarnation 1\): joins at step (\d+)", said)[1])
    assert step == e < STEPS - 5, (step, e)  # admitted at the step its JOIN note names, mid-run
    origins = [{m.origin for m in msgs} for _, msgs in records]
    assert [NEW in o for o in origins] == [s >= e for s in range(STEPS)]
    # its edges: the join rule's (founders 0 and 1), grown and connected at both ends
    for q in EDGES:
        assert f"node {NEW}: connected to node {q}" in said or f"node {NEW}: edge to node {q} healed" in said


def test_an_id_the_run_is_not_open_to_or_without_its_key_is_refused_in_one_line(joined):
    run, out, said = joined
    p = run[f"node{BEYOND}"]
    assert p.returncode == 2, p.describe()
    assert f"SEEDFLOOD_NODE={BEYOND}: the run's new node ids are 4..5 (churn.max_nodes=6" in p.stdout, p.describe()
    p = run[f"node{KEYLESS}"]
    assert p.returncode == 2, p.describe()
    assert re.search(rf"seedflood: error: [^\n]*node-{KEYLESS}\.key", p.stdout), p.describe()
    for n in (BEYOND, KEYLESS):  # neither knocked: nobody sponsored, nothing logged of them
        assert "Traceback" not in run[f"node{n}"].stdout
        assert f"sponsoring node {n} " not in said and f"node {n}: a new node id: knocked" not in said
