"""`seedflood watch RUN`: the table (`--once`, or redrawn until every record is final), the merged
view as JSON (`--json`), exit 1 with a line per unreadable record, exit 2 with one line for a
path that is not a run directory. Over records written here (the launched run's records are
checked in tests/dist/test_train_gloo.py); in process, milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest

from churnlog import write_log
from seedflood.cli import main
from seedflood.rundir.layout import RunDir
from seedflood.rundir.status import FINISHED, RUNNING, STOPPED, Status, write_status

CHAIN = {s: f"{s:016x}" for s in range(6)}


def rec(node: int | None, **changes: object) -> Status:
    base = Status(
        role="client" if node is not None else "evaluator",
        node=node,
        incarnation=1,
        pid=4321,
        host="hostA",
        total=6,
        step=6,
        applied=5,
        committed=5,
        digests=dict(CHAIN),
        members=[0, 1, 2],
        peers=[1, 2] if node is not None else [],
        neighbours=[1, 2] if node is not None else [],
        sent=2048,
        received=1024,
        steps_per_s=3.0,
        sent_per_s=512.0,
        updated=time.time(),
        state=FINISHED,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def run_dir(tmp_path: Path, *records: Status) -> Path:
    for r in records:
        write_status(RunDir(tmp_path), r)
    return tmp_path


def test_once_prints_one_row_per_process_and_the_agreement(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = run_dir(tmp_path, rec(0), rec(1), rec(2), rec(None, members=None))
    assert main(["watch", str(out), "--once"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"all agree (step 5, digest {CHAIN[5]})" in lines[0]
    assert lines[1].split()[:4] == ["NAME", "STATE", "STEP", "STEP/S"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"node-0", "node-1", "node-2", "evaluator"}
    assert rows["node-1"][1:8] == ["finished", "6/6", "3.00", "5", CHAIN[5], "yes", "0,1,2"]
    assert "2/2" in rows["node-1"] and "hostA:4321" in rows["node-1"]


def test_json_is_the_merged_view(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    forked = {**CHAIN, 5: "f" * 16}
    out = run_dir(tmp_path, rec(0), rec(1, digests=forked), rec(2), rec(3, state=RUNNING, updated=time.time() - 60))
    assert main(["watch", str(out), "--json", "--stale", "20"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["run"] == str(out) and view["agree"] is False and view["odd"] == ["node-1"]
    by = {r["name"]: r for r in view["rows"]}
    assert by["node-1"]["agrees"] is False and by["node-0"]["agrees"] is True
    assert by["node-3"]["state"] == "stale" and by["node-3"]["agrees"] is None
    assert by["node-0"]["digest"] == CHAIN[5] and by["node-0"]["step"] == 6


def test_a_disagreement_and_a_stopped_client_show_in_the_table(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = run_dir(
        tmp_path,
        rec(0),
        rec(1, digests={**CHAIN, 5: "f" * 16}),
        rec(2),
        rec(3, state=STOPPED, reason="node 3: excluded at step 4", committed=3),
    )
    assert main(["watch", str(out), "--once"]) == 0
    text = capsys.readouterr().out
    assert "DISAGREE: node-1 differ" in text and "node-3: stopped: node 3: excluded at step 4" in text
    assert [line.split()[6] for line in text.splitlines() if line.startswith("node-1")] == ["NO"]


def test_an_unreadable_record_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = run_dir(tmp_path, rec(0))
    (out / "status" / "node-1.json").write_text('{"version": 1, "ro')
    assert main(["watch", str(out), "--once"]) == 1
    text = capsys.readouterr().out
    (line,) = [line for line in text.splitlines() if line.startswith("unreadable:")]
    assert line.startswith(f"unreadable: {out / 'status' / 'node-1.json'}: not JSON")
    assert line.endswith("torn or not a status record") and "node-0" in text
    assert main(["watch", str(out), "--json"]) == 1
    assert len(json.loads(capsys.readouterr().out)["problems"]) == 1


def test_not_a_run_directory_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["watch", str(tmp_path), "--once"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"seedflood: error: {tmp_path} is not a run directory (no status/, log.bin or config.yaml)"
    assert main(["watch", str(tmp_path), "--interval", "0"]) == 2


def test_without_once_it_redraws_until_every_record_is_final(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = run_dir(tmp_path, rec(0, state=RUNNING), rec(None, state=RUNNING))
    (out / "log.bin").write_bytes(b"")
    started = time.monotonic()

    def finish() -> None:
        time.sleep(0.2)
        write_status(RunDir(out), rec(0))
        write_status(RunDir(out), rec(None))

    t = threading.Thread(target=finish)
    t.start()
    assert main(["watch", str(out), "--interval", "0.05"]) == 0
    t.join()
    tables = capsys.readouterr().out.split("\n\n")
    assert len(tables) >= 2 and "running" in tables[0] and "running" not in tables[-1]
    assert time.monotonic() - started < 5


def test_the_redraws_end_once_the_evaluator_is_done_and_the_rest_final_or_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = run_dir(tmp_path, rec(0), rec(1, state=RUNNING, updated=time.time() - 60), rec(None))
    assert main(["watch", str(out), "--interval", "0.05"]) == 0  # node-1 was killed: it never finishes
    assert "stale" in capsys.readouterr().out


# -- `seedflood status`: the same view once, the incarnation, links, bytes per link, membership ---------
def churned(tmp_path: Path, **node1: object) -> Path:
    """A finished churn run's directory: the records, and a log in which node 3 left at step 2 and
    came back (incarnation 2) and node 4 joined at step 4 (tests/churnlog.py)."""
    edges = {0: (700, 650), 2: (300, 280), -1: (90, 0)}
    out = run_dir(
        tmp_path,
        rec(0),
        rec(1, peers=[0], neighbours=[0, 2], edges=edges, **node1),
        rec(2),
        rec(3, incarnation=2),
        rec(None),
    )
    write_log(out / "log.bin")
    return out


def test_status_prints_the_view_once_and_watch_once_is_the_same(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = churned(tmp_path)
    assert main(["status", str(out)]) == 0
    text = capsys.readouterr().out
    assert main(["watch", str(out), "--once"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == text.splitlines()[1:]  # but the time in the heading
    header, *rows = [line.split() for line in text.splitlines()[1:6]]
    by = {r[0]: r for r in rows}
    assert header[7:10] == ["MEMBERS", "INC", "LINKS"]
    assert by["node-3"][8:10] == ["2", "2/2"] and by["node-1"][8:11] == ["1", "1/2", "down:2"]
    assert "membership (log, 6 steps): 5 members 0-4; 2 joins, 1 leave (started with 0-3)" in text
    assert "  step 2: leave 3 (silent)\n  step 4: join 3 (incarnation 2), 4 (incarnation 1)" in text
    assert "members without a status record: 4" in text and "bytes per link" not in text


def test_edges_shows_each_clients_bytes_per_link(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = churned(tmp_path)
    assert main(["status", str(out), "--edges"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("bytes per link (peer:sent/received, ! = edge down now; ev: sent to the evaluator)")
    assert lines[at + 2] == "  node-1  0:700B/650B 2!:300B/280B ev:90B"
    assert lines[at + 1] == "  node-0  1:0B/0B 2:0B/0B"  # a record without per-edge counts: its links, no bytes


def test_status_json_has_the_links_and_the_membership(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = churned(tmp_path)
    assert main(["status", str(out), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    node1 = next(r for r in view["rows"] if r["name"] == "node-1")
    assert node1["links"] == [
        {"peer": 0, "up": True, "sent": 700, "received": 650},
        {"peer": 2, "up": False, "sent": 300, "received": 280},
    ]
    assert node1["sent_to_evaluator"] == 90 and node1["incarnation"] == 1
    m = view["membership"]
    assert (m["start"], m["members"], m["steps"], m["joins"], m["leaves"]) == ([0, 1, 2, 3], [0, 1, 2, 3, 4], 6, 2, 1)
    assert [c["step"] for c in m["changes"]] == [2, 4] and view["missing"] == [4]


def test_a_running_run_before_its_log_and_a_corrupt_log(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = run_dir(tmp_path, rec(0, state=RUNNING, step=2, committed=1), rec(None, state=RUNNING, step=2))
    assert main(["status", str(out), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["membership"] is None and [r["state"] for r in view["rows"]] == ["running", "running"]
    (out / "log.bin").write_bytes(b"garbage, not a log")
    assert main(["status", str(out)]) == 1
    assert f"unreadable: {out / 'log.bin'}: not a SeedFlood message log (bad magic)" in capsys.readouterr().out


def test_status_watch_redraws_until_the_run_ends(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = run_dir(tmp_path, rec(0), rec(1, state=RUNNING, updated=time.time() - 60), rec(None))
    assert main(["status", str(out), "--watch", "--interval", "0.05"]) == 0
    assert "stale" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["status", str(out), "--once"])  # --once is watch's; status prints once anyway
    assert "unrecognized arguments: --once" in capsys.readouterr().err
