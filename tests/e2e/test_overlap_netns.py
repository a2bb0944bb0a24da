"""The overlap benchmark with real processes: 4 gloo clients on a ring, overlap off then on.

Checks bits, never timings: in both modes every client ends on the same hash, and that hash is
the in-memory reference's (a plain client with the same delay: 1 off, 2 on). Once over
loopback with a sleep per exchange, once between network namespaces behind a tbf cap (root).
The reference is computed once for both.
"""

from __future__ import annotations

import functools
import io
import os
import subprocess

import pytest

from seedflood.bench import overlap as bo

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", autouse=True)
def one_reference():
    """Both tests compare with the same in-memory reference (quick steps, overlap off and on: a
    pure function of `quick`, ~8 s of CPU): computed once for the module, not once per test."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bo, "_reference_hashes", functools.cache(bo._reference_hashes))
        yield


def check(result: dict) -> str:
    assert result["modes"]["off"]["delay"] == 1 and result["modes"]["on"]["delay"] == 2
    for mode, m in result["modes"].items():
        assert m["consensus"], f"{mode}: clients disagree"
        assert m["reference"], f"{mode}: clients differ from the in-memory reference"
        assert m["step_s"] > 0 and m["fwd_s"] > 0 and m["hop_s"] > 0
    out = io.StringIO()
    bo.print_overlap(result, out)
    return out.getvalue()


@pytest.mark.timeout(300)
def test_overlap_over_loopback_with_a_sleep_per_exchange_matches_the_reference():
    result = bo.fig_overlap(True, latency_s=0.01)
    assert result["rate"] is None and result["latency_s"] == 0.01
    assert "10.0 ms sleep per exchange" in check(result)


@pytest.mark.timeout(300)
def test_overlap_between_namespaces_behind_a_tbf_cap_matches_the_reference():
    if why := bo.netns_unavailable():
        pytest.skip(why)
    result = bo.fig_overlap(True, rate=bo.AUTO_RATE)
    assert result["rate"] == bo.AUTO_RATE
    assert f"tc tbf {bo.AUTO_RATE}" in check(result)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    mine = f"sfov{os.getpid() % 100000}-"  # fig_overlap's prefix; another process's run may be up beside it
    assert mine not in left, f"namespaces left behind: {left}"
