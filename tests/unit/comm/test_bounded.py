"""bounded.BoundedStore against a stand-in store: answers pass through, a call past its bound
(or on a broken connection) raises StoreGone and leaves the store gone; other errors are the
store's own. And runtime.Group.collect over it: a silent store is found within the call bound;
a real TCPStore whose host died raises in one line and, after runtime.quiet_cpp_warnings, writes
no C++ backtrace on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from seedflood.comm import runtime
from seedflood.comm.bounded import BoundedStore, StoreGone, bounded
from seedflood.comm.runtime import Group, World, WorldError


class FakeStore:
    """A dict store; `hang` set makes every call block until `release` is set."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.hang = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def _gate(self) -> None:
        self.calls += 1
        if self.hang.is_set():
            self.release.wait(30)

    def add(self, key: str, amount: int) -> int:
        self._gate()
        value = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(value).encode()
        return value

    def set(self, key: str, value: str) -> None:
        self._gate()
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        self._gate()
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        self._gate()
        return all(k in self.data for k in keys)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        self._gate()
        if self.data.get(key, b"").decode() == expected:
            self.data[key] = desired.encode()
        return self.data.get(key, expected.encode())

    def delete_key(self, key: str) -> bool:
        self._gate()
        return self.data.pop(key, None) is not None

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        self._gate()
        end = time.monotonic() + timeout.total_seconds()
        while not all(k in self.data for k in keys):
            if time.monotonic() > end:
                raise RuntimeError("Socket Timeout")
            time.sleep(0.005)

    def clone(self) -> FakeStore:
        self._gate()
        return self


def test_calls_pass_through_and_errors_are_the_stores_own() -> None:
    raw = FakeStore()
    s = BoundedStore(raw, 1.0)
    assert s.add("n", 2) == 2 and s.add("n", 1) == 3
    s.set("k", "v")
    assert s.get("k") == b"v" and s.check(["k", "n"]) and not s.check(["x"])
    assert s.compare_set("k", "v", "w") == b"w" and s.get("k") == b"w"
    assert s.delete_key("k") and not s.check(["k"])
    assert s.clone() is raw
    with pytest.raises(KeyError):  # the store's error, and the store is not gone for it
        s.get("missing")
    with pytest.raises(RuntimeError, match="Socket Timeout"):  # wait's own timeout, past timeout_s
        s.wait(["never"], timedelta(seconds=0.05))
    assert s.gone is None and s.add("n", 0) == 3
    assert bounded(s, 5.0) is s and bounded(raw, 5.0).raw is raw


def test_a_wait_gets_its_own_timeout_on_top_of_the_bound() -> None:
    raw = FakeStore()
    s = BoundedStore(raw, 0.1)
    threading.Timer(0.3, lambda: raw.data.setdefault("late", b"1")).start()
    s.wait(["late"], timedelta(seconds=5))  # longer than timeout_s, within its own timeout
    assert s.gone is None


def test_a_silent_store_costs_the_bound_once_then_every_call_fails_at_once() -> None:
    raw = FakeStore()
    s = BoundedStore(raw, 0.2)
    s.set("k", "v")
    raw.hang.set()
    t0 = time.monotonic()
    with pytest.raises(StoreGone, match="did not answer within 0.2 s"):
        s.add("k2", 1)
    assert 0.15 < time.monotonic() - t0 < 2.0
    calls = raw.calls
    t0 = time.monotonic()
    for call in (lambda: s.get("k"), lambda: s.set("k", "w"), lambda: s.check(["k"]), s.clone):
        with pytest.raises(StoreGone):
            call()
    # none waited the bound (0.2 s each) and none reached the store
    assert time.monotonic() - t0 < 0.2 and raw.calls == calls
    raw.release.set()  # the blocked read ends: the store stays gone (its answer is out of order)
    time.sleep(0.05)
    with pytest.raises(StoreGone):
        s.get("k")


def test_threads_share_one_store_and_each_gets_its_own_answer() -> None:
    s = BoundedStore(FakeStore(), 2.0)
    out: dict[int, int] = {}

    def work(i: int) -> None:
        out[i] = sum(s.add(f"c{i}", 1) for _ in range(50))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert out == {i: sum(range(1, 51)) for i in range(4)}


def test_a_bound_must_be_positive() -> None:
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError):
            BoundedStore(FakeStore(), bad)


def test_a_broken_connection_is_gone_for_good_other_errors_are_the_callers() -> None:
    raw = FakeStore()
    s = BoundedStore(raw, 1.0)

    def broken(*_: object) -> None:
        raise dist.DistNetworkError("Broken pipe")

    raw.check = broken  # type: ignore[method-assign]
    with pytest.raises(StoreGone, match="connection failed: Broken pipe"):
        s.check(["k"])
    with pytest.raises(StoreGone):
        s.add("k", 1)  # the same connection: never used again
    assert raw.calls == 0


def test_collect_finds_a_silent_store_within_the_call_bound_not_the_report_timeout() -> None:
    raw = FakeStore()
    group = Group(World(rank=0, world_size=1), BoundedStore(raw, 0.2), timedelta(seconds=60))
    group.post("client/0", {"hash": "ab"})
    threading.Timer(0.3, lambda: group.post("client/1", {"hash": "cd"})).start()
    assert group.collect(["client/0", "client/1"]) == {"client/0": {"hash": "ab"}, "client/1": {"hash": "cd"}}
    with pytest.raises(WorldError, match="no final report from client/2 within 0.3 s"):
        group.collect(["client/0", "client/2"], timeout_s=0.3)
    raw.hang.set()
    t0 = time.monotonic()
    with pytest.raises(StoreGone):
        group.collect(["client/0", "client/3"])  # 60 s to report, but the store is silent
    assert time.monotonic() - t0 < 5.0


DEAD_STORE = """
from datetime import timedelta
import torch.distributed as dist
from seedflood.comm import runtime
print(runtime.quiet_cpp_warnings())
host = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
store = dist.TCPStore("127.0.0.1", host.port, is_master=False, timeout=timedelta(seconds=5))
store.set("k", "v")
del host  # the store's host goes: its connections close
for call in (lambda: store.add("n", 1), lambda: store.check(["k"])):  # a failed receive, then a failed send
    try:
        call()
    except dist.DistNetworkError as e:
        print(type(e).__name__)
"""


def test_a_dead_store_raises_in_one_line_without_a_cpp_backtrace_on_stderr() -> None:
    """c10d's TCPStore client logs a WARNING with the C++ exception's whole backtrace
    (12-22 frames) before it raises; a dead store put two on the evaluator's stderr. A fresh
    interpreter, so that stderr is the C++ code's as well."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    p = subprocess.run([sys.executable, "-c", DEAD_STORE], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "DistNetworkError", "DistNetworkError"], p.stdout
    for cpp in ("frame #", "Exception raised from", "[c10d]"):
        assert cpp not in p.stderr, p.stderr


def test_a_cpp_log_level_the_user_set_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO")
    assert runtime.quiet_cpp_warnings() is False
