"""This host's compute as a process sees it: CPUs, torch intra-op threads, memory.

Owns `cpus` (the affinity mask), `cpu_model` (/proc/cpuinfo's `model name`), `threads_for` / `set_threads` (run.threads: 0 splits the CPUs
evenly over the processes a launcher starts on this machine), `threads_env` (the same count for
the thread pools that read it only when torch loads), `threads`, and `memory` (this process's
RSS / PSS / USS from /proc). Assumes Linux for `memory` (else None).

Imports torch only inside the functions that need it: `threads_env` runs before torch is imported.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Read when torch loads (OpenMP, MKL): unset, each pool starts sized to every core of the machine.
Not OPENBLAS_NUM_THREADS: numpy loads with the core (topology, log arrays), before the config that
says run.threads is read, so its pool is sized by then."""


def cpu_model() -> str:
    """The CPU's model as /proc/cpuinfo names it ("AMD EPYC"), "" where it names none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpus() -> int:
    """CPUs this process may run on (its affinity mask: a cgroup or taskset limit counts)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_for(n: int, local_processes: int = 1, cpu_count: int | None = None) -> int:
    """Intra-op threads for run.threads = `n` (pure): n itself when > 0; for 0, the CPUs split
    evenly over the `local_processes` a launcher starts on this machine, at least 1. torch's own
    default (every core) in each of 33 processes on 2 cores would oversubscribe 33-fold, and
    OpenMP threads that lose their core spin and stall their team for milliseconds."""
    if n > 0:
        return n
    return max(1, (cpu_count if cpu_count is not None else cpus()) // max(1, local_processes))


def set_threads(n: int, local_processes: int = 1) -> None:
    """torch intra-op threads for run.threads = `n` (see threads_for). With one process per
    machine and n = 0, torch's default is left alone (it already uses every core)."""
    if n > 0 or local_processes > 1:
        import torch

        torch.set_num_threads(threads_for(n, local_processes))


def threads_env(n: int, local_processes: int, environ: MutableMapping[str, str]) -> None:
    """Set THREAD_VARS in `environ` to run.threads = `n`'s count (see threads_for), as set_threads
    does torch's, when set_threads would set it; to be called before torch is imported."""
    if n > 0 or local_processes > 1:
        environ.update(dict.fromkeys(THREAD_VARS, str(threads_for(n, local_processes))))


def threads() -> int:
    """torch intra-op threads this process uses now."""
    import torch

    return torch.get_num_threads()


def memory() -> dict[str, int] | None:
    """This process's memory in bytes from /proc/self/smaps_rollup (Linux ≥ 4.14), else None:
    rss (resident), pss (resident, each page divided by the processes that map it: what this
    process costs the machine), uss (resident pages no other process maps: what exiting frees).
    File pages several clients map read-only (shared libraries, a memory-mapped weights file)
    count in full in rss, shared in pss, not at all in uss."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            kb = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f) if v.strip().endswith("kB")}
    except (OSError, ValueError, IndexError):
        return None
    return {
        "rss": kb.get("Rss", 0) * 1024,
        "pss": kb.get("Pss", 0) * 1024,
        "uss": (kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)) * 1024,
    }
