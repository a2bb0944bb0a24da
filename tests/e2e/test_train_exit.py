"""How a launched `train` process ends (seedflood.cli.exit_process(code, finalize=False)).

It skips the interpreter's finalization (torch's teardown: 0.6-1.3 s of CPU per process, for
nothing a run keeps) but keeps what a plain exit gives: other non-daemon threads finish, the
atexit handlers run, buffered stdout and stderr reach their pipes, and the status is the code.
Every launcher test checks the rest (a finished run's files, its exit statuses) on real runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = """
import atexit, sys, threading, time
from seedflood.cli import exit_process

class Finalized:
    def __del__(self):
        print("finalized", flush=True)

keep = Finalized()  # a module global: only the interpreter's finalization would delete it

def late_write():
    time.sleep(0.3)
    with open(sys.argv[1], "w") as f:
        f.write("written")

threading.Thread(target=late_write).start()  # not a daemon: a plain exit waits for it
atexit.register(lambda: print("atexit ran"))
print("buffered out")
sys.stderr.write("buffered err")
exit_process(3, finalize=sys.argv[2] == "1")
"""


@pytest.mark.parametrize("finalize", [False, True])
def test_exit_without_finalization_keeps_threads_atexit_output_and_status(finalize: bool, tmp_path: Path) -> None:
    late = tmp_path / "late.txt"
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(late), str(int(finalize))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 3, p.stderr
    assert late.read_text() == "written"
    assert p.stderr == "buffered err"
    # The control (a plain exit) finalizes the module global; the train exit does not.
    expected = ["buffered out", "atexit ran", *(["finalized"] if finalize else [])]
    assert p.stdout.splitlines() == expected, p.stdout
