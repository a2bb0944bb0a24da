"""A read-only log server (`seedflood serve-log`, roles/logserver.py, comm/logserve.py) and the
sponsor's catch-up after a prefix (roles/churn.py): what is served from a log still being
written, what a newcomer takes from it, and that a sponsor sends only the steps after a prefix
on its own chain and the whole log otherwise."""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from test_churn import cfg_for, protocol_of

from seedflood.comm import logserve
from seedflood.core.churn import prefix
from seedflood.core.flood import stepstream
from seedflood.core.flood.protocol import trajectory
from seedflood.core.wire.message import Message
from seedflood.ml.workload import Workload
from seedflood.roles.churnstart import ChurnStrategy
from seedflood.roles.client import Client
from seedflood.roles.logserver import LogSource, fetched
from seedflood.rundir.logfile import LogWriter


class _Connects:
    """What `Churn.rejoin` needs of a transport: `connect` (nothing is exchanged here)."""

    peers: tuple[int, ...] = ()

    def connect(self, peers, timeout_s=None):
        self.peers = (*self.peers, *peers)
        return list(peers)


@pytest.fixture(scope="module")
def run():
    """The debug torus of 8 (test_churn's config), its protocol, a workload and 7 decided steps."""
    cfg = cfg_for(steps=10)
    p = protocol_of(cfg)
    steps = [(s, [Message.make(o, s, p.seed(o, s), 0.01 * (o + 1)) for o in range(8)]) for s in range(7)]
    return cfg, p, Workload.build(cfg), steps


@pytest.fixture(scope="module")
def header(run):
    """The run's log header: what a served prefix must match."""
    cfg, p, w, _ = run
    return {"trajectory": trajectory(cfg, p, w.train_digest()), "base_hash": w.loaded.base_hash}


def client(run, inc: int = 0) -> Client:
    _, p, w, _ = run
    transport = _Connects()
    strategy = ChurnStrategy(transport, incarnation=inc)  # type: ignore[arg-type]
    return Client(3, (), p, w.direction, lambda _s: 0.0, transport, strategy=strategy)  # type: ignore[arg-type]


def served(steps) -> list[tuple[int, bytes]]:
    return [(s, stepstream.encode_step(msgs)) for s, msgs in steps]


def test_a_sponsor_sends_only_the_steps_after_a_prefix_on_its_chain_and_the_rejoin_ends_on_the_same_chain(run):
    _, p, _, steps = run
    sponsor = client(run)
    sponsor.resume(steps)
    applied = len(sponsor.churn.history)  # 7 - delay
    held = served(steps[:3])
    have = prefix.check(held, p)
    whole, after = sponsor.churn.catch_up(7, 7 + p.delay + 1, 2), sponsor.churn.catch_up(7, 8 + p.delay, 2, have)
    assert stepstream.CatchUp.from_bytes(after).base == 3
    assert [s for s, _ in stepstream.CatchUp.from_bytes(after).steps] == list(range(3, applied))
    # fewer bytes by exactly the prefix's step records (each: u32 step, u32 length, payload)
    assert len(whole) - len(after) == sum(8 + len(b) for _, b in held)
    full, partial = client(run, 2), client(run, 2)
    full.churn.rejoin(whole)
    partial.churn.rejoin(after, held)
    assert partial.churn.history == full.churn.history and len(partial.churn.history) == applied
    assert partial.churn.agreement.digests == full.churn.agreement.digests
    assert partial.churn.agreement.prev == full.churn.agreement.prev


def test_a_prefix_off_the_sponsors_chain_or_ahead_of_it_gets_the_whole_log_and_the_rejoin_leaves_it_out(run, caplog):
    _, p, _, steps = run
    sponsor = client(run)
    sponsor.resume(steps)
    forked = [*steps[:1], (1, [dataclasses.replace(steps[1][1][0], scalar=9.0), *steps[1][1][1:]]), steps[2]]
    ahead = served(steps)  # 7 steps: the sponsor applied fewer
    for held in (served(forked), ahead):
        blob = sponsor.churn.catch_up(7, 8 + p.delay, 2, prefix.check(held, p))
        assert stepstream.CatchUp.from_bytes(blob).base == 0
        fresh = client(run, 2)
        with caplog.at_level(logging.WARNING, logger="seedflood.roles"):
            fresh.churn.rejoin(blob, held)
        assert "sent its whole log: the log server's steps" in caplog.text
        assert fresh.churn.history == sponsor.churn.history
        assert fresh.churn.agreement.prev == sponsor.churn.agreement.digests[len(sponsor.churn.history) - 1]


def write_log(path, steps, header):
    writer = LogWriter(path, header)
    for s, msgs in steps:
        writer.append(s, msgs)
    writer.close()


def test_the_source_serves_whole_records_of_a_log_being_written_and_follows_it(run, header, tmp_path):
    _, p, _, steps = run
    source = LogSource(tmp_path / "run")  # a run directory its evaluator has not created yet
    with pytest.raises(logserve.Unavailable, match="no log at"):
        source()
    (tmp_path / "run").mkdir()
    path = tmp_path / "run" / "log.bin"
    write_log(path, steps[:3], header)
    with open(path, "ab") as f:
        f.write(b"\x03\x00\x00\x00\x10")  # step 3 being written: its record's first bytes only
    identity, got = prefix.decode(source())
    assert identity == header and got == served(steps[:3]) and source.torn == 5
    assert "steps 0..2" in source.describe() and "5 bytes of a record being written" in source.describe()
    with open(path, "r+b") as f:  # its writer cuts the torn tail and appends on
        f.truncate(path.stat().st_size - 5)
    writer = LogWriter(path, header)
    for s, msgs in steps[3:5]:
        writer.append(s, msgs)
    writer.close()
    assert prefix.decode(source())[1] == served(steps[:5]) and source.torn == 0
    assert prefix.check(prefix.decode(source())[1], p).step == 4


@pytest.mark.timeout(30)
def test_a_newcomer_fetches_a_served_prefix_and_falls_back_in_one_line_on_a_bad_one(run, header, tmp_path, caplog):
    _, p, _, steps = run
    path = tmp_path / "log.bin"
    write_log(path, steps[:4], header)
    source = LogSource(path)
    server = logserve.LogServer(source, source.describe, "127.0.0.1", 0).start()
    try:
        got, have = fetched(5, server.address, p, header, 0, 5.0)
        assert got == served(steps[:4]) and have == prefix.check(got, p)
        assert "steps 0..3" in logserve_text(server.address)
        caplog.set_level(logging.WARNING, logger="seedflood.roles")
        other = {**header, "base_hash": "another"}
        assert fetched(5, server.address, p, other, 0, 5.0) == ([], prefix.NOTHING)
        assert "another run's log (base_hash" in caplog.text
        path.unlink()
        write_log(path, [steps[0], (1, steps[1][1][1:])], header)  # served on: a step that lacks a member
        assert fetched(5, server.address, p, header, 0, 5.0) == ([], prefix.NOTHING)
        assert "a complete step has" in caplog.text
        path.unlink()
        assert fetched(5, server.address, p, header, 0, 5.0) == ([], prefix.NOTHING)
        assert "answered 503: no log at" in caplog.text
    finally:
        server.close()
    start = time.monotonic()
    assert fetched(5, server.address, p, header, 0, 5.0) == ([], prefix.NOTHING)  # down: refused at once
    assert time.monotonic() - start < 2.0
    assert "its sponsor sends the whole log" in caplog.records[-1].getMessage()


def logserve_text(address: str) -> str:
    host, port = logserve.parse(address)
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        return b"".join(iter(lambda: s.recv(4096), b"")).decode()


@pytest.mark.timeout(30)
def test_a_server_that_trickles_its_prefix_is_given_up_on_within_the_bound(run, header, caplog):
    _, p, _, _ = run

    class Trickle(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b"x" * (1 << 16))
                    time.sleep(0.05)
            except OSError:
                pass  # the fetch gave up and closed the connection

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Trickle)
    threading.Thread(target=server.handle_request, daemon=True).start()
    start = time.monotonic()
    address = f"127.0.0.1:{server.server_address[1]}"
    with caplog.at_level(logging.WARNING, logger="seedflood.roles"):
        assert fetched(5, address, p, header, 0, 0.5) == ([], prefix.NOTHING)
    assert time.monotonic() - start < 3.0 and "slower than 0.5 s" in caplog.text
    server.server_close()
