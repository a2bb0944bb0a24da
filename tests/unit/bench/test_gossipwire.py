"""gossipwire.py: one mixing round over frames and counted, side by side, prints the same bits
and the same bytes (a ring of 4, 1,000 scalars: milliseconds)."""

from __future__ import annotations

import re

from seedflood.bench import gossipwire
from seedflood.core.flood.transport import HEADER


def test_it_prints_both_rounds_the_same_bits_and_the_same_bytes(capsys) -> None:
    assert gossipwire.main(["--clients", "4", "--scalars", "1000", "--repeats", "1"]) == 0
    line = capsys.readouterr().out.strip()
    m = re.fullmatch(
        r"ring of 4, 1,000 fp32 a vector on cpu: one mixing round frames [\d.]+ s, counted [\d.]+ s "
        r"\([\d.]+x\); same bits: yes; bytes counted ([\d,]+) / ([\d,]+)",
        line,
    )
    assert m is not None, line
    per_edge = HEADER + 20 + 4 * 1000  # a DENSE frame of 1,000 fp32 per directed edge of the ring
    assert m[1] == m[2] == f"{8 * per_edge:,}"
