"""One GPU per process on the launched path, with the GPU count faked: launch/torchrun.sh with
`model.device=cuda` as a user runs it, every process under a fake torch.cuda of N GPUs
(fakecuda/sitecustomize.py on PYTHONPATH: tensors stay on the CPU; each process records the
devices it was asked to build on, the current device at that moment, and its rank).

What is checked against what `seedflood world-size --gpus N` prints (the plan, parsed from its
text): every rank built its model on the device the plan names, that device was its current one
before (torch.cuda.set_device came first) and still is at exit, the run ends with every client on
the evaluator's hash, and the evaluator says in one line when it shares a client's GPU.
Controls: the same launch with set_device made a no-op fails the check (the ranks off cuda:0
build with cuda:0 current), and the records of one placement fail against another's plan.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import e2e_support as sup

pytestmark = pytest.mark.e2e

FAKE = Path(__file__).resolve().parent / "fakecuda"
LINE = re.compile(r"^seedflood:   (?:host (\d+) )?(cuda:\d+|cpu): (.+)$")


def parse_plan(text: str) -> dict[int, str]:
    """rank -> device from the plan lines of `seedflood world-size` (one host)."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        device = m.group(2)
        for part in m.group(3).split(", "):
            if part == "evaluator":
                out[0] = device
                continue
            for span in part.removeprefix("clients ").removeprefix("client ").split(","):
                a, _, b = span.strip().partition("-")
                for node in range(int(a), int(b or a) + 1):
                    out[node + 1] = device
    return out


def planned(gpus: int, *overrides: str) -> tuple[dict[int, str], str]:
    """The plan of the debug config with model.device=cuda and `overrides` for `gpus` GPUs (the
    CLI's own, no fake)."""
    overrides = ("model.device=cuda", *overrides)
    p = subprocess.run(
        [sys.executable, "-m", "seedflood", "world-size", "--config", str(sup.DEBUG_CONFIG), "--gpus", str(gpus)]
        + [a for s in overrides for a in ("--set", s)],
        capture_output=True,
        text=True,
        timeout=120,
        env=sup.launcher_env(),
        cwd=sup.REPO,
    )
    assert p.returncode == 0 and p.stdout.strip() == "5", p.stderr
    return parse_plan(p.stderr), p.stderr


def records(out: Path) -> dict[int, dict]:
    """The launched ranks' records (the agent and the preflight have no rank)."""
    recs = [json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]
    return {r["rank"]: r for r in recs if r["rank"] is not None and "train" in r["argv"]}


def mismatches(recs: dict[int, dict], plan: dict[int, str]) -> list[str]:
    """Every way the ranks' records differ from the plan (empty: they match it)."""
    bad = [] if set(recs) == set(plan) else [f"ranks {sorted(recs)} recorded, the plan has {sorted(plan)}"]
    for rank, device in sorted(plan.items()):
        r = recs.get(rank)
        if r is None:
            continue
        if device == "cpu":
            bad += [f"rank {rank} (planned cpu) built on {m['device']}" for m in r["moves"]]
            continue
        if not r["moves"]:
            bad.append(f"rank {rank} built nothing on a GPU (planned {device})")
        for m in r["moves"]:
            if m["device"] != device or m["current"] != device:
                bad.append(f"rank {rank} built on {m['device']} with {m['current']} current (planned {device})")
        if r["current"] != device:
            bad.append(f"rank {rank} ended with {r['current']} current (planned {device})")
    return bad


def launch(tmp: Path, name: str, gpus: int, *overrides: str, **extra: str) -> tuple[dict[int, dict], str]:
    """launch/torchrun.sh on the debug config under a fake CUDA of `gpus` GPUs; the ranks'
    records and the launcher's log (it must exit 0)."""
    out, seen = tmp / name, tmp / f"{name}-cuda"
    seen.mkdir()
    env = sup.launcher_env(FAKE_CUDA_GPUS=str(gpus), FAKE_CUDA_OUT=str(seen), **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKE), env.get("PYTHONPATH")]))  # its sitecustomize first
    log = tmp / f"{name}.log"
    sets = sup.sets(f"run.out_dir={out}", "run.steps=6", "model.device=cuda", *overrides)
    sup.run_checked(["launch/torchrun.sh", str(sup.DEBUG_CONFIG), *sets], env=env, log=log, watch=[out / "log.bin"])
    sup.check_run(out)
    return records(seen), log.read_text()


@pytest.mark.timeout(900)
def test_each_rank_builds_on_the_gpu_the_plan_names(entry: str, tmp_path: Path) -> None:
    if entry != "seedflood":
        pytest.skip("the stand-in entry has no GPU plan")
    # 4 GPUs, eval.device unset: ranks 0..3 on cuda:0..3, client 3 (rank 4) beside the evaluator
    plan, text = planned(4)
    assert plan == {0: "cuda:0", 1: "cuda:1", 2: "cuda:2", 3: "cuda:3", 4: "cuda:0"}, text
    assert "notice: the evaluator shares cuda:0 with client 3" in text, text
    recs, log = launch(tmp_path, "shared", 4)
    assert mismatches(recs, plan) == [], recs
    assert all(r["set_device"] for r in recs.values()), recs
    assert "GPU plan: 5 processes on 1 host of 4 GPUs" in log  # the launcher's preflight said it
    assert re.search(r"\[eval\] WARNING .*the evaluator shares cuda:0 with client 3", log), sup.tail(log)

    # eval.device=own on 3 GPUs: the evaluator alone on cuda:0, the 4 clients two by two on 1 and 2
    own, text = planned(3, "eval.device=own")
    assert own == {0: "cuda:0", 1: "cuda:1", 2: "cuda:2", 3: "cuda:1", 4: "cuda:2"}, text
    assert "warning: 2 clients share cuda:1 (clients 0, 2)" in text, text
    recs_own, log = launch(tmp_path, "own", 3, "eval.device=own")
    assert mismatches(recs_own, own) == [], recs_own
    assert "the evaluator shares" not in log

    # controls: a wrong mapping, and processes that never set their device
    assert mismatches(recs, own) and mismatches(recs_own, plan)
    recs_unset, _ = launch(tmp_path, "unset", 4, FAKE_CUDA_IGNORE_SET_DEVICE="1")
    bad = mismatches(recs_unset, plan)
    assert any("rank 1 built on cuda:1 with cuda:0 current" in b for b in bad), bad
