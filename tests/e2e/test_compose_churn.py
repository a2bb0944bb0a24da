"""docker/compose.churn.yaml without a docker daemon: the file (`restart: on-failure` per role,
a `store` service) is scale.py's rendering and validates; `scale.py --churn --max-nodes M` adds a
service per new id in the `join` profile; the make targets' command lines (a stand-in `docker`);
and a killed evaluator restarted under the file's restart policy, emulated.

On a real daemon (tests/e2e/test_compose_docker.py) a killed client container is restarted and
rejoins, and `make compose-join` adds a new id. What only this file covers: the renderings for
other N and other new ids, ADD=2 and FIRST batches of `make compose-join`, and the evaluator's
restart (its process killed, resumed from its checkpoint, caught up), whose run the daemon tests
leave out to keep CI short. For that, as tests/e2e/test_compose.py's `local_commands` maps them,
every service's exact entrypoint + command + environment runs as a local process (hostnames ->
127.0.0.1, ports -> free ones, /work -> this repository, the `runs` volume -> a temporary
directory), and a `Supervisor` stands in for the daemon's restart policy: a process that exits
non-zero is started again with the same command after docker's back-off (100 ms, doubled after
every run shorter than 10 s), at most N times for `on-failure:N`, never for `no`. The run's
settings come through the file's own knob, ${CONFIG}: the debug config with enough steps that a
restart lands mid-run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest
import yaml

import e2e_support as sup
import runs
import test_compose as tc
from seedflood.rundir.logfile import LogReader

pytestmark = pytest.mark.e2e

CHURN = sup.REPO / "docker" / "compose.churn.yaml"
SCALE = sup.REPO / "docker" / "scale.py"
STEPS = 200  # with PACE: a client restarted at step 10 rejoined at 77 in CI at ~25 steps/s (2.7 s): 6x margin
PACE = 0.05  # run.step_delay_s: a restart needs wall time, not steps; a sleep per step costs no CPU
STORE_PORT = 29400  # the store's port inside the compose network (scale.STORE_PORT)
ROLES = ["evaluator", "client1", "client2", "client3", "client4"]
PROGRESS = re.compile(r"^seedflood:\s+\d+%")  # tqdm's refreshes in the evaluator's output


def load_scale() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compose_scale", SCALE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- the file, offline ----------------------------------------------------------------------


def test_committed_churn_file_is_the_rendering_of_compose_yaml() -> None:
    """compose.churn.yaml is scale.py's churn rendering of compose.yaml for 4 clients: edits go to
    compose.yaml (or scale.py) and the file is regenerated, so the two layouts cannot drift."""
    rendered = load_scale().render(4, churn_layout=True, relative_to=SCALE.parent)
    assert CHURN.read_text() == rendered, (
        "docker/compose.churn.yaml is stale: python docker/scale.py --churn --out docker/compose.churn.yaml 4"
    )


def restart_limit(policy: object) -> int | None:
    """Restarts a compose `restart:` value allows: 0 for "no" (or absent), N for on-failure:N,
    None (unbounded) for on-failure. `always`/`unless-stopped` would restart a finished run."""
    text = "no" if policy is None else str(policy)
    if text == "no":
        return 0
    m = re.fullmatch(r"on-failure(?::(\d+))?", text)
    assert m, f"restart policy {text!r} is not emulated (only no / on-failure[:N])"
    return int(m.group(1)) if m.group(1) else None


def test_churn_file_shape() -> None:
    svc = tc.services(CHURN)
    assert list(svc) == ["store", *ROLES]
    store = svc["store"]
    assert [*store["entrypoint"], *store["command"]] == [
        *["python", "-m", "seedflood", "store"],
        *["--host", "0.0.0.0", "--port", str(STORE_PORT)],
    ]
    assert restart_limit(store.get("restart")) == 0, "a restarted store would be empty: never restart it"
    for name in ROLES:
        s = svc[name]
        assert s["environment"]["SEEDFLOOD_STORE"] == f"store:{STORE_PORT}", name
        assert s["depends_on"] == ["store"], name
        limit = restart_limit(s["restart"])
        assert limit is None or limit >= 1, f"{name} must be restarted on failure"
        assert "churn.settle=1" in s["command"] and "checkpoint.resume=true" in s["command"], name
        assert "run.out_dir=/work/runs/compose-churn" in s["command"], name  # not the strict run's directory
    ranks = sorted(int(svc[n]["environment"]["RANK"]) for n in ROLES)
    assert ranks == list(range(5)) and {svc[n]["environment"]["WORLD_SIZE"] for n in ROLES} == {"5"}
    # the strict default stays strict: no store, no restart policy, no churn.settle
    strict = tc.services()
    assert "store" not in strict
    assert all("restart" not in s and not any("churn" in str(a) for a in s["command"]) for s in strict.values())


def scale(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`python docker/scale.py ARGS`, its output captured."""
    return subprocess.run([sys.executable, str(SCALE), *args], capture_output=True, text=True, check=check, timeout=60)


def validate(text: str, validators: list[list[str]]) -> None:
    """Every offline compose validator accepts the rendered file `text`."""
    for argv in validators:
        r = subprocess.run(argv, input=text, capture_output=True, text=True, timeout=60, cwd=CHURN.parent)
        assert r.returncode == 0, f"{argv[0]}: {r.stdout}{r.stderr}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("clients", [4, 2, 7])
def test_churn_file_validates_offline(clients: int) -> None:
    validators = tc._validators()
    if not validators:
        pytest.skip("neither docker-compose (Debian) nor check-jsonschema (PyPI) is installed; run .ci/setup-e2e.sh")
    if clients == 4:
        text = CHURN.read_text()
    else:
        text = scale("--churn", str(clients)).stdout
        svc = yaml.safe_load(text)["services"]
        roles = ["evaluator", *(f"client{i}" for i in range(1, clients + 1))]
        assert list(svc) == ["store", *roles]
        assert {svc[n]["environment"]["WORLD_SIZE"] for n in roles} == {str(clients + 1)}
        assert all(f"topology.nodes={clients}" in svc[n]["command"] for n in roles)
    validate(text, validators)


def test_max_nodes_opens_new_ids_as_join_profile_services() -> None:
    """--max-nodes 6 for 4 clients: churn.max_nodes=6 in every command and services client5 and
    client6 (new ids 4 and 5), the clients' own command with SEEDFLOOD_NODE instead of a rank,
    that `up` leaves alone (the `join` profile) until they are named; the file validates."""
    text = scale("--churn", "--max-nodes", "6", "4").stdout
    svc = yaml.safe_load(text)["services"]
    assert list(svc) == ["store", *ROLES, "client5", "client6"]
    for name in ROLES:
        assert svc[name]["command"][-2:] == ["--set", "churn.max_nodes=6"] and "profiles" not in svc[name], name
    for node, name in ((4, "client5"), (5, "client6")):
        s = svc[name]
        assert s["profiles"] == ["join"] and s["command"] == svc["client1"]["command"], name
        assert s["environment"]["SEEDFLOOD_NODE"] == str(node) and not {"RANK", "WORLD_SIZE"} & set(s["environment"])
        assert {k: v for k, v in s.items() if k not in ("environment", "profiles")} == {
            k: v for k, v in svc["client1"].items() if k != "environment"
        }
    for argv in [["--max-nodes", "6", "4"], ["--churn", "--max-nodes", "4", "4"]]:  # strict; no new id
        r = scale(*argv, check=False)
        assert r.returncode == 2 and "--max-nodes" in r.stderr.splitlines()[-1], r.stderr
    validate(text, tc._validators())


@pytest.mark.timeout(120)
def test_make_compose_targets_hand_docker_the_runs_rendering(tmp_path: Path) -> None:
    """`make compose-churn-up` and `make compose-join` as a user runs them, with a stand-in
    `docker` that records every command line and each file it is handed: both hand over the run's
    own rendering (scale.py --churn [--max-nodes]), the churn project's end is `down` with that
    file (docker-compose 1.29 needs one), and compose-join runs `up -d --no-build --no-deps
    --no-recreate` of the new ids' services only (ADD of them from FIRST), in the churn project.
    Ids outside N..MAX_NODES-1, or no MAX_NODES, are refused before docker is called. The
    daemon test (test_compose_docker.py) runs one new id for real."""
    stub = tmp_path / "bin" / "docker"
    stub.parent.mkdir()
    calls, stdin = tmp_path / "calls", tmp_path / "stdin.yaml"
    # every command line, one a line; the file of the last call handed one (`-f -`). It lists
    # no container, so compose-churn-up's wait ends at once.
    stub.write_text(f'#!/bin/sh\necho "$*" >> {calls}\ncase "$*" in *"-f -"*) cat > {stdin};; esac\n')
    stub.chmod(0o755)
    venv = Path(sys.executable).parent.parent  # the Makefile's VENV (its python and the stamp's folder)
    env = {**sup.launcher_env(), "PATH": f"{stub.parent}{os.pathsep}{os.environ['PATH']}"}

    def make(*args: str, target: str = "compose-join") -> list[list[str]]:
        """The target's docker calls (compose v2 named, no image build); asserts make's exit 0."""
        calls.unlink(missing_ok=True)
        argv = ["make", "-s", "-o", "install", f"VENV={venv}", "COMPOSE=docker compose", "BUILD=0", target, *args]
        r = subprocess.run(
            argv, capture_output=True, text=True, cwd=sup.REPO, env=env, timeout=60, stdin=subprocess.DEVNULL
        )
        assert r.returncode == 0, r.stdout + r.stderr
        return [line.split() for line in calls.read_text().splitlines()] if calls.exists() else []

    project = ["-p", "seedflood-churn", "-f", "-"]
    # the run itself: compose-churn-up hands docker the same rendering, waits (the containers by
    # compose's labels), reads the evaluator's exit code and runs `down` with the rendering
    said = make("N=4", target="compose-churn-up")  # without MAX_NODES: the layout as before, no new ids
    assert said[0] == ["compose", *project, "up", "--no-build", "-d"] and said[-1] == ["compose", *project, "down"], (
        said
    )
    assert ["ps", "-aq", "--filter", "label=com.docker.compose.project=seedflood-churn"] in said, said
    assert stdin.read_text() == CHURN.read_text().replace("context: ..", f"context: {sup.REPO}")
    said = make("N=4", "MAX_NODES=7", target="compose-churn-up")
    assert said[-1] == ["compose", *project, "down"], said
    assert stdin.read_text() == load_scale().render(4, churn_layout=True, max_nodes=7)
    stdin.unlink()

    said = make("N=4", "MAX_NODES=7", "ADD=2")
    assert said == [["compose", *project, "up", "-d", "--no-build", "--no-deps", "--no-recreate", "client5", "client6"]]
    assert stdin.read_text() == load_scale().render(4, churn_layout=True, max_nodes=7)
    said = make("N=4", "MAX_NODES=7", "ADD=1", "FIRST=6")  # a second batch: id 6 only
    assert said[-1][-2:] == ["--no-recreate", "client7"], said
    said = make("N=4", "MAX_NODES=7", "ADD=1", "FIRST=6", target="compose-scale")  # the same under --scale's name
    assert said[-1][-2:] == ["--no-recreate", "client7"], said
    for args, refusal in [
        (("N=4", "MAX_NODES=7", "ADD=2", "FIRST=6"), "new ids 6..7 are outside the run's 4..6"),
        (("N=4", "MAX_NODES=7", "FIRST=3"), "new ids 3..3 are outside the run's 4..6"),
        (("N=4", "ADD=1"), "MAX_NODES=M (the run's churn.max_nodes) is required"),
    ]:
        calls.unlink(missing_ok=True)
        argv = ["make", "-s", "-o", "install", f"VENV={venv}", "COMPOSE=docker compose", "compose-join", *args]
        r = subprocess.run(
            argv, capture_output=True, text=True, cwd=sup.REPO, env=env, timeout=60, stdin=subprocess.DEVNULL
        )
        assert r.returncode != 0 and refusal in r.stderr and not calls.exists(), (args, r.stderr)


# ---- the restart policy, emulated ------------------------------------------------------------


@dataclass
class Service:
    """One compose service as a local process under its restart policy."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    max_restarts: int | None  # restart_limit(): 0 = never, None = unbounded
    proc: subprocess.Popen | None = None
    codes: list[int] = field(default_factory=list)  # every exit status, as docker reports it
    restarts: int = 0
    started: float = 0.0
    due: float | None = None  # when the pending restart starts
    backoff: float = 0.0  # docker's restart delay (s)

    @property
    def finished(self) -> bool:
        """Exited for good: its last exit is handled (by `Supervisor.poll`) and no restart is due."""
        return self.due is None and len(self.codes) == self.restarts + 1


class Supervisor:
    """The container daemon's part: start every service, restart a failed one per its policy
    (docker's restart manager: delay 100 ms, doubled after every run shorter than 10 s and reset
    after a longer one, at most 1 min; on-failure:N counts restarts over the container's life).
    The processes themselves are the harness's (tests/procs.py), which also bounds every wait by
    progress (the services' logs and the watched files)."""

    def __init__(self, services: list[Service], tmp: Path) -> None:
        self.services = {s.name: s for s in services}
        self.procs = sup.procs(tmp / "procs")

    def __getitem__(self, name: str) -> Service:
        return self.services[name]

    def _start(self, s: Service) -> None:
        if s.name in self.procs.procs:  # appends to the same log: one log per container
            s.proc = self.procs.again(s.name).popen
        else:
            s.proc = self.procs.start(s.name, s.argv, env=s.env, log=s.log).popen
        s.started = time.monotonic()
        s.due = None

    def start(self) -> None:
        """`up`: every service."""
        for s in self.services.values():
            self._start(s)

    def poll(self) -> None:
        now = time.monotonic()
        for s in self.services.values():
            if s.due is not None:
                if now >= s.due:
                    s.restarts += 1
                    self._start(s)
                continue
            code = s.proc.poll() if s.proc is not None else None
            if code is None or len(s.codes) > s.restarts:
                continue  # running, or its exit is already handled
            s.codes.append(128 - code if code < 0 else code)  # killed by signal k: 128 + k
            ran = now - s.started
            s.backoff = 0.1 if ran >= 10 or s.backoff == 0 else min(2 * s.backoff, 60.0)
            if code != 0 and (s.max_restarts is None or s.restarts < s.max_restarts):
                s.due = now + s.backoff

    def kill(self, name: str) -> None:
        """SIGKILL the service's process (a crash, as `kill -9` of the container's main process)."""
        proc = self[name].proc
        assert proc is not None and proc.poll() is None, f"{name} is not running"
        os.kill(proc.pid, signal.SIGKILL)

    def wait(self, names: list[str]) -> None:
        """Supervise until every named service has exited for good (fails on a stall)."""
        self.procs.wait_for(lambda: all(self[n].finished for n in names), f"{names} to finish", on_poll=self.poll)

    def close(self) -> None:
        self.procs.close()

    def report(self) -> str:
        return "\n".join(
            f"== {s.name}: exits {s.codes}, restarts {s.restarts}\n{quiet_tail(s.log)}" for s in self.services.values()
        )


def quiet_tail(log: Path, n: int = 25) -> str:
    """The last n lines of a log without the evaluator's progress bar (one line per refresh)."""
    return "\n".join([x for x in sup.tail(log, 10_000).splitlines() if not PROGRESS.match(x)][-n:])


def test_supervisor_restarts_on_failure_only_within_its_limit(tmp_path: Path) -> None:
    """The emulation itself: non-zero exits are restarted up to the limit, zero and `no` never."""
    py = sys.executable
    counter = tmp_path / "n"
    counter.write_text("0")
    # fails twice (exit 3), then succeeds: the count lives in a file, as state on a volume would
    flaky = "import pathlib,sys; p=pathlib.Path(sys.argv[1]); n=int(p.read_text())+1; p.write_text(str(n)); sys.exit(3 if n < 3 else 0)"
    env = sup.launcher_env()
    svcs = [
        Service("flaky", [py, "-c", flaky, str(counter)], env, tmp_path / "flaky.log", None),
        Service("capped", [py, "-c", "import sys; sys.exit(5)"], env, tmp_path / "capped.log", 1),
        Service("never", [py, "-c", "import sys; sys.exit(7)"], env, tmp_path / "never.log", 0),
        Service("ok", [py, "-c", "pass"], env, tmp_path / "ok.log", None),
    ]
    run = Supervisor(svcs, tmp_path)
    try:
        run.start()
        run.wait([s.name for s in svcs])
    finally:
        run.close()
    assert (run["flaky"].codes, run["flaky"].restarts) == ([3, 3, 0], 2)
    assert (run["capped"].codes, run["capped"].restarts) == ([5, 5], 1)
    assert (run["never"].codes, run["never"].restarts) == ([7], 0)
    assert (run["ok"].codes, run["ok"].restarts) == ([0], 0)


# ---- the churn layout as processes ----------------------------------------------------------


def churn_config(tmp: Path, **sections: dict) -> Path:
    """The debug config with `sections` merged in: what ${CONFIG} names for the run."""
    cfg = yaml.safe_load(sup.DEBUG_CONFIG.read_text())
    for section, values in sections.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    path = tmp / "churn-config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def supervised(tmp: Path, config: Path, compose: Path = CHURN) -> Supervisor:
    """Every service of `compose` (the churn layout) as a local process under its own restart policy."""
    store_port, master_port = sup.free_port(), sup.free_port()
    svc = tc.services(compose)
    hostnames = set(svc) | {s["hostname"] for s in svc.values() if s.get("hostname")}

    def local_address(text: str) -> str:  # store:29400 -> 127.0.0.1:<free>
        host, _, port = text.rpartition(":")
        assert host in hostnames and port == str(STORE_PORT), text
        return f"127.0.0.1:{store_port}"

    services = []
    image_env = {k: v for k, v in sup.launcher_env().items() if k in ("PATH", "PYTHONPATH", "HOME", "LANG")}
    for name, argv, env in tc.local_commands(tmp, master_port, compose, {"CONFIG": str(config)}):
        if "SEEDFLOOD_STORE" in env:
            env["SEEDFLOOD_STORE"] = local_address(env["SEEDFLOOD_STORE"])
        if argv[3:4] == ["store"]:  # listen where the others look, on loopback only
            assert argv[4:] == ["--host", "0.0.0.0", "--port", str(STORE_PORT)], argv
            argv = [*argv[:4], "--host", "127.0.0.1", "--port", str(store_port)]
        limit = restart_limit(svc[name].get("restart"))
        services.append(Service(name, argv, {**image_env, **env}, tmp / f"{name}.log", limit))
    return Supervisor(services, tmp)


def wait_for_steps(out: Path, n: int, run: Supervisor) -> None:
    """Supervise until the log holds about n more steps than its header, every service running
    (runs.wait_for_steps: bounded by progress)."""
    runs.wait_for_steps(run.procs, out, n, on_poll=run.poll)


def churn_run(tmp: Path, victim: str, after_steps: int, **sections: dict) -> tuple[Supervisor, Path, str]:
    """Start the churn layout, SIGKILL `victim` after about `after_steps` steps, supervise to the end.
    Returns the supervisor (exit codes, restarts), the run directory and a report for messages."""
    config = churn_config(
        tmp,
        **{
            "run": {"steps": STEPS, "step_delay_s": PACE},
            "transport": {"timeout_s": 3},
            "eval": {"every": 0},
            **sections,
        },
    )
    run = supervised(tmp, config)
    out = tmp / "runs" / "compose-churn"
    try:
        run.start()
        wait_for_steps(out, after_steps, run)
        run.kill(victim)
        run.wait(ROLES)
    finally:
        run.close()
    report = run.report()
    assert run["store"].codes == [], f"the store exited:\n{report}"  # it runs until `down`
    return run, out, report


def check_summary(out: Path, report: str, clients: int = 4) -> dict:
    return sup.check_churn_run(out, STEPS, report, clients=clients)


@pytest.mark.timeout(1800)  # an outer bound: the waits are bounded by the run's progress
def test_a_killed_evaluator_container_is_restarted_and_catches_up(entry: str, tmp_path: Path) -> None:
    """SIGKILL the evaluator's process mid-run (the store is its own service, so nothing else
    depends on it): the clients train on, its restart resumes from its checkpoint and log, takes
    the steps it missed from the attach node and ends on the clients' hash."""
    if entry != "seedflood":
        pytest.skip("churn needs the real `seedflood train` (the probe has no churn)")
    run, out, report = churn_run(tmp_path, "evaluator", 150, checkpoint={"every": 100})
    assert {n: run[n].codes[-1] for n in ROLES} == dict.fromkeys(ROLES, 0), report
    assert run["evaluator"].codes == [137, 0] and run["evaluator"].restarts == 1, report
    assert all(run[n].restarts == 0 for n in ROLES if n != "evaluator"), report
    # the restarted evaluator published the step it needs: the catch-up starts there, not at 0
    text = run["client1"].log.read_text(errors="replace")
    assert re.search(r"the evaluator follows this node; sent it steps [1-9]\d*\.\.", text), report
    summary = check_summary(out, report)
    assert 0 < summary["resumed_from_step"] < STEPS, report  # from its own checkpoint, then caught up
    reader = LogReader(out / "log.bin")
    _, records = reader.read()
    assert len(records) == STEPS and reader.changes == {}, reader.changes  # the evaluator is no member
