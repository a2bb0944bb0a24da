"""`seedflood status RUN --store HOST:PORT`: what a churn run's rendezvous store says of its
processes beside their status records (latest incarnations, restarts and new ids waiting for a
sponsor or sponsored), read without writing a key; one line and exit 1 for a store that cannot
be reached, exit 2 for an address that is not HOST:PORT. Against a real TCPStore in this process,
keyed as the launched clients key it (comm/rendezvous.py)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import torch.distributed as dist
from test_watch import rec, run_dir

from seedflood.cli import main
from seedflood.comm import rendezvous, storeview
from seedflood.comm.runtime import RUN_PREFIX, free_port


@pytest.fixture
def store() -> tuple[str, dist.TCPStore, dist.PrefixStore]:
    """A run's store: founders 0, 1, 2 up; node 1 restarted twice and claimed by node 0; node 2
    restarted and not claimed yet; brand-new id 5 knocked."""
    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    run = dist.PrefixStore(RUN_PREFIX, master)
    for node in (0, 1, 2, 1, 1, 2):
        rendezvous.register(run, node)
    run.compare_set(rendezvous.sponsor_key(1, 3), "", "0")  # as EdgeSet.claim writes it
    rendezvous.register(run, 5)
    rendezvous.knock(run, 5, 1)
    return f"127.0.0.1:{port}", master, run


def test_the_store_shows_who_waits_for_a_sponsor_and_writes_nothing(store, tmp_path, capsys) -> None:
    address, master, _ = store
    out = run_dir(tmp_path, rec(0), rec(1, incarnation=2), rec(2), rec(None, members=None))
    keys = master.num_keys()
    assert main(["status", str(out), "--json", "--store", address]) == 0
    view = json.loads(capsys.readouterr().out)["store"]
    assert view["address"] == address and view["knocks"] == 1
    procs = {p["node"]: p for p in view["processes"]}
    assert sorted(procs) == [0, 1, 2, 5]
    assert procs[0] == {"node": 0, "incarnation": 1, "sponsor": None, "knocked": False, "waiting": False}
    assert procs[1] == {"node": 1, "incarnation": 3, "sponsor": 0, "knocked": False, "waiting": False}
    assert procs[2] == {"node": 2, "incarnation": 2, "sponsor": None, "knocked": False, "waiting": True}
    assert procs[5] == {"node": 5, "incarnation": 1, "sponsor": None, "knocked": True, "waiting": True}
    assert main(["status", str(out), "--store", address]) == 0
    text = capsys.readouterr().out
    assert f"store {address}: latest incarnations 0:1 1:3 2:2 5:1; 1 knock of new ids" in text
    assert "  node 1: incarnation 3 restarted, sponsored by node 0; no status record of it yet" in text
    assert "  node 2: incarnation 2 restarted, waiting for a sponsor; no status record of it yet" in text
    assert "  node 5: incarnation 1 knocked (a new id), waiting for a sponsor; no status record of it yet" in text
    assert "node 0:" not in text.split("store ")[1]  # its first life, shown by its record: no line
    assert master.num_keys() == keys  # read-only: not a key added


def test_a_store_that_is_down_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(storeview, "READ_TIMEOUT_S", 0.5)
    out = run_dir(tmp_path, rec(0), rec(None, members=None))
    address = f"127.0.0.1:{free_port()}"  # nobody listens there
    assert main(["status", str(out), "--store", address]) == 1
    text = capsys.readouterr().out
    (line,) = [x for x in text.splitlines() if address in x]
    assert line.startswith(f"unreadable: store {address}: unreachable")
    assert main(["status", str(out), "--json", "--store", address]) == 1
    view = json.loads(capsys.readouterr().out)
    assert view["store"] is None and any("unreachable" in p for p in view["problems"])


def test_an_address_that_is_not_host_port_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    out = run_dir(tmp_path, rec(0))
    assert main(["status", str(out), "--store", "localhost"]) == 2
    assert "not HOST:PORT" in capsys.readouterr().err
