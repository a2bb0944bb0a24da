"""The tables, verdicts and plot of `seedflood reproduce`, from its run directories only.

Owns: DIR/reproduce.md (the generated section), DIR/reproduce.csv, DIR/reproduce.png, and the
generated section of a results file (docs/results.md): the text between BEGIN and END is
replaced, everything outside it is left as it is (a file without the markers gets them appended).
The plot is copied next to that file as results/reproduce.png.

Every row carries its step count and the binomial standard error of its accuracy on the n test
examples, s.e. = sqrt(p(1 - p) / n). Two runs are told apart only when their accuracies differ by
more than 2 standard errors of the difference, sqrt(s.e.a² + s.e.b²) (independent test
scorings: a conservative bound, since both score the same examples); otherwise the verdict is
"not enough steps to tell". Rows come from compare_report.run_row (the run-directory contract).

Assumes: DIR/plan.json written by reproduce.py; matplotlib (Agg, no pyplot state).
"""

from __future__ import annotations

import csv
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seedflood.experiments import compare_report
from seedflood.experiments.reproduce_plan import ALGS16, HOPS, SCALE_N, Plan, load_plan
from seedflood.rundir.atomic import atomic_write_text

BEGIN = "<!-- seedflood reproduce: generated section, begin (rewritten by the command; edit outside) -->"
END = "<!-- seedflood reproduce: generated section, end -->"
PNG = "reproduce.png"
Row = dict[str, Any]


def rows(out: Path, plan: Plan, n_test: int) -> dict[str, Row]:
    """name -> compare_report.run_row of the run plus name, groups, se, zero-shot accuracy and the spec."""
    table = {}
    for spec in plan.runs:
        run_dir = out / spec.name / spec.algorithm
        row = compare_report.run_row(run_dir) if run_dir.is_dir() else {"status": "not run", "accuracy": None}
        summary = compare_report.read_json(run_dir / "summary.json") or {}
        zero = summary.get("zero_shot") if isinstance(summary.get("zero_shot"), dict) else {}
        p = row.get("accuracy")
        row.update(
            name=spec.name,
            spec=spec,
            n_test=n_test,
            se=math.sqrt(p * (1 - p) / n_test) if p is not None and n_test else None,
            zero_shot=compare_report.number(zero.get("accuracy")),
        )
        row["steps"] = row.get("steps") or None
        table[spec.name] = row
    return table


def acc(row: Row | None) -> str:
    if row is None or row.get("accuracy") is None:
        return "-"
    return f"{row['accuracy']:.3f} ± {row['se']:.3f}"


def _status(row: Row) -> str:
    return (row["status"] + (f": {row['error']}" if row.get("error") else "")).replace("|", "\\|")


def _steps(row: Row, planned: int) -> str:
    return str(row["steps"]) if row.get("steps") else f"({planned} planned)"


def differ(a: Row | None, b: Row | None) -> tuple[float, float] | None:
    """(a − b, its standard error) when both ran; None otherwise."""
    if not a or not b or a.get("accuracy") is None or b.get("accuracy") is None:
        return None
    return a["accuracy"] - b["accuracy"], math.hypot(a["se"], b["se"])


def missing(*runs: Row | None) -> str:
    """Why a verdict has no numbers: a run outside the plan, or planned and not finished."""
    if any(r is None for r in runs):
        return "not run (not in this plan)"
    return "not run yet (planned; no finished run directory)"


def at_least(a: Row | None, b: Row | None, what: str) -> str:
    """Verdict on 'a ≥ b' (what names it)."""
    d = differ(a, b)
    if d is None:
        return f"{what}: {missing(a, b)}"
    diff, se = d
    text = f"Δ = {diff:+.3f} ± {se:.3f}"
    if diff > 2 * se:
        return f"{what}: **yes** ({text})"
    if diff < -2 * se:
        return f"{what}: **no** ({text})"
    return f"{what}: **not enough steps to tell** ({text}, within 2 standard errors)"


def hops_verdict(t: dict[str, Row]) -> str:
    what = "4+ hops per step ≈ the diameter"
    diam, four = t.get("ring16-seedflood"), t.get("hops4-seedflood")
    d4 = differ(four, diam)
    if d4 is None:
        return f"{what}: {missing(four, diam)}"
    if abs(d4[0]) > 2 * d4[1]:
        return f"{what}: **no** (4 hops Δ = {d4[0]:+.3f} ± {d4[1]:.3f} against the diameter)"
    few = [(h, differ(t.get(f"hops{h}-seedflood"), diam)) for h in (1, 2)]
    worse = [h for h, d in few if d is not None and d[0] < -2 * d[1]]
    text = f"4 hops Δ = {d4[0]:+.3f} ± {d4[1]:.3f}"
    if worse:
        return f"{what}: **yes** ({text}, while {', '.join(map(str, worse))} hop(s) score lower beyond 2 s.e.)"
    return f"{what}: **not enough steps to tell** ({text}; no hop count separates from the diameter)"


def verdicts(t: dict[str, Row]) -> list[str]:
    sf = t.get("ring16-seedflood")
    lines = [
        at_least(sf, t.get("ring16-dzsgd"), "SeedFlood ≥ DZSGD (16, ring)"),
        at_least(sf, t.get("ring16-choco-lora"), "SeedFlood ≥ ChocoSGD-LoRA (16, ring)"),
        at_least(t.get("ring128-seedflood"), sf, "SeedFlood at 128 clients ≥ at 16 (equal steps)"),
        hops_verdict(t),
    ]
    if sf and sf.get("accuracy") is not None and sf.get("zero_shot") is not None:
        gain = sf["accuracy"] - sf["zero_shot"]
        lines.append(
            f"Training itself: SeedFlood (16, ring) moved accuracy {gain:+.3f} from its zero-shot "
            f"{sf['zero_shot']:.3f} in {sf['steps']} steps (s.e. {sf['se']:.3f})."
        )
    return lines


def _drop_empty(lines: list[str]) -> list[str]:
    """Each table (a bold title, a blank, a header, a rule, rows) without rows becomes one line."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("**(") and (i + 4 >= len(lines) or not lines[i + 4].startswith("|")):
            out += [lines[i] + ": not in this plan.", ""]
            i += 5 if i + 4 < len(lines) else len(lines)
            continue
        out.append(lines[i])
        i += 1
    return out


def tables(t: dict[str, Row], plan: Plan) -> list[str]:
    return _drop_empty(_tables(t, plan))


def _tables(t: dict[str, Row], plan: Plan) -> list[str]:
    s = plan.steps
    dsgd = t.get("ring16-dsgd")
    ref = dsgd.get("accuracy") if dsgd else None
    out = [
        "**(1) 16 clients, ring and 4×4 torus** (accuracy / DSGD's on the ring, as the paper normalises)",
        "",
        "| algorithm | graph | steps | accuracy ± s.e. | / DSGD (ring) | AUC | bytes per edge | wall | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    sixteen = [t[f"{g}-{a}"] for g in ("ring16", "torus16") for a in ALGS16 if f"{g}-{a}" in t]
    for r in sixteen:
        norm = f"{r['accuracy'] / ref:.3f}" if ref and r.get("accuracy") is not None else "-"
        out.append(
            f"| {r['spec'].algorithm} | {r['name'].split('-')[0]} | {_steps(r, s)} | {acc(r)} | {norm} | "
            f"{compare_report.md_cell('auc', r)} | {compare_report.md_cell('bytes_per_edge', r)} | "
            f"{compare_report.md_cell('wall_seconds', r)} | {_status(r)} |"
        )
    out += [
        "",
        "**(2) clients at equal steps (ring)**",
        "",
        "| algorithm | clients | steps | accuracy ± s.e. | status |",
    ]
    out.append("|---|---|---|---|---|")
    for alg in ("seedflood", "dsgd", "dzsgd", "choco"):
        for n in (16, *SCALE_N):
            r = t.get(f"ring{n}-{alg}")
            if r is not None and ("scale" in r["spec"].groups):
                out.append(f"| {alg} | {n} | {_steps(r, s)} | {acc(r)} | {_status(r)} |")
    out += ["", "**(3) hops per step** (SeedFlood, 16 on a ring, diameter 8)", ""]
    out += ["| hops per step | steps | accuracy ± s.e. | bytes per edge | status |", "|---|---|---|---|---|"]
    for h in HOPS:
        r = t.get("ring16-seedflood" if h == 8 else f"hops{h}-seedflood")
        if r is not None and "hops" in r["spec"].groups:
            label = "8 = diameter" if h == 8 else str(h)
            out.append(
                f"| {label} | {_steps(r, s)} | {acc(r)} | {compare_report.md_cell('bytes_per_edge', r)} | {_status(r)} |"
            )
    out += ["", "**(4) SubCGE rank and refresh period** (SeedFlood, 16 on a ring)", ""]
    out += ["| run | steps | accuracy ± s.e. | status |", "|---|---|---|---|"]
    for r in t.values():
        if "subcge" in r["spec"].groups:
            label = "the config's rank and refresh" if r["name"] == "ring16-seedflood" else r["name"].split("-")[0]
            out.append(f"| {label} | {_steps(r, s)} | {acc(r)} | {_status(r)} |")
    return out


def plot(t: dict[str, Row], path: Path) -> None:
    """Four panels: (1) accuracy / DSGD at 16 clients, (2) accuracy against clients, (3) against
    hops per step, (4) SubCGE runs; error bars are ±1 standard error."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = {k: r for k, r in t.items() if r.get("accuracy") is not None}
    fig = Figure(figsize=(11, 8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    ax = axes[0][0]
    sixteen = [ok[f"{g}-{a}"] for g in ("ring16", "torus16") for a in ALGS16 if f"{g}-{a}" in ok]
    ax.bar(range(len(sixteen)), [r["accuracy"] for r in sixteen], yerr=[r["se"] for r in sixteen], capsize=3)
    ax.set_xticks(range(len(sixteen)), [r["name"] for r in sixteen], rotation=60, ha="right", fontsize="small")
    ax.set_title("(1) 16 clients"), ax.set_ylabel("test accuracy")
    ax = axes[0][1]
    for alg in ("seedflood", "dsgd", "dzsgd", "choco"):
        pts = [(n, ok[f"ring{n}-{alg}"]) for n in (16, *SCALE_N) if f"ring{n}-{alg}" in ok]
        pts = [(n, r) for n, r in pts if "scale" in r["spec"].groups]
        if pts:
            ax.errorbar([n for n, _ in pts], [r["accuracy"] for _, r in pts], [r["se"] for _, r in pts], marker="o",
                        label=alg, color=compare_report.color(alg), capsize=3)  # fmt: skip
    ax.set_xscale("log", base=2), ax.set_title("(2) clients at equal steps"), ax.set_xlabel("clients")
    ax.set_xticks([16, *SCALE_N], [str(n) for n in (16, *SCALE_N)])
    ax = axes[1][0]
    pts = [(h, ok.get("ring16-seedflood" if h == 8 else f"hops{h}-seedflood")) for h in HOPS]
    pts = [(h, r) for h, r in pts if r is not None and "hops" in r["spec"].groups]
    if pts:
        ax.errorbar([h for h, _ in pts], [r["accuracy"] for _, r in pts], [r["se"] for _, r in pts], marker="o",
                    capsize=3)  # fmt: skip
    ax.set_xscale("log", base=2), ax.set_title("(3) hops per step (8 = diameter)"), ax.set_xlabel("hops per step")
    ax.set_xticks(list(HOPS), [str(h) for h in HOPS])
    ax = axes[1][1]
    sub = [r for r in ok.values() if "subcge" in r["spec"].groups]
    ax.bar(range(len(sub)), [r["accuracy"] for r in sub], yerr=[r["se"] for r in sub], capsize=3)
    ax.set_xticks(range(len(sub)), [r["name"].split("-")[0] for r in sub], rotation=30, fontsize="small")
    ax.set_title("(4) SubCGE rank / refresh (ring16 = the config's)")
    for a in axes.flat:
        a.grid(True, alpha=0.3)
        if not a.has_data():
            a.text(0.5, 0.5, "not run", ha="center", va="center", transform=a.transAxes)
    if axes[0][1].has_data():
        axes[0][1].legend(fontsize="small")
    fig.savefig(path, dpi=110)


def section(out: Path, t: dict[str, Row], plan: Plan, body: dict[str, Any], png: str) -> str:
    """The generated Markdown (between the markers)."""
    a = body["args"]
    wall = sum(r.get("wall_seconds") or 0.0 for r in t.values())
    machine = f"{a.get('cores')} cores, load average {a.get('load_average')} when planned"
    machine += f", GPU {a['gpu']}" if a.get("gpu") else ""
    done = sum(r.get("status") == "ok" for r in t.values())
    lines = [
        f"Command: `{a.get('command') or 'seedflood reproduce'}` on `{a['device']}` ({machine}).",
        f"Plan: {len(plan.runs)} runs of **{plan.steps} steps** each, expected {plan.total / 60:.1f} min; "
        f"{done} finished, {wall / 60:.1f} min of run wall time. Accuracy is on n = {t and next(iter(t.values()))['n_test']} "
        "test examples; ± is its binomial standard error.",
        "",
        *tables(t, plan),
        "",
        "**Against the paper's ordering** (told apart only beyond 2 standard errors of the difference):",
        "",
        *[f"- {v}" for v in verdicts(t)],
        "",
    ]
    if plan.left_out:
        lines += [f"Left out of this plan: {'; '.join(plan.left_out)}.", ""]
    lines += [f"![the grid's accuracies, ±1 s.e.]({png})", ""]
    return "\n".join(lines)


def splice(text: str, generated: str, heading: str = "## The paper's grid (`seedflood reproduce`)") -> str:
    """`text` with the part between BEGIN and END replaced (appended with `heading` if absent)."""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        return f"{head}{BEGIN}\n{generated}{END}{rest.split(END, 1)[1]}"
    return f"{text.rstrip()}\n\n{heading}\n\n{BEGIN}\n{generated}{END}\n"


def write_csv(path: Path, t: dict[str, Row]) -> None:
    fields = ["name", "algorithm", "clients", "steps", "accuracy", "se", "n_test", "zero_shot", "auc", "status"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in t.values():
            w.writerow({**{k: ("" if r.get(k) is None else r.get(k)) for k in fields}, "algorithm": r["spec"].algorithm,
                        "clients": r["spec"].clients})  # fmt: skip


def report(out: Path, results_md: Path | None, echo: Callable[[str], None] = print) -> dict[str, Row]:
    """Write DIR/reproduce.{md,csv,png} and the generated section of `results_md` (None: none)."""
    plan, body = load_plan(out)
    t = rows(out, plan, int(body["costs"]["test"]))
    write_csv(out / "reproduce.csv", t)
    plot(t, out / PNG)
    atomic_write_text(out / "reproduce.md", section(out, t, plan, body, PNG))
    if results_md is not None:
        (results_md.parent / "results").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / PNG, results_md.parent / "results" / PNG)
        old = results_md.read_text() if results_md.is_file() else "# Results\n"
        atomic_write_text(results_md, splice(old, section(out, t, plan, body, f"results/{PNG}")))
    echo(
        f"reproduce: wrote {out / 'reproduce.md'}, reproduce.csv, {PNG}" + (f" and {results_md}" if results_md else "")
    )
    return t
