"""The README's cheap figures, measured again: `make readme-figures` (or `python -m
seedflood.bench.readme [--write README.md]`, from a checkout's root).

Owns: the first run (`make try`: the debug config through the real launcher, then `seedflood
replay` of its log) timed from a fresh run directory, and the README block between
`<!-- first-run -->` and `<!-- /first-run -->` that shows its output with its wall time, CPU
seconds, commit, date and machine. Without `--write` it prints the block and touches nothing.

Assumes: run from the repository root (it starts `launch/torchrun.sh`), offline
(HF_HUB_OFFLINE=1); the interpreter is the one running this module.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = "launch/configs/debug.yaml"
BEGIN, END = "<!-- first-run -->", "<!-- /first-run -->"
# The lines of the launcher's output the README shows (the summary the evaluator prints).
SHOWN = ("step ", "steps ", "zero-shot:", "final:", "bytes per edge", "consensus:")


def machine() -> str:
    """'AMD EPYC, 2 cores, 23 GiB, torch CPU capability AVX512' from what this host reports."""
    import torch  # noqa: PLC0415 (keeps `--help` light)

    from seedflood.ml import machine as host  # noqa: PLC0415 (imports torch)

    gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    model = host.cpu_model() or platform.machine()
    return (
        f"{model}, {host.cpus()} cores, {gib:.0f} GiB, torch CPU capability {torch.backends.cpu.get_cpu_capability()}"
    )


def commit() -> str:
    """The checkout's short commit, '+' when the work tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def first_run(out_dir: Path) -> tuple[list[str], float, float]:
    """Run the first run into out_dir; return (its shown lines + replay's hash line, wall s, CPU s
    of every child process)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHON": sys.executable}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    launched = subprocess.run(
        ["launch/torchrun.sh", CONFIG, "--set", f"run.out_dir={out_dir}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # the scores are logged beside the progress bar
        text=True,
    )
    if launched.returncode != 0:
        raise SystemExit(
            f"seedflood.bench.readme: the first run failed (status {launched.returncode}):\n{launched.stdout[-2000:]}"
        )
    replayed = subprocess.run(
        [sys.executable, "-m", "seedflood", "replay", str(out_dir)], env=env, capture_output=True, text=True, check=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # The progress bar redraws with carriage returns: a score may share a line with it.
    shown = [line.strip() for line in re.split(r"[\r\n]", launched.stdout) if line.strip().startswith(SHOWN)]
    shown += [line for line in replayed.stdout.splitlines() if line.startswith("param hash")]
    return shown, wall, cpu


def block(lines: list[str], wall: float, cpu: float) -> str:
    """The README's block: the output, then where and when it was measured."""
    today = datetime.date.today().isoformat()
    return (
        f"{BEGIN}\n```\n" + "\n".join(lines) + "\n```\n\n"
        f"{wall:.0f} s wall, {cpu:.0f} CPU-s (`make readme-figures` at {commit()}, {today}, {machine()}).\n{END}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seedflood.bench.readme", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", metavar="README", help="replace the README's first-run block in place")
    args = parser.parse_args(argv)
    if not Path("launch/torchrun.sh").is_file():
        print("seedflood.bench.readme: run it from the repository root (launch/torchrun.sh not found)", file=sys.stderr)
        return 2
    out = Path(tempfile.mkdtemp(prefix="seedflood-first-run-"))
    try:
        text = block(*first_run(out / "run"))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(text)
    if args.write:
        readme = Path(args.write)
        old = readme.read_text()
        if old.count(BEGIN) != 1 or old.count(END) != 1:
            print(f"seedflood.bench.readme: {readme} needs one {BEGIN} ... {END} block", file=sys.stderr)
            return 2
        head, rest = old.split(BEGIN)
        readme.write_text(head + text + rest.split(END, 1)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
