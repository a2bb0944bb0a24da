"""Fixtures for the e2e tests: the program under launch, a loopback reference run and its hash, a SLURM cluster.

Every fixture that starts something stops it in its finalizer, also when a test fails or times out.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import docker_support  # noqa: E402
import e2e_support as sup  # noqa: E402
import slurm_cluster  # noqa: E402


@pytest.fixture(scope="session")
def entry() -> str:
    """The module the launchers run; skips the test when `seedflood train` is not there yet."""
    why = sup.entry_unavailable()
    if why:
        pytest.skip(why)
    return sup.MODULE


@pytest.fixture(scope="session")
def reference_run(entry: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The debug config on loopback (launch/torchrun.sh, one node): the hashes to match."""
    out = tmp_path_factory.mktemp("reference") / "run"
    log = out.parent / "torchrun.log"
    sup.run_checked(
        ["launch/torchrun.sh", str(sup.DEBUG_CONFIG), *sup.sets(f"run.out_dir={out}")],
        env=sup.launcher_env(),
        log=log,
        watch=[out / "log.bin"],
    )
    return sup.check_run(out)


@pytest.fixture(scope="session")
def reference_hash(entry: str, request: pytest.FixtureRequest) -> str:
    """The loopback run's final parameter hash, for tests that compare only that: the
    single-process reference's (sup.simulated_hash: launched runs equal it bit for bit), so these
    tests start no loopback run of their own. The stand-in entry (SEEDFLOOD_E2E_ENTRY=probe) has
    bits of its own: there it is `reference_run`'s."""
    if entry != "seedflood":
        return str(request.getfixturevalue("reference_run")["param_hash"])
    return sup.simulated_hash()


@pytest.fixture(scope="session")
def docker_image(entry: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The compose files' image, built from the working tree by docker/build.sh once per session
    (and per worker: the later builds find every layer cached); skips without a daemon, fails
    under CI=true (docker_support.require)."""
    if entry != "seedflood":
        pytest.skip("the image runs the real `seedflood`, not the probe")
    docker_support.require()
    docker_support.build_image(tmp_path_factory.mktemp("docker") / "build.log")
    return docker_support.IMAGE


@pytest.fixture(scope="session")
def slurm(entry: str):
    """A 2-node SLURM cluster on this machine (slurmd -N n1, n2), stopped after the session."""
    why = slurm_cluster.unavailable()
    if why:
        pytest.skip(why)
    cluster = slurm_cluster.SlurmCluster(nodes=2).start()
    try:
        yield cluster
    finally:
        cluster.stop()
