"""The command line as a user meets it: bad input fails before training (one line on stderr, exit
status 2, nothing written); check, replay and eval print a summary (--json for scripts); scoring
shows progress; a closed pipe ends quietly."""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
DEBUG = str(ROOT / "launch" / "configs" / "debug.yaml")


def seedflood(*args: str, env: dict[str, str] | None = None, **run: Any) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.run(
        [sys.executable, "-m", "seedflood", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**base, "HF_HUB_OFFLINE": "1", **(env or {})},
        **run,
    )


def one_error_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("seedflood: error: "), p.stderr
    return lines[0]


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.mark.parametrize(
    "sets, words",
    [
        (["task.name=nope"], "unknown task 'nope'"),
        (["model.name=/nonexistent/model"], "/nonexistent/model"),
        (["topology.kind=file", "topology.file=missing.yaml"], "missing.yaml"),
        (["zo.lr=fast"], "zo.lr: must be a number"),
        (["zo.lrr=1"], "unknown key 'zo.lrr'"),
    ],
)
def test_train_rejects_bad_input_before_training(sets, words, out):
    args = ["train", "--config", DEBUG, "--set", f"run.out_dir={out}"]
    for s in sets:
        args += ["--set", s]
    line = one_error_line(seedflood(*args))
    assert words in line
    assert not out.exists()


@pytest.mark.parametrize("command", ["train", "world-size", "simulate"])
def test_one_client_is_refused_in_one_line(command, out):
    """`--set topology.nodes=1` was once accepted (a one-client "decentralized" run)."""
    p = seedflood(command, "--config", DEBUG, "--set", f"run.out_dir={out}", "--set", "topology.nodes=1")
    line = one_error_line(p)
    assert "topology.nodes: a decentralized run needs at least 2 clients, got 1" in line, line
    assert not out.exists()


@pytest.mark.parametrize("command", ["train", "world-size", "simulate"])
def test_a_bad_config_is_refused_before_torch_is_imported(command, out):
    """A refusal of the config itself (an unknown key, one client) comes before anything loads
    torch: a launcher's preflight or a typo answers in a fraction of a second, not ~2 s."""
    code = (
        "import sys; from seedflood import cli\n"
        f"rc = cli.main([{command!r}, '--config', {str(DEBUG)!r}, '--set', 'run.nosuch=1'])\n"
        "print(rc, 'torch' in sys.modules)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "unknown key 'run.nosuch'" in p.stderr
    assert p.stdout.split() == ["2", "False"], p.stdout + p.stderr


def test_malformed_topology_file(tmp_path, out):
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: 4\nedges: [[0, 1], [1, 1], [2, 3]]\n")
    line = one_error_line(
        seedflood(
            "train",
            "--config",
            DEBUG,
            "--set",
            f"run.out_dir={out}",
            "--set",
            "topology.kind=file",
            "--set",
            f"topology.file={bad}",
        )
    )
    assert "self loop" in line
    assert not out.exists()


def test_wrong_world_size_in_a_single_process(out):
    line = one_error_line(
        seedflood(
            "train",
            "--config",
            DEBUG,
            "--set",
            f"run.out_dir={out}",
            env={"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
        )
    )
    assert "world size 3 does not match" in line


def test_world_size_and_topology_show():
    p = seedflood("world-size", "--config", DEBUG, "--set", "topology.nodes=6")
    assert p.returncode == 0 and p.stdout.strip() == "7"
    p = seedflood("topology", "show", "torus:8x16")
    assert p.returncode == 0 and "diameter" in p.stdout and "128" in p.stdout
    one_error_line(seedflood("topology", "show", "moebius:8"))


@pytest.mark.parametrize(
    "sets, answer",
    [
        (["topology.nodes=100000"], "fewer than the 100000 clients"),  # the data refuses it, in one line
        (["topology.nodes=100000", "task.train_examples=100000"], "100001"),
        (["topology.nodes=100000", "topology.kind=random_regular"], "did not settle within 100,000,000 edge visits"),
        (["topology.nodes=20000", "topology.kind=erdos_renyi"], "above the 10000 an erdos_renyi draw may have"),
        (["topology.nodes=100000", "topology.kind=complete"], "4,999,950,000 edges is above the 250,000"),
        (["topology.nodes=10000", "topology.kind=complete"], "49,995,000 edges is above the 250,000"),
        (["topology.nodes=200000", "topology.kind=torus"], "topology torus400x500: 400,000 edges is above"),
    ],
    ids=["ring-data", "ring", "random_regular", "erdos_renyi", "complete", "complete-10000", "torus"],
)
def test_world_size_answers_in_seconds_for_100000_nodes(sets, answer):
    """The preflight ran past 300 s at 100000 nodes (all-pairs shortest paths for the diameter),
    and a complete graph of 100000 nodes grew past 12 GB (10000: a MemoryError after 41 s): now
    it answers, or refuses the size with one line naming the limit, within seconds.
    Counted in the command's own CPU seconds (user + sys), which other work on the machine does
    not inflate as it does wall time: about 5 s here, bounded at 40. Its address space is capped
    at 4 GiB, so a regression fails here instead of filling the machine's memory."""

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = seedflood("world-size", "--config", DEBUG, *[a for s in sets for a in ("--set", s)], preexec_fn=cap_memory)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    took = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if answer.isdigit():
        assert p.returncode == 0 and p.stdout.strip() == answer, p.stderr
    else:
        assert answer in one_error_line(p)
    assert took < 40, took


def test_replay_of_a_missing_run(tmp_path):
    assert "not a run directory" in one_error_line(seedflood("replay", str(tmp_path)))


@pytest.mark.parametrize(
    "sets, words",
    [
        (["zo.lr=.inf"], "zo.lr: must be a finite number"),
        (["zo.eps=.inf"], "zo.eps: must be a finite number"),
        (["transport.timeout_s=.inf"], "transport.timeout_s: must be a finite number"),
        (["zo.lr=.nan"], "zo.lr: must be a finite number"),
        (["model.tiny={hidden_size: -5}"], "hidden_size"),
        (["task.train_examples=2"], "task.train_examples=2 is fewer than the 4 clients"),
        (["task.test_examples=0"], "test"),
        (["flood.hops_per_step=1", "flood.step_window=1"], "flood.step_window"),
    ],
)
def test_world_size_rejects_values_that_used_to_fail_mid_run(sets, words, out):
    """The launchers' preflight: one line, exit 2, nothing written (no run directory)."""
    args = ["world-size", "--config", DEBUG, "--set", f"run.out_dir={out}"]
    for s in sets:
        args += ["--set", s]
    line = one_error_line(seedflood(*args))
    assert words in line, line
    assert not out.exists()


def test_world_size_rejects_a_bad_data_file_and_duplicate_keys(tmp_path, out):
    data = tmp_path / "train.csv"
    data.write_text("sentence,label\ngood film,1\nbad film,maybe\n")
    line = one_error_line(
        seedflood(
            "world-size",
            "--config",
            DEBUG,
            "--set",
            f"run.out_dir={out}",
            "--set",
            "task.name=sst2",
            "--set",
            f"task.data_files={{train: {data}, test: {data}}}",
        )
    )
    assert "maybe" in line or "label" in line
    dup = tmp_path / "dup.yaml"
    dup.write_text(Path(DEBUG).read_text() + "zo: {lr: 2.0}\n")
    line = one_error_line(seedflood("world-size", "--config", str(dup)))
    assert "duplicate key 'zo'" in line
    assert not out.exists()


def test_torchrun_launcher_stops_bad_values_before_any_process(out):
    """launch/torchrun.sh runs the preflight first: one line, exit 2, torchrun never starts."""
    p = subprocess.run(
        ["launch/torchrun.sh", DEBUG, "--set", f"run.out_dir={out}", "--set", "zo.lr=.inf"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHON": sys.executable},
    )
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines == [lines[0]] and "zo.lr: must be a finite number" in lines[0], p.stderr
    assert "torch.distributed.run" not in p.stderr
    assert not out.exists()


def test_torchrun_launcher_finds_the_project_venv_without_python_on_path(out):
    """With PYTHON unset and no venv on PATH, launch/torchrun.sh runs the repository's .venv
    (before: the first `python` on PATH, i.e. 'No module named seedflood')."""
    venv = ROOT / ".venv" / "bin" / "python"
    if not venv.exists():
        pytest.skip("no .venv in this checkout (make install creates it)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV")}
    env.update(PATH="/usr/bin:/bin", HF_HUB_OFFLINE="1")
    p = subprocess.run(
        ["launch/torchrun.sh", DEBUG, "--set", f"run.out_dir={out}", "--set", "zo.eps=.inf"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert p.returncode == 2 and "zo.eps: must be a finite number" in p.stderr, p.stderr


EXIT_SCRIPT = """
import sys, threading, time
from datetime import timedelta
import torch.distributed as dist
from seedflood.cli import exit_process

store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))

def blocked():  # in a C++ call (GIL released) that returns 0.5 s from now
    try:
        store.wait(["never"], timedelta(seconds=0.5))
    except Exception:
        pass

threading.Thread(target=blocked, name="seedflood-blocked", daemon=True).start()

class Slow:  # keeps the interpreter finalizing while the call returns
    def __del__(self, sleep=time.sleep):  # a default: module globals may be gone by then
        sleep(1.5)

slow = Slow()
time.sleep(0.1)
print("report written", flush=True)
exit_process(3)
"""


def test_the_exit_status_survives_a_thread_left_in_a_torch_call():
    """A daemon thread whose torch.distributed call returns while the interpreter finalizes
    makes a plain exit abort (SIGABRT: "terminate called without an active exception", seen on
    a stopped churn client in CI); `exit_process` ends the process with its own status and
    output, without finalizing."""
    p = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert p.returncode == 3, (p.returncode, p.stderr[-2000:])
    assert p.stdout == "report written\n" and "terminate called" not in p.stderr


# -- what check, replay and eval print -------------------------------------------------------------
@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> tuple[Path, dict, str]:
    """A finished debug run (simulate, in this process), its summary.json, and its stderr.

    Progress lines of a phase are lowered to one per batch (PHASE_LINE_EVERY_S = 0) so a
    6-step run's scorings, each well under a second, show them on this non-terminal stderr."""
    from seedflood import cli
    from seedflood.rundir import metrics

    out = tmp_path_factory.mktemp("cli") / "run"
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        mp.setattr(metrics, "PHASE_LINE_EVERY_S", 0.0)
        assert cli.main(["simulate", "--config", DEBUG, "--set", f"run.out_dir={out}"]) == 0
    return out, json.loads((out / "summary.json").read_text()), err.getvalue()


def fields(text: str) -> dict[str, str]:
    """`label:  value` lines as a dict; asserts the values start in one column."""
    lines = text.splitlines()
    assert lines, "no output"
    columns = {len(line) - len(line.split(":", 1)[1].lstrip()) for line in lines}
    assert len(columns) == 1, f"values not aligned:\n{text}"
    return {label: value.strip() for label, value in (line.split(":", 1) for line in lines)}


def not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


def test_check_prints_a_summary_and_json_on_request(simulated, capsys):
    from seedflood import cli

    out, _, _ = simulated
    assert cli.main(["check", str(out)]) == 0
    text = capsys.readouterr().out
    got = fields(text)
    assert not_json(text)
    assert got["run directory"] == str(out) and got["verdict"].startswith("OK")
    assert got["steps logged"] == "6" and got["checkpoints"] == "2 (step_000006, step_000003)"
    assert cli.main(["check", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "ok": True,
        "steps": 6,
        "checkpoints": ["step_000006", "step_000003"],
    }


def test_replay_prints_a_summary_and_json_on_request(simulated, capsys, tmp_path):
    from seedflood import cli

    out, summary, _ = simulated
    assert cli.main(["replay", str(out), "--out", str(tmp_path / "hf")]) == 0
    text = capsys.readouterr().out
    assert not_json(text)
    assert fields(text) == {
        "run directory": str(out),
        "replayed": "6 logged steps applied to the base model",
        "param hash": summary["param_hash"],
        "model directory": str(tmp_path / "hf"),
    }
    assert cli.main(["replay", str(out), "--step", "3", "--json"]) == 0
    three = json.loads(capsys.readouterr().out)
    assert (
        three["steps"] == 3 and three.keys() == {"steps", "param_hash"} and three["param_hash"] != summary["param_hash"]
    )


def test_eval_prints_a_summary_json_on_request_and_shows_its_progress(simulated, capsys, monkeypatch):
    from seedflood import cli
    from seedflood.rundir import metrics

    out, summary, _ = simulated
    final = summary["final"]
    monkeypatch.setattr(metrics, "PHASE_LINE_EVERY_S", 0.0)
    assert cli.main(["eval", str(out)]) == 0
    got = capsys.readouterr()
    assert not_json(got.out)
    f = fields(got.out)
    assert f["run directory"] == str(out) and f["scored"] == "the model after 6 logged steps, on 64 test examples"
    assert f["accuracy"].startswith(f"{final['accuracy']:.3f}  AUC {final['auc']:.3f}")
    assert f["loss"].startswith(f"{final['loss']:.4f}")
    # debug.yaml: 64 dev + 64 test examples, eval.batch_size 32: four batches, one line each, then the end
    lines = [ln for ln in got.err.splitlines() if ln.startswith("scoring step 6 (dev + test): ")]
    assert [ln.split(": ", 1)[1].split(" ", 1)[0] for ln in lines] == ["32/128", "64/128", "96/128", "128/128", "done,"]
    assert cli.main(["eval", str(out), "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m.keys() == {"steps", "n", "accuracy", "loss", "pred_frac", "auc", "threshold", "threshold_accuracy"}
    assert m["steps"] == 6 and m["n"] == 64
    assert (m["accuracy"], m["auc"], m["threshold_accuracy"]) == (
        final["accuracy"],
        final["auc"],
        final["threshold_accuracy"],
    )


def test_simulate_shows_the_progress_of_every_scoring(simulated):
    """The zero-shot, periodic and final scorings (the evaluator's) each report their examples."""
    err = simulated[2]
    for step in (0, 3, 6):
        counts = [ln.split(": ", 1)[1] for ln in err.splitlines() if ln.startswith(f"scoring step {step}: ")]
        assert counts[0].startswith("32/128 examples") and counts[-1].startswith("done, 128/128 examples in "), err


def test_a_failure_with_json_still_exits_2_with_one_line(tmp_path, capsys):
    from seedflood import cli

    for command in ("check", "replay", "eval"):
        assert cli.main([command, str(tmp_path), "--json"]) == 2
        got = capsys.readouterr()
        assert got.out == "" and got.err == f"seedflood: error: {tmp_path} is not a run directory (no log.bin)\n"


# -- a closed pipe -----------------------------------------------------------------------------------
def test_a_closed_pipe_ends_quietly_with_status_141():
    """`seedflood topology show ring:16 | head` ended in a BrokenPipeError traceback. The reader
    here closes its end before the command writes, so every write fails, as a `head` that has
    read enough: nothing on stderr, status 141 (128 + SIGPIPE, as a shell reports for `cat`)."""
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    p = subprocess.Popen(
        [sys.executable, "-m", "seedflood", "topology", "show", "torus:8x16"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**base, "HF_HUB_OFFLINE": "1"},
    )
    p.stdout.close()
    _, err = p.communicate(timeout=120)
    assert err == b"" and p.returncode == 141, err.decode()


def test_head_of_a_pipeline_gets_the_first_lines_and_no_traceback():
    p = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {sys.executable} -m seedflood topology show ring:16 | head -n 1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert p.stdout == "topology ring16\n" and p.stderr == "", p.stderr
    assert p.returncode in (0, 141)  # 141 when head was gone before the write, 0 when it came after


def test_a_broken_pipe_that_is_not_stdout_is_not_swallowed(monkeypatch):
    """Only a closed stdout ends quietly: a BrokenPipeError from elsewhere (a socket to a dead
    peer) still propagates, with stdout open."""
    from seedflood import cli

    def broken() -> int:
        raise BrokenPipeError("a socket to a peer that died")

    monkeypatch.setattr(cli, "main", broken)
    with pytest.raises(BrokenPipeError, match="peer that died"):
        cli.console()
