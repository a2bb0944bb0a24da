"""A throwaway single-machine SLURM cluster for the e2e tests (root only).

Starts munged, slurmctld and one slurmd per fake node (`slurmd -N nK`, all on this machine, each
on its own port) from a private directory: its own munge key and socket, slurm.conf, state and
spool. Nothing under /etc is used or changed; clients reach it through SLURM_CONF. The daemons
are processes of the test harness (tests/procs.py), which also bounds every wait here by progress
(job states, the files a test watches) with a daemon's exit failing it at once. `stop()` cancels
every job, ends the daemons it started (their process groups) and removes the directory.

Manual use (prints the SLURM_CONF to export; Ctrl-C stops it):
    sudo .venv/bin/python tests/e2e/slurm_cluster.py
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the harness, run by hand too

import procs as harness  # noqa: E402

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")
TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


def unavailable() -> str | None:
    """Why this host cannot run the cluster, or None."""
    if os.geteuid() != 0:
        return "SLURM e2e needs root (slurmd and munged run as root)"
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"SLURM e2e needs slurm-wlm and munge ({', '.join(missing)} missing; run .ci/setup-e2e.sh)"
    return None


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmCluster:
    def __init__(self, nodes: int = 2, cpus_per_node: int = 4) -> None:
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        self.cpus = cpus_per_node
        # Short path: the munge socket path must fit in sun_path (108 bytes).
        self.dir = Path(tempfile.mkdtemp(prefix="sfslurm-", dir="/tmp"))
        self.conf = self.dir / "slurm.conf"
        self.socket = self.dir / "munge" / "munge.sock"
        self.procs = harness.Procs(self.dir / "daemons", term_grace_s=10)
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> SlurmCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        d = self.dir
        for sub in ("munge", "state", "spool", "log"):
            (d / sub).mkdir(mode=0o700)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                f"--socket={self.socket}",
                f"--key-file={key}",
                f"--pid-file={d / 'munge' / 'munged.pid'}",
                f"--log-file={d / 'munge' / 'munged.log'}",
                f"--seed-file={d / 'munge' / 'munged.seed'}",
                "--force",
            ],
        )
        self._wait(lambda: self.socket.exists(), "munged socket")
        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        host = socket.gethostname()
        nodes = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs={self.cpus} "
            f"RealMemory=4000 State=UNKNOWN"
            for n, p in zip(self.nodes, node_ports)
        )
        self.conf.write_text(f"""\
ClusterName=sfe2e
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
StateSaveLocation={d / "state"}
SlurmdSpoolDir={d / "spool"}/%n
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmdPidFile={d / "slurmd-%n.pid"}
SlurmctldLogFile={d / "log" / "slurmctld.log"}
SlurmdLogFile={d / "log" / "slurmd-%n.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
MinJobAge=600
{nodes}
PartitionName=e2e Nodes={",".join(self.nodes)} Default=YES MaxTime=30 State=UP OverSubscribe=FORCE:4
""")
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        self._wait(lambda: self.run(["scontrol", "ping"], check=False).stdout.count("UP") > 0, "slurmctld")
        for n in self.nodes:
            self._spawn(f"slurmd-{n}", ["slurmd", "-D", "-N", n, "-f", str(self.conf)])

        def idle() -> bool:
            states = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout.split()
            return states.count("idle") == len(self.nodes)

        self._wait(idle, "nodes idle")

    def stop(self) -> None:
        if self.conf.exists() and any(self.procs.running(n) for n in self.procs.procs):
            self.run(["scancel", "--user=root"], check=False)
            deadline = time.monotonic() + 20  # best effort: the daemons are ended below anyway
            while time.monotonic() < deadline and self.run(["squeue", "-h"], check=False).stdout.strip():
                time.sleep(0.3)
        self.procs.close()  # SIGTERM, 10 s, then SIGKILL of every daemon's group
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- use ---------------------------------------------------------------------------------
    def run(
        self,
        argv: list[str],
        *,
        check: bool = True,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        timeout: float = 30,
    ) -> subprocess.CompletedProcess:
        full_env = {**(env or self.env), "SLURM_CONF": str(self.conf)}
        r = subprocess.run(argv, capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
        return r

    def wait_job(self, job_id: str, watch: Sequence[Path] = ()) -> dict[str, tuple[str, str]]:
        """Wait until every task of the job is finished; {job id: (state, exit code)}. Bounded by
        progress: a change of the job's states or of the size of a `watch`ed file (a run's
        log.bin, the directory of the job's outputs); the job is cancelled on a stall."""
        states: dict[str, tuple[str, str]] = {}

        def done() -> bool:
            states.clear()
            states.update(self.job_states(job_id))
            return bool(states) and all(s in TERMINAL for s, _ in states.values())

        try:
            self.until(done, f"job {job_id}", lambda: (tuple(sorted(states.items())), *map(harness.size, watch)))
        except AssertionError:
            self.run(["scancel", job_id], check=False)
            raise
        return dict(states)

    def until(self, cond: Callable[[], object], what: str, progress: Callable[[], Hashable]) -> None:
        """Until `cond()` holds; fails when `progress()` stalls or a daemon exits (procs.Procs.wait_for)."""
        self.procs.wait_for(cond, what, alive=list(self.procs.procs), progress=progress, poll_s=0.3)

    def job_states(self, job_id: str) -> dict[str, tuple[str, str]]:
        r = self.run(["scontrol", "-o", "show", "job", job_id], check=False)
        out = {}
        for line in r.stdout.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            key = fields.get("JobId", "?")
            if "ArrayTaskId" in fields:
                key = f"{fields.get('ArrayJobId')}_{fields['ArrayTaskId']}"
            out[key] = (fields.get("JobState", "?"), fields.get("ExitCode", "?"))
        return out

    def logs(self) -> str:
        parts = []
        for f in sorted((self.dir / "log").glob("*.log")):
            parts.append(f"== {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    # -- internals ---------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> None:
        self.procs.start(name, argv, env=self.env, log=self.dir / f"{name}.out")

    def _wait(self, cond, what: str) -> None:
        """Start-up: until `cond()`, a daemon's exit failing it at once; bounded by the growth of
        the daemons' logs and outputs (procs.STALL_S without any fails it)."""
        try:
            self.until(cond, what, lambda: (harness.size(self.dir / "log"), harness.size(self.dir)))
        except AssertionError as e:
            raise RuntimeError(f"{e}\n{self.logs()}") from None


if __name__ == "__main__":
    why = unavailable()
    if why:
        raise SystemExit(why)
    cluster = SlurmCluster().start()
    print(f"export SLURM_CONF={cluster.conf}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
