"""A rendezvous store whose every call returns within a bound: `BoundedStore`.

Owns the rule that no store call on a running process waits longer than the hop timeout. torch's
TCPStore client does not give it: on a connection whose far end stopped answering (its host cut
off by the network, or stopped) `add`, `get`, `check`, `wait` and `compare_set` block until TCP
itself gives up (minutes for a host cut off; never for a stopped one), whatever the store's
timeout says (measured with torch 2.13 against a stopped server, a 10-20 s store timeout and
`set_timeout(2 s)`: all five still blocked after 30 s, `compare_set` after 10 minutes). A client
cut off with its store would then sit in a between-steps store read instead of finding out it is
alone.

So each call runs on one worker thread and the caller waits at most `timeout_s` (a `wait` its own
timeout plus that). A call that runs past its bound leaves the store gone for good: the worker is
still blocked in a read whose answer, if it ever came, would be out of order on that connection,
so nothing uses the connection again, and every later call raises `StoreGone` at once. The worker
is a daemon thread, so a blocked one never keeps the process alive. A broken connection (torch's
DistNetworkError: the host died and its socket closed) is gone for good too: TCPStore's client
does not reconnect. Any other error (a key's wait timing out) is the caller's, as raised.

Assumes: a store whose host answers slower than `timeout_s` is as good as gone to its callers
(the store is for (re)connecting and final reports, never a hop); `clone()` is for a thread that
bounds its own waits (connect's link threads, the evaluator's offer loop): it hands out a plain
store, which gloo's rendezvous needs.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import torch.distributed as dist

T = TypeVar("T")


class StoreGone(RuntimeError):
    """The store did not answer within its bound (now or before): it is not used again."""


class BoundedStore:
    """`store`'s calls, each answered within timeout_s or raising StoreGone (module docstring).
    Safe to call from several threads (calls are served one at a time, in order)."""

    def __init__(self, store: dist.Store, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.raw = store
        self.timeout_s = float(timeout_s)
        self.gone: str | None = None  # why the store is not used any more
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[..., T], *args: Any, extra_s: float = 0.0) -> T:
        """fn(*args) on the worker, waited for at most timeout_s + extra_s; its error is raised
        here. Raises StoreGone when the store is gone or does not answer in time."""
        if self.gone is not None:
            raise StoreGone(self.gone)
        done = threading.Event()
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as e:  # handed to the caller
                box["error"] = e
            done.set()

        self._start()
        self._calls.put(run)
        bound = self.timeout_s + extra_s
        if not done.wait(bound):
            self.gone = self.gone or f"the store did not answer within {bound:g} s"
            raise StoreGone(self.gone)
        error = box.get("error")
        if isinstance(error, dist.DistNetworkError):  # the connection broke: the client never reconnects
            self.gone = self.gone or f"the store's connection failed: {str(error).splitlines()[0]}"
            raise StoreGone(self.gone) from error
        if error is not None:
            raise error
        return box["value"]

    def _start(self) -> None:
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, name="seedflood-store", daemon=True)
                self._worker.start()

    def _serve(self) -> None:
        while True:
            self._calls.get()()

    # -- the dist.Store calls this project makes --------------------------------------------------

    def add(self, key: str, amount: int) -> int:
        return self.call(self.raw.add, key, amount)

    def set(self, key: str, value: str | bytes) -> None:
        self.call(self.raw.set, key, value)

    def get(self, key: str) -> bytes:
        return self.call(self.raw.get, key)

    def check(self, keys: Sequence[str]) -> bool:
        return self.call(self.raw.check, list(keys))

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return self.call(self.raw.compare_set, key, expected, desired)

    def delete_key(self, key: str) -> bool:
        return self.call(self.raw.delete_key, key)

    def wait(self, keys: Sequence[str], timeout: timedelta) -> None:
        """Wait for keys as the store does (its error on a timeout), bounded by timeout + timeout_s."""
        self.call(self.raw.wait, list(keys), timeout, extra_s=timeout.total_seconds())

    def clone(self) -> dist.Store:
        """A new plain connection to the store (module docstring), made within the bound."""
        return self.call(self.raw.clone)


def bounded(store: dist.Store | BoundedStore, timeout_s: float) -> BoundedStore:
    """`store` with bounded calls (itself when it already is)."""
    return store if isinstance(store, BoundedStore) else BoundedStore(store, timeout_s)
