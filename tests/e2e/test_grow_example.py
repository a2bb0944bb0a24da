"""docs/churn.md's "A run that grows" (4 clients, 2 new ids mid-run, a kill, one hash) stays
runnable: its bash block is checked against the code here in a second (valid bash; its settings
load and open exactly the ids it starts; the node it kills is a founder; the status record and
summary it reads are where the run writes them; what it shows as printed fits the run), and
`--runslow` runs the block as written (2.5-4.6 minutes and ~100 CPU-seconds on 2 loaded cores:
too dear for CI, where tests/dist/test_join_gloo.py, test_churn_slurm.py and
test_compose_churn.py run joins)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

import e2e_support as sup
from seedflood.core.config import runconfig
from seedflood.rundir.layout import RunDir
from seedflood.rundir.status import status_name

pytestmark = pytest.mark.e2e
DOC = sup.REPO / "docs" / "churn.md"
SECTION = "## A run that grows"


def blocks() -> tuple[str, str]:
    """The section's bash block (the commands) and the block after it (what they printed)."""
    text = DOC.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    fenced = re.findall(r"```(\w*)\n(.*?)```", text, re.S)
    assert [lang for lang, _ in fenced] == ["bash", ""], fenced
    return fenced[0][1], fenced[1][1]


def settings(script: str) -> list[str]:
    """The SETS the block gives every process, as `--set` values."""
    (line,) = [x for x in script.splitlines() if x.startswith("SETS=")]
    (value,) = shlex.split(line.split("=", 1)[1])  # SETS="..."
    words = value.split()  # unquoted $SETS: bash splits it on blanks
    assert words[::2] == ["--set"] * (len(words) // 2), words
    return words[1::2]


def test_the_block_is_bash_that_parses() -> None:
    script, _ = blocks()
    r = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_the_block_opens_the_ids_it_starts_kills_a_founder_and_reads_what_the_run_writes() -> None:
    script, printed = blocks()
    cfg = runconfig.load(sup.DEBUG_CONFIG, settings(script))
    founders, open_to = cfg.topology.nodes, cfg.churn.max_nodes
    assert cfg.churn.settle >= 1 and "launch/churn.sh launch/configs/debug.yaml $SETS" in script
    (ids,) = re.findall(r"^for j in ([\d ]+); do$", script, re.M)
    new = [int(j) for j in ids.split()]
    assert new == list(range(founders, open_to)), (new, founders, open_to)  # every id the run is open to
    assert (
        "SEEDFLOOD_NODE=$j SEEDFLOOD_STORE=127.0.0.1:$STORE_PORT" in script
        and "export HF_HUB_OFFLINE=1 STORE_PORT=" in script
    )
    run = RunDir.of(cfg)
    (status,) = re.findall(r'open\("(runs/grow-demo/status/node-(\d+)\.json)"\)', script)
    assert Path(status[0]) == run.status / f"{status_name(int(status[1]))}.json"
    assert int(status[1]) < founders  # a founder, under churn.sh's agents: restarted, it rejoins
    assert f'open("{run.root / "summary.json"}")' in script and f"seedflood replay {run.root}" in script
    # what it printed: both newcomers joined, the victim rejoined, every client on the evaluator's hash
    lines = printed.splitlines()
    assert [re.search(r"node (\d+): (re)?joined by replaying", x).groups() for x in lines[:3]] == [
        (str(new[0]), None),
        (str(new[1]), None),
        (status[1], "re"),
    ]
    short, hashes, left = re.fullmatch(r"(\w{12}) \[(.*)\] \[\]", lines[3]).group(1, 2, 0)
    assert hashes.split(", ") == [f"'{short}'"] * (founders + len(new)) and left.endswith("[]")
    assert lines[4:] == [
        f"run directory: {run.root}",
        f"replayed:      {cfg.run.steps} logged steps applied to the base model",
        lines[6],
    ] and lines[6].startswith(f"param hash:    {short}")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_block_runs_as_written(entry: str) -> None:
    """The block itself, from the repository root (it writes runs/grow-demo*, gitignored): the
    lines it prints have the documented shape, with six equal hashes and nobody left."""
    if entry != "seedflood":
        pytest.skip("churn needs the real `seedflood train` (the probe has no churn)")
    if not (sup.REPO / ".venv" / "bin" / "python").exists():
        pytest.skip("the block runs .venv/bin/python: make install first")
    script, _ = blocks()
    r = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, cwd=sup.REPO, env=sup.launcher_env(), timeout=880
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    joined = sorted(re.search(r"node (\d+): (re)?joined by replaying", x).groups() for x in lines[:3])
    assert joined == [("2", "re"), ("4", None), ("5", None)], r.stdout
    short = lines[3][:12]
    assert lines[3] == f"{short} [{', '.join([repr(short)] * 6)}] []", r.stdout
    assert lines[5] == "replayed:      600 logged steps applied to the base model" and lines[6].startswith(
        f"param hash:    {short}"
    ), r.stdout
