"""A read-only log server's wire: one HTTP GET over plain TCP (the standard library only).

Owns `LogServer` (a threaded `http.server` answering `GET /prefix` with the bytes its source
returns now, and `GET /` with one line of text saying what it serves) and `fetch` (a newcomer's
GET of the prefix, bounded in total time, not only per socket call: a server that trickles its
bytes must not hold a rejoin up). What the bytes mean is core/churn/prefix.py's; which log they
come from is roles/logserver.py's.

May import: seedflood.core (its host:port parser), comm.listen.

Assumes: the server only reads (nothing a client sends changes anything); a source that cannot
say anything now raises `Unavailable`, answered 503 with its one line.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from seedflood.comm.listen import listen_error
from seedflood.core.config.hostport import host_port

log = logging.getLogger(__name__)

PATH = "/prefix"
CHUNK = 1 << 16  # bytes a fetch reads at a time between checks of its deadline


class Unavailable(Exception):
    """The source has nothing to serve now (no log yet, a corrupt record): its one line."""


class LogServer:
    """Serves `source()` at `GET /prefix` and `describe()` at `GET /` on (host, port); port 0
    picks a free one (`address` says which). `start` runs it on a daemon thread, `serve` here.
    ListenError (one line) when it cannot listen there (the port is taken)."""

    def __init__(self, source: Callable[[], bytes], describe: Callable[[], str], host: str, port: int) -> None:
        self.source = source
        self.describe = describe
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                text = "text/plain; charset=utf-8"
                try:
                    if self.path == PATH:
                        body, kind, status = server.source(), "application/octet-stream", 200
                    else:
                        body, kind, status = (server.describe() + "\n").encode(), text, 200
                except Unavailable as e:
                    body, kind, status = (str(e) + "\n").encode(), text, 503
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
                log.info("serve-log: %s %s", self.address_string(), format % args)

        try:
            self.http = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:  # the port is taken, or the host is not this machine's: one line
            raise listen_error("serve-log", host, port, e, "--port") from None
        self.http.daemon_threads = True

    @property
    def address(self) -> str:
        host, port = self.http.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> LogServer:
        threading.Thread(target=self.http.serve_forever, name="seedflood-serve-log", daemon=True).start()
        return self

    def serve(self) -> None:
        self.http.serve_forever()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def parse(address: str) -> tuple[str, int]:
    """(host, port) of "HOST:PORT"; ValueError (one line) otherwise."""
    if (parsed := host_port(address)) is None:
        raise ValueError(f"{address!r} is not HOST:PORT")
    return parsed


def fetch(address: str, timeout_s: float) -> bytes:
    """The prefix the server at `address` ("HOST:PORT") serves now, within `timeout_s` seconds in
    all; OSError (one line) when it is down, answers otherwise than 200, or is too slow."""
    host, port = parse(address)
    deadline = time.monotonic() + timeout_s
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", PATH)
        reply = conn.getresponse()
        if reply.status != 200:
            why = reply.read(500).decode(errors="replace").strip()
            raise OSError(f"the log server answered {reply.status}: {why}")
        parts = []
        while chunk := reply.read(CHUNK):
            parts.append(chunk)
            if time.monotonic() > deadline:
                raise OSError(f"the log server sent its prefix slower than {timeout_s:g} s")
        return b"".join(parts)
    except http.client.HTTPException as e:
        raise OSError(f"the log server's answer is not HTTP: {e!r}") from None
    finally:
        conn.close()
