"""torchrun as a user runs it: one node, two nodes on one machine (c10d), and a restarted group.

Each test checks that every client ends with the evaluator's parameter hash, and that the hash
equals the one-node loopback run of the same config (the trajectory does not depend on the launch).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

import e2e_support as sup
import procs as harness

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(1200)  # outer bounds: every wait below is bounded by the run's progress
def test_single_node(reference_run: dict) -> None:
    assert len(reference_run["client_hashes"]) == 4


@pytest.mark.timeout(1200)
def test_two_nodes_c10d_rendezvous(reference_run: dict, tmp_path: Path) -> None:
    out = tmp_path / "run"
    endpoint = f"127.0.0.1:{sup.free_port()}"
    with sup.procs(tmp_path / "procs") as procs:
        procs.watch(out / "log.bin")
        for node in (0, 1):
            env = sup.launcher_env(
                NNODES="2", NODE_RANK=str(node), RDZV_ENDPOINT=endpoint, RDZV_ID=f"e2e-{os.getpid()}"
            )
            procs.start(
                f"node{node}",
                ["launch/torchrun.sh", str(sup.DEBUG_CONFIG), *sup.sets(f"run.out_dir={out}")],
                env=env,
                log=tmp_path / f"node{node}.log",
            )
        codes = procs.wait(fail_fast=True)
    logs = "\n".join(sup.tail(tmp_path / f"node{n}.log") for n in (0, 1))
    assert codes == [0, 0], f"exit codes {codes}:\n{logs}"
    # NNODES=2 splits the 5 processes 3 + 2.
    assert "--nproc-per-node=3" in (tmp_path / "node0.log").read_text()
    assert "--nproc-per-node=2" in (tmp_path / "node1.log").read_text()
    summary = sup.check_run(out)
    assert summary["param_hash"] == reference_run["param_hash"]


def _worker_pids(agent_pid: int, rank: int) -> list[int]:
    """Processes under the torchrun agent whose environment says RANK=rank."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) != agent_pid:
                continue
            env = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if f"RANK={rank}".encode() in env:
            found.append(int(proc.name))
    return found


def _scored_step(run_dir: Path) -> int:
    """The highest step the run's own metrics.jsonl reports (-1 before the first line)."""
    path = run_dir / "metrics.jsonl"
    steps = [-1]
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                steps.append(int(json.loads(line)["step"]))
            except (ValueError, KeyError, TypeError):
                continue  # a line being written
    return max(steps)


def _uninterrupted_hash(steps: int, out: Path) -> str:
    """The debug config's bits after `steps` steps: from the single-process reference (launched
    runs equal it, tests/dist/test_train_gloo.py), so no second launched run is paid for; the
    stand-in entry (SEEDFLOOD_E2E_ENTRY=probe) has bits of its own and runs once uninterrupted."""
    if sup.MODULE == "seedflood":
        return sup.simulated_hash(f"run.steps={steps}")
    sup.run_checked(
        ["launch/torchrun.sh", str(sup.DEBUG_CONFIG), *sup.sets(f"run.out_dir={out}", f"run.steps={steps}")],
        env=sup.launcher_env(),
        log=out.parent / "reference.log",
        watch=[out / "log.bin"],
    )
    return str(sup.check_run(out)["param_hash"])


@pytest.mark.timeout(1800)
def test_max_restarts_resumes_from_checkpoint(entry: str, tmp_path: Path) -> None:
    """Kill a client once the run reports step 6 (of 60): torchrun restarts the group, which
    resumes from the log and ends on the uninterrupted run's bits. The kill must land."""
    out = tmp_path / "run"
    steps, kill_at = 60, 6  # eval.every and checkpoint.every are 3 in the debug config
    expected = _uninterrupted_hash(steps, tmp_path / "reference")

    env = sup.launcher_env(MAX_RESTARTS="2", PROBE_STEP_DELAY="0.1")
    killed: list[int] = []
    with sup.procs(tmp_path / "procs") as procs:
        procs.watch(out / "log.bin", out / "metrics.jsonl")
        agent = procs.start(
            "torchrun",
            ["launch/torchrun.sh", str(sup.DEBUG_CONFIG), *sup.sets(f"run.out_dir={out}", f"run.steps={steps}")],
            env=env,
            log=tmp_path / "torchrun.log",
        )

        def kill_at_step() -> bool:
            if _scored_step(out) >= kill_at:
                for pid in _worker_pids(agent.pid, rank=2):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            return bool(killed) or procs.exited("torchrun")

        procs.wait_for(kill_at_step, f"step {kill_at} to kill rank 2 at")
        (code,) = procs.wait()
    log = sup.tail(tmp_path / "torchrun.log")
    assert killed, f"the kill did not land (run reported step {_scored_step(out)}, exit {code}):\n{log}"
    assert code == 0, f"torchrun exited {code} after the kill:\n{log}"
    summary = sup.check_run(out)
    assert summary["param_hash"] == expected, "a resumed run must produce the same bits"


@pytest.mark.timeout(1200)
def test_checkpoint_is_a_plain_hugging_face_model(reference_run: dict, tmp_path: Path) -> None:
    """The evaluator's model directory loads with AutoModelForCausalLM, carries the trained
    weights, and equals what `seedflood replay --out` rebuilds from base + log."""
    import sys

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(reference_run["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok("a great film\n", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()

    run_dir = model_dir.parents[2]
    out = tmp_path / "replayed"
    replay = harness.run(  # an outer bound: a replay of six tiny steps
        [sys.executable, "-m", "seedflood", "replay", str(run_dir), "--out", str(out), "--json"],
        timeout=900,
        env=sup.launcher_env(),
    )
    assert replay.returncode == 0, replay.stderr
    assert f'"param_hash": "{reference_run["param_hash"]}"' in replay.stdout
    rebuilt = AutoModelForCausalLM.from_pretrained(out).state_dict()
    saved = model.state_dict()
    assert saved.keys() == rebuilt.keys()
    assert all(torch.equal(saved[k], rebuilt[k]) for k in saved)
