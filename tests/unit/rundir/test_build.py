"""build.py: the build a run records (build.json) and the refusal of a process on another one.

- a new run records this process's build; a resume on the same build continues, on another one
  (each compared key in turn) it is refused in one line naming both, and nothing is written;
- a run recorded before builds were (a log, no build.json) continues with a one-line notice and
  is recorded from its logged steps on;
- what is only recorded (python, the package digest) never refuses; SEEDFLOOD_ANY_BUILD=1 turns a
  refusal into a warning; a damaged build.json is a one-line CheckpointError;
- through `seedflood simulate`: a resume on an edited record exits 2 in one line, the same build
  resumes onto the uninterrupted run's hash, and an old run (build.json removed) resumes too.
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

import runs
from seedflood import cli
from seedflood.rundir import build
from seedflood.rundir.layout import CheckpointError, RunDir

torch.set_num_threads(1)


def mine() -> dict:
    return build.current("cpu", "float32")


def run_with_log(tmp_path) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    run.log.write_bytes(b"")  # settle reads only whether a log exists
    return run


def test_current_names_the_versions_and_the_arithmetic():
    b = mine()
    assert b["torch"] == torch.__version__ and b["threads"] == 1 and b["device"] == "cpu"
    assert b["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert all(b[name] for name in ("seedflood", "numpy", "transformers", "gguf", "python"))
    assert len(b["packages"]) == 16 and b == mine()  # measured the same way twice


def test_a_new_run_records_its_build_and_the_same_build_resumes(tmp_path):
    run = RunDir(tmp_path / "run")
    assert build.settle(run, mine(), 0) == mine() == build.read(run)
    run.log.write_bytes(b"")
    assert build.settle(run, mine(), 3) == mine()


@pytest.mark.parametrize("key", build.COMPARED)
def test_a_resume_on_another_build_is_refused_in_one_line_naming_both(tmp_path, key):
    run = run_with_log(tmp_path)
    recorded = {**mine(), "gpu": "H200, CUDA 13.0"}
    build.write(run, recorded)
    other = {**recorded, key: "other"}
    with pytest.raises(CheckpointError) as e:
        build.settle(run, other, 3)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{run.root} was made by another build: ")
    assert build.show(recorded) in line and build.show(other) in line
    assert f"differs: {key} ({json.loads(json.dumps(recorded[key]))} -> other)" in line
    assert build.read(run) == recorded  # nothing written


@pytest.mark.parametrize("key", ["python", "packages"])
def test_what_is_only_recorded_never_refuses(tmp_path, key):
    run = run_with_log(tmp_path)
    build.write(run, mine())
    assert build.settle(run, {**mine(), key: "other"}, 3) == mine()


def test_a_run_recorded_before_builds_resumes_with_a_notice(tmp_path, caplog):
    run = run_with_log(tmp_path)
    with caplog.at_level(logging.WARNING, logger="seedflood.rundir.build"):
        got = build.settle(run, mine(), 3)
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and "records no build" in notes[0] and "from step 3" in notes[0], notes
    assert got == build.read(run) == {**mine(), "from_step": 3}


def test_the_escape_hatch_warns_instead(tmp_path, monkeypatch, caplog):
    run = run_with_log(tmp_path)
    build.write(run, mine())
    monkeypatch.setenv(build.ALLOW, "1")
    with caplog.at_level(logging.WARNING, logger="seedflood.rundir.build"):
        assert build.refusal(build.read(run), {**mine(), "threads": 2}, "x") is None
    assert "another build" in caplog.text and build.ALLOW in caplog.text


def test_a_damaged_record_is_one_line(tmp_path):
    run = run_with_log(tmp_path)
    (run.root / build.BUILD).write_text("{not json")
    with pytest.raises(CheckpointError, match="build.json: not readable as JSON"):
        build.settle(run, mine(), 3)


def simulate(out, steps: int, capsys) -> tuple[int, str]:
    """`seedflood simulate` of the debug config for `steps` steps into `out`: exit status, stderr."""
    sets = [f"run.out_dir={out}", f"run.steps={steps}", "eval.every=0", "checkpoint.every=0"]
    code = cli.main(["simulate", "--config", str(runs.DEBUG), *[a for s in sets for a in ("--set", s)]])
    return code, capsys.readouterr().err


def files(out) -> dict:
    return {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.timeout(300)
def test_simulate_refuses_an_edited_build_and_resumes_the_same_or_an_unrecorded_one(tmp_path, capsys, caplog):
    assert simulate(tmp_path / "straight", 6, capsys)[0] == 0
    want = json.loads((tmp_path / "straight" / "summary.json").read_text())["param_hash"]
    out, old = tmp_path / "run", tmp_path / "old"
    assert simulate(out, 3, capsys)[0] == 0
    shutil.copytree(out, old)
    recorded = build.read(RunDir(out))
    assert recorded == mine()
    (out / build.BUILD).write_text(json.dumps({**recorded, "cpu_capability": "ZVECTOR"}))
    before = files(out)
    code, err = simulate(out, 6, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("seedflood: error: "), err
    assert "was made by another build" in lines[0] and "cpu_capability (ZVECTOR -> " in lines[0]
    assert files(out) == before
    # the control: the run's own build resumes, onto the uninterrupted run's bits
    (out / build.BUILD).write_text(json.dumps(recorded))
    assert simulate(out, 6, capsys)[0] == 0
    assert json.loads((out / "summary.json").read_text())["param_hash"] == want
    # a run made before build.json existed resumes too, with its notice, recorded from step 3 on
    (old / build.BUILD).unlink()
    with caplog.at_level(logging.WARNING, logger="seedflood.rundir.build"):
        assert simulate(old, 6, capsys)[0] == 0
    assert [r.getMessage() for r in caplog.records if "records no build" in r.getMessage()], caplog.text
    assert json.loads((old / "summary.json").read_text())["param_hash"] == want
    assert build.read(RunDir(old)) == {**mine(), "from_step": 3}


def test_a_run_that_mixes_kinds_of_cpu_lets_only_the_kind_differ(tmp_path):
    """trust.audit_tolerance > 0 (docs/trust.md, Mixed hardware): another CPU capability or
    thread count is not refused, another library still is; without it both are (the control)."""
    run = run_with_log(tmp_path)
    build.write(run, mine())
    kind = {**mine(), "cpu_capability": "DEFAULT", "threads": 2}
    assert build.refusal(build.read(run), kind, "x", mixed=True) is None
    assert build.settle(run, kind, 3, mixed=True) == mine()
    assert "cpu_capability (" in (build.refusal(build.read(run), kind, "x") or "")
    line = build.refusal(build.read(run), {**kind, "torch": "other"}, "x", mixed=True)
    assert line is not None and "torch (" in line and "cpu_capability" not in line
