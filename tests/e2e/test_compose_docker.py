"""docker/compose.yaml and docker/compose.churn.yaml on a real docker daemon, with the image
docker/build.sh builds from the working tree (once per session, tests/e2e/conftest.py), through
the Makefile's targets as a user runs them, with `docker compose` or docker-compose 1.29
(whichever the Makefile finds):

- `make compose-up`: the evaluator and 4 clients, each in its own container;
- the committed churn file: a client container's process killed with SIGKILL from the host is
  restarted by its `restart: on-failure` policy and rejoins by replay;
- `make compose-churn-up MAX_NODES=5` then `make compose-join`: new id 4 joins the running run.

Each ends on the replayed hash: `seedflood replay` of the run's log (copied out of the `runs`
volume) equals the hash the evaluator printed and every client's. Each test has a project of
its own, on a network compose creates for it that reaches nothing outside (docker/compose.yaml:
internal), and removes it with `down -v`: afterwards the daemon has no container, network or
volume of it. Without a daemon they skip, and fail under CI=true (docker_support.require).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import docker_support as dk
import e2e_support as sup
from seedflood.rundir.logfile import LogReader

pytestmark = pytest.mark.e2e

CONSENSUS = re.compile(r"consensus: all (\d+) clients equal the evaluator \(hash ([0-9a-f]+)\)")
# With PACE, at least 17 s of run after the kill at KILL_AT for a new container to start and rejoin:
# on a 2-core VM at load average ~15 (steps at 0.3-1.2 s) the restarted client1 rejoined 16 s after
# its container started, at step 116.
STEPS = 200
PACE = 0.1  # run.step_delay_s: a restart needs wall time, not steps; a sleep per step costs no CPU
KILL_AT = 30  # steps the evaluator has counted when the victim is killed
VICTIM = "client1"  # node 0: the evaluator's attach node, so the kill also moves the attach node
ROLES = ["evaluator", "client1", "client2", "client3", "client4"]
POLL_S = 1.0  # between looks at the daemon (each is a docker command)


def make(*args: str) -> list[str]:
    """`make TARGET ARGS` in the repository, this venv's (installed: -o install)."""
    venv = Path(sys.executable).parent.parent
    return ["make", "-s", "-o", "install", f"VENV={venv}", *args]


@pytest.fixture
def project(request: pytest.FixtureRequest) -> Iterator[str]:
    """A compose project of this test alone; whatever the test left of it is removed by force
    afterwards (the test itself asserts `down -v` left nothing)."""
    name = dk.project_name(request.node.name.removeprefix("test_")[:12].replace("_", "-"))
    try:
        yield name
    finally:
        dk.remove_project(name)


def run_config(tmp: Path, **sections: dict) -> Path:
    """The debug config with `sections` merged in, at an absolute path (the preflight reads it
    here; `dk.image_with` puts it at the same path in the test's image)."""
    cfg = yaml.safe_load(sup.DEBUG_CONFIG.read_text())
    for section, values in sections.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    path = tmp / "run-config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def churn_config(tmp: Path) -> Path:
    return run_config(
        tmp,
        run={"steps": STEPS, "step_delay_s": PACE},
        transport={"timeout_s": 3},
        eval={"every": 0},
        checkpoint={"every": 0},
    )


def evaluator_step(project: str) -> int:
    """The evaluator's progress bar (`seedflood: ...| n/STEPS`) at its latest refresh; 0 before."""
    ids = dk.containers(project, "evaluator")
    if not ids:
        return 0
    r = dk.docker("logs", "--tail", "5", ids[0], check=False)
    said = r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")
    counts = re.findall(rf"\| *(\d+)/{STEPS} ", said)
    return int(counts[-1]) if counts else 0


def consensus_hash(project: str, clients: int = 4) -> str:
    """The hash the evaluator printed, checked to be every client's ("all N clients equal ...")."""
    said = dk.logs(project, "evaluator")
    found = CONSENSUS.findall(said)
    assert found, f"no consensus line from the evaluator:\n{said[-3000:]}"
    count, printed = found[-1]
    assert int(count) == clients, found
    return printed


def assert_replayed(out: Path, printed: str, steps: int, context: str = "", clients: int = 4) -> dict:
    """Every client equals the evaluator and `seedflood replay` of the log gives the same hash,
    the one the evaluator printed (its first 16 digits)."""
    summary = sup.check_churn_run(out, steps, context, clients=clients)  # incl. the replay
    assert summary["param_hash"].startswith(printed), (summary["param_hash"], printed)
    return summary


def assert_nothing_left(project: str) -> None:
    left = dk.leftovers(project)
    assert left == [], f"`down -v` left {left}"


def down(argv: list[str], env: dict[str, str], tmp_path: Path, project: str) -> None:
    """Run the command that takes `project` down with its volume; assert it did, leaving nothing."""
    with sup.procs(tmp_path / "down") as procs:
        procs.start("down", argv, env=env, log=tmp_path / "down.log")
        (code,) = procs.wait()
    assert code == 0, sup.tail(tmp_path / "down.log")
    assert_nothing_left(project)


def report(project: str) -> str:
    """Every container's state and the tail of its output, for assertion messages."""
    parts = []
    for name, state in sorted(dk.states(project).items()):
        said = dk.logs(project, name)
        tail = "\n".join(
            x for x in said.replace("\r", "\n").splitlines() if x.strip() and not x.startswith("seedflood:")
        )
        parts.append(
            f"== {name}: {state['Status']} exit {state['ExitCode']} restarts {state['RestartCount']}\n{tail[-2500:]}"
        )
    return "\n".join(parts)


@pytest.mark.timeout(1800)  # an outer bound: the waits are bounded by progress
def test_make_compose_up_runs_the_evaluator_and_four_clients_in_containers(
    docker_image: str, reference_hash: str, project: str, tmp_path: Path
) -> None:
    """`make compose-up` (the debug config, in the image): five containers on an internal
    network, the evaluator's status is make's; every client ends on the evaluator's hash, which
    the replay of the run's log and the single-process reference give too."""
    log = tmp_path / "make.log"
    with sup.procs(tmp_path / "procs") as procs:
        procs.start(
            "up",
            make("compose-up", f"PROJECT={project}", f"IMAGE={docker_image}", "BUILD=0"),
            env=sup.launcher_env(),
            log=log,
        )
        (code,) = procs.wait()
    try:
        assert code == 0, f"make compose-up exited {code}:\n{sup.tail(log)}\n{report(project)}"
        states = dk.states(project)
        assert sorted(states) == sorted(ROLES), states
        assert {n: s["ExitCode"] for n, s in states.items()} == dict.fromkeys(ROLES, 0), report(project)
        assert dk.network_internal(project), "the run's network reaches outside"
        printed = consensus_hash(project)
        out = dk.fetch_runs(project, docker_image, tmp_path / "runs") / "compose"
        summary = sup.check_run(out)
        assert summary["param_hash"].startswith(printed) and summary["param_hash"] == reference_hash, (summary, printed)
        assert sup.replay(out)["param_hash"] == reference_hash
    finally:
        with sup.procs(tmp_path / "down") as procs:
            procs.start(
                "down",
                make("compose-down", f"PROJECT={project}", f"IMAGE={docker_image}"),
                env=sup.launcher_env(),
                log=tmp_path / "down.log",
            )
            (code,) = procs.wait()
        assert code == 0, sup.tail(tmp_path / "down.log")
    assert_nothing_left(project)


def kill_from_host(project: str, service: str) -> None:
    """SIGKILL the service's container process from the host: a crash, which the restart policy
    answers (`docker kill` would count as stopped by hand: no restart). Needs root."""
    (state,) = [s for n, s in dk.states(project).items() if n == service]
    assert state["Running"] and state["Pid"] > 0, state
    try:
        os.kill(state["Pid"], signal.SIGKILL)
    except PermissionError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("a container's process can be killed from the host as root only")


def churned(project: str) -> dict[str, dict]:
    """The roles' states once every one has exited for good (the store runs until `down`):
    exited, and not about to be restarted."""
    roles = {n: s for n, s in dk.states(project).items() if n != "store"}
    return roles if roles and all(s["Status"] == "exited" and not s["Restarting"] for s in roles.values()) else {}


@pytest.mark.timeout(1800)  # an outer bound: the waits are bounded by progress
def test_a_killed_client_container_is_restarted_by_its_policy_and_rejoins(
    docker_image: str, project: str, tmp_path: Path
) -> None:
    """docker/compose.churn.yaml as committed, started as its header says: `kill -9` of client1's
    process from the host after KILL_AT steps; the daemon restarts the container (on-failure),
    the new incarnation rejoins by replay, the evaluator follows node 1, and every role exits 0
    with all 4 clients on the evaluator's hash, which the log replays to."""
    config = churn_config(tmp_path)
    image = dk.image_with(docker_image, {config: config.read_text()})
    compose = [*dk.compose_command(), "-p", project, "-f", str(sup.REPO / "docker" / "compose.churn.yaml")]  # type: ignore[misc]
    env = {**sup.launcher_env(), "IMAGE": image, "CONFIG": str(config)}
    try:
        with sup.procs(tmp_path / "procs") as procs:
            procs.start("up", [*compose, "up", "--no-build", "-d"], env=env, log=tmp_path / "up.log")
            (code,) = procs.wait()
            assert code == 0, sup.tail(tmp_path / "up.log")
            procs.wait_for(
                lambda: evaluator_step(project) >= KILL_AT,
                f"{KILL_AT} steps",
                progress=lambda: evaluator_step(project),
                poll_s=POLL_S,
            )
            kill_from_host(project, VICTIM)
            done: dict[str, dict] = {}

            def finished() -> bool:
                done.update(churned(project))
                return bool(done)

            procs.wait_for(
                finished, "every role to exit for good", progress=lambda: evaluator_step(project), poll_s=POLL_S
            )
        said = report(project)
        assert {n: s["ExitCode"] for n, s in done.items()} == dict.fromkeys(ROLES, 0), said
        assert {n: s["RestartCount"] for n, s in done.items()} == {n: int(n == VICTIM) for n in ROLES}, said
        assert "rejoined by replaying" in dk.logs(project, VICTIM), said
        assert "evaluator: following node 1" in dk.logs(project, "evaluator"), said
        printed = consensus_hash(project)
        out = dk.fetch_runs(project, image, tmp_path / "runs") / "compose-churn"
        assert_replayed(out, printed, STEPS, said)
        _, records = (reader := LogReader(out / "log.bin")).read()
        node = int(VICTIM.removeprefix("client")) - 1
        (leave, rejoin) = sorted(reader.changes.items())
        assert leave[1].leave == (node,) and rejoin[1].join == ((node, 2),), reader.changes
        assert len(records) == STEPS
        down([*compose, "down", "-v"], env, tmp_path, project)
    finally:
        dk.remove_project(project)
        dk.remove_image(image)


@pytest.mark.timeout(1800)  # an outer bound: the waits are bounded by progress
def test_make_compose_join_adds_a_new_id_to_the_running_churn_project(
    docker_image: str, project: str, tmp_path: Path
) -> None:
    """`make compose-churn-up N=4 MAX_NODES=5` (detached, waits for the end, exits with the
    evaluator's status, then `down`), and a few steps in `make compose-join N=4 MAX_NODES=5`:
    the service of new id 4 starts in the running project, knocks at the store and joins; the
    log records the join, all 5 clients end on the evaluator's hash and the log replays to it.
    `make compose-down` then removes the project with its volume."""
    config = churn_config(tmp_path)
    image = dk.image_with(docker_image, {config: config.read_text()})
    common = ["N=4", "MAX_NODES=5", f"CHURN_PROJECT={project}", f"IMAGE={image}", f"CONFIG={config}"]
    env = sup.launcher_env()
    try:
        with sup.procs(tmp_path / "procs") as procs:
            procs.start("up", make("compose-churn-up", *common, "BUILD=0"), env=env, log=tmp_path / "up.log")
            procs.wait_for(
                lambda: evaluator_step(project) >= 5,
                "5 steps",
                alive=["up"],
                progress=lambda: evaluator_step(project),
                poll_s=POLL_S,
            )
            procs.start("join", make("compose-join", *common), env=env, log=tmp_path / "join.log")
            (joined,) = procs.wait(["join"])
            assert joined == 0, sup.tail(tmp_path / "join.log")
            assert dk.containers(project, "client5"), "compose-join started no client5"
            (code,) = procs.wait(["up"], progress=lambda: evaluator_step(project), poll_s=POLL_S)
        assert code == 0, f"make compose-churn-up exited {code}:\n{sup.tail(tmp_path / 'up.log')}"
        assert dk.states(project) == {}, "compose-churn-up ends with `down`"
        # its `down` keeps the runs volume: what the leftovers check below must then not see
        assert dk.leftovers(project) == [f"volume {project}_runs"], dk.leftovers(project)
        out = dk.fetch_runs(project, image, tmp_path / "runs") / "compose-churn"
        summary = sup.check_churn_run(out, STEPS, sup.tail(tmp_path / "up.log"), clients=5)  # incl. the replay
        _, records = (reader := LogReader(out / "log.bin")).read()
        ((step, change),) = reader.changes.items()
        assert change.join == ((4, 1),) and change.leave == (), reader.changes
        origins = [{m.origin for m in msgs} for _, msgs in records]
        assert [4 in o for o in origins] == [s >= step for s in range(STEPS)]  # counted from its join step
        assert summary["param_hash"] == sup.replay(out)["param_hash"]
        down(make("compose-down", f"PROJECT={project}", f"IMAGE={image}"), env, tmp_path, project)
    finally:
        dk.remove_project(project)
        dk.remove_image(image)


@pytest.mark.parametrize("ci", ["true", ""])
def test_without_a_daemon_the_tests_skip_but_fail_under_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    """docker_support.require: a missing daemon is a skip with its reason, and under CI=true
    (where .ci/setup-e2e.sh starts one) a failure."""
    monkeypatch.setattr(dk, "unavailable", lambda: "no docker daemon answers (test)")
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match="no docker daemon answers"):
        dk.require()
