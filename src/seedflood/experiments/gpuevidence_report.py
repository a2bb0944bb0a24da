"""gpu-evidence's rows, report and plot (gpuevidence.py's plan; gpuevidence_run.py's folder).

Owns: reading what the plan's commands left into rows (`consensus` of a launched run's
summary.json, `reproduce_rows` of a `seedflood reproduce` directory: finished, failed, or cut at
the step its directory shows, never finished; `normalise` to DSGD; `sim_rows` of the bench
figure), evidence.md (`report`) and evidence.png (`plot`). Runs nothing.

Assumes: the run-directory contract (summary.json, metrics.jsonl, config.yaml) and reproduce's
plan.json; `seedflood bench --only sim`'s JSON figure (bench/sim.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from seedflood.experiments.gpuevidence_run import Ran, last_step, summary


def consensus(s: dict[str, Any] | None, steps: int, reached: int | None) -> dict[str, Any]:
    """A run's consensus figures from its summary.json, or where a cut run stopped."""
    if s is None:
        return {"finished": False, "cut_at_step": reached}
    hashes = s.get("client_hashes") or []
    return {
        "finished": s.get("steps") == steps,
        "steps": s.get("steps"),
        "hash": s.get("param_hash"),
        "clients": len(hashes),
        "clients_equal": bool(hashes) and all(h == s.get("param_hash") for h in hashes),
        "consensus": s.get("consensus"),
        "accuracy": (s.get("final") or {}).get("accuracy"),
        "wall_s": s.get("wall_seconds"),
    }


def reproduce_rows(out: Path, ran: Ran, algorithms: str) -> list[dict[str, Any]]:
    """One row per run of a reproduce directory: finished, failed, or cut at step S."""
    plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").is_file() else None
    if plan is None:
        return [{"algorithms": algorithms, "status": "no plan", "exit": ran.code}]
    rows = []
    for r in plan.get("runs", []):
        name, alg = r["name"], r["algorithm"]
        run_dir = out / name / alg
        s = summary(run_dir)
        row: dict[str, Any] = {"name": name, "algorithm": alg, "planned_steps": plan.get("steps")}
        if s is not None:
            acc = (s.get("final") or {}).get("accuracy")
            n = (s.get("final") or {}).get("examples") or test_examples(run_dir)
            row.update(status="finished", steps=s.get("steps"), accuracy=acc, wall_s=s.get("wall_seconds"))
            if acc is not None and n:
                row["stderr"] = math.sqrt(acc * (1 - acc) / n)
        elif run_dir.exists():
            row.update(status="cut" if ran.code is None else "failed", cut_at_step=last_step(run_dir))
        else:
            row.update(status="not started")
        rows.append(row)
    return rows


def test_examples(run_dir: Path) -> int | None:
    """task.test_examples of a run, from the config it recorded."""
    import yaml

    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    return ((yaml.safe_load(path.read_text()) or {}).get("task") or {}).get("test_examples")


def normalise(rows: list[dict[str, Any]]) -> None:
    """Accuracy over DSGD's, where DSGD finished (the paper's normalisation)."""
    dsgd = next((r for r in rows if r.get("algorithm") == "dsgd" and r.get("status") == "finished"), None)
    if dsgd and dsgd.get("accuracy"):
        for r in rows:
            if r.get("accuracy") is not None:
                r["vs_dsgd"] = r["accuracy"] / dsgd["accuracy"]


def report(fig: dict[str, Any]) -> str:
    """evidence.md: the figures as a short report (what evidence.json holds, for a reader)."""
    meta = fig.get("meta", {})
    lines = [f"# SeedFlood GPU evidence{' (dry run: CPU, tiny model)' if meta.get('dry') else ''}", ""]
    lines.append(
        f"Device: {meta.get('device_name')}; Python {meta.get('python')}, torch {meta.get('torch')}, "
        f"CUDA {meta.get('cuda')}, transformers {meta.get('transformers')}; seedflood {meta.get('commit')}; "
        f"TF32 {meta.get('tf32')}; budget {meta.get('budget_s')} s, spent {meta.get('spent_s')} s."
    )
    a = fig.get("a", {})
    if a:
        lines += ["", "## (a) The launched runtime", ""]
        for key in ("launched", "replay", "simulate", "churn"):
            if key in a:
                lines.append(f"- {key}: " + ", ".join(f"{k} {v}" for k, v in a[key].items()))
    b = fig.get("b", {})
    if b.get("sim"):
        lines += [
            "",
            "## (b) Batched engine: client-steps per second",
            "",
            "| clients | sequential | batched | floor | batched / floor | step / one client's |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sim_rows(b["sim"]):
            cells = [r.get(k) for k in ("sequential", "batched", "floor", "of_floor", "over_one_client")]
            lines.append(f"| {r['n']} | " + " | ".join(map(fmt, cells)) + " |")
    elif b:
        lines += ["", f"## (b) Batched engine: no figures (exit {b.get('exit')})"]
    c = fig.get("c", {})
    if c.get("runs"):
        lines += [
            "",
            "## (c) Tier 1, ring of 16",
            "",
            "| run | status | steps | accuracy | ± s.e. | / DSGD |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for r in c["runs"]:
            steps = (
                r.get("steps")
                if r.get("status") == "finished"
                else (f"cut at {r.get('cut_at_step')}" if r.get("status") == "cut" else "")
            )
            lines.append(
                f"| {r.get('algorithm', r.get('algorithms'))} | {r['status']} | {steps} | {fmt(r.get('accuracy'))} | {fmt(r.get('stderr'))} | {fmt(r.get('vs_dsgd'))} |"
            )
    return "\n".join(lines) + "\n"


def fmt(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, float) else ("" if x is None else str(x))


def sim_rows(sim: dict[str, Any]) -> list[dict[str, Any]]:
    """Per client count, from `seedflood bench --only sim`'s figure: client-steps per second of each
    side, the batched step's throughput as a share of the floor's (the goal: >= 0.8) and its time
    over one client's sequential step (the goal at 16 clients: <= 3)."""
    rows = []
    for e in sim.get("per_n", []):
        r: dict[str, Any] = {"n": e.get("n")}
        for side in ("sequential", "batched", "floor"):
            if e.get(f"{side}_client_steps_per_s"):
                r[side] = e[f"{side}_client_steps_per_s"]
        if e.get("batched_over_floor"):
            r["of_floor"] = 1 / e["batched_over_floor"]
        r["over_one_client"] = e.get("batched_over_one_client")
        r["skipped"] = e.get("skipped") or e.get("fallback")
        rows.append(r)
    return rows


def plot(fig: dict[str, Any], work: Path, path: Path) -> None:
    """evidence.png: (b) client-steps per second against clients; (c) test accuracy against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    rows = sim_rows((fig.get("b") or {}).get("sim") or {})
    for side in ("sequential", "batched", "floor"):
        pts = [(r["n"], r[side]) for r in rows if side in r]
        if pts:
            left.plot(*zip(*pts), marker="o", label=side)
    left.set(xlabel="clients", ylabel="client-steps / s", title="(b) simulate's estimates", xscale="log", yscale="log")
    left.legend() if rows else left.text(0.5, 0.5, "not measured", ha="center")
    for metrics in sorted(work.glob("c-*/*/*/metrics.jsonl")):
        pts = []
        for line in metrics.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "accuracy" in rec and "step" in rec:
                pts.append((rec["step"], rec["accuracy"]))
        if pts:
            right.plot(*zip(*sorted(pts)), marker=".", label=metrics.parent.name)
    right.set(xlabel="step", ylabel="test accuracy", title="(c) tier 1, ring of 16")
    if right.lines:
        right.legend()
    title = (fig.get("meta") or {}).get("device_name")
    f.suptitle(f"SeedFlood evidence on {title}")
    f.tight_layout()
    f.savefig(path, dpi=90)
    plt.close(f)
