"""`seedflood keys` and the signed run's preflight, as a user meets them: the key files and what
to do with them, and bad input refused in one line (status 2)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from seedflood import cli
from seedflood.comm import identity

DEBUG = str(Path(__file__).resolve().parents[3] / "launch" / "configs" / "debug.yaml")


def one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("seedflood: error: "), err
    return lines[0]


def test_keys_writes_a_key_per_node_and_says_where_each_file_goes(tmp_path, capsys):
    out = tmp_path / "k"
    assert cli.main(["keys", "--nodes", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert str(out / "roster.json") in printed and "every participant" in printed
    assert "node i only" in printed and f"--set trust.sign=true --set trust.keys={out}" in printed
    assert json.loads((out / "roster.json").read_text())["nodes"] == 3
    assert [stat.S_IMODE(identity.key_file(out, i).stat().st_mode) for i in range(3)] == [0o600] * 3


def test_keys_refuses_bad_counts_existing_keys_and_an_unwritable_directory_in_one_line(tmp_path, capsys):
    out = tmp_path / "k"
    assert cli.main(["keys", "--nodes", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    before = (out / "roster.json").read_bytes()
    assert "already holds keys: pass --force" in one_error_line(capsys, ["keys", "--nodes", "2", "--out", str(out)])
    assert (out / "roster.json").read_bytes() == before
    for n in ("0", "100001", "-3"):
        line = one_error_line(capsys, ["keys", "--nodes", n, "--out", str(tmp_path / "j")])
        assert "must be in 1..100000" in line
    assert not (tmp_path / "j").exists()
    (tmp_path / "file").write_text("")
    line = one_error_line(capsys, ["keys", "--nodes", "2", "--out", str(tmp_path / "file" / "k")])
    assert "cannot write keys to" in line
    assert cli.main(["keys", "--nodes", "2", "--out", str(out), "--force"]) == 0
    assert (out / "roster.json").read_bytes() != before


def test_world_size_checks_a_signed_runs_roster_against_its_clients(tmp_path, capsys):
    identity.write_keys(tmp_path / "k3", 3)
    identity.write_keys(tmp_path / "k4", 4)

    def world_size(*sets: str) -> list[str]:
        return ["world-size", "--config", DEBUG, *[a for s in sets for a in ("--set", s)]]

    line = one_error_line(capsys, world_size("trust.sign=true"))
    assert "trust.keys: needed when trust.sign is true" in line
    line = one_error_line(capsys, world_size("trust.sign=true", f"trust.keys={tmp_path / 'k3'}"))
    assert "holds 3 public keys, the run has 4 clients (seedflood keys --nodes 4" in line  # debug: 4 clients
    line = one_error_line(capsys, world_size("trust.sign=true", f"trust.keys={tmp_path / 'nowhere'}"))
    assert "cannot read the roster" in line
    (tmp_path / "k4" / "node-0.key").unlink()  # only the roster is checked: keys live on their nodes
    assert cli.main(world_size("trust.sign=true", f"trust.keys={tmp_path / 'k4'}")) == 0
    assert capsys.readouterr().out.strip() == "5"
    assert cli.main(world_size("trust.sign=true", f"trust.keys={tmp_path / 'k4' / 'roster.json'}")) == 0
    # open membership: a key for every id that may take part, the new ids' too (churn.max_nodes)
    opened = ("churn.settle=1", "churn.max_nodes=6", "trust.sign=true")
    line = one_error_line(capsys, world_size(*opened, f"trust.keys={tmp_path / 'k3'}"))
    assert "holds 3 public keys, the run has 4 clients and takes new ids up to 5 (churn.max_nodes) " in line
    assert "(seedflood keys --nodes 6 --out DIR)" in line
    identity.write_keys(tmp_path / "k6", 6)
    identity.write_keys(tmp_path / "k7", 7)
    line = one_error_line(capsys, world_size(*opened, f"trust.keys={tmp_path / 'k7'}"))
    assert "holds 7 public keys" in line
    for k in ("k4", "k6"):  # the founders' keys, and up to every id the run is open to
        assert cli.main(world_size(*opened, f"trust.keys={tmp_path / k}")) == 0
        assert capsys.readouterr().out.strip() == "5"  # the launch's world: the founders and the evaluator
