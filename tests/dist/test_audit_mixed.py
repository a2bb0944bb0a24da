"""Verification by recomputation across kinds of CPU in a launched run (docs/trust.md, Mixed
hardware): 1 evaluator + 4 clients over gloo, signed, `trust.audit: 1`, node 1's process started
with `ATEN_CPU_CAPABILITY=default` (no vector kernels) and the others with the machine's own.

- With `trust.audit_tolerance` set, nobody is excluded: every client recomputed its peers' scalars,
  found nothing, and all end on the evaluator's hash, which the log replays to.
- The control: the same kinds at tolerance 0 (exact, a strict run: it stops on the first
  mismatch; SEEDFLOOD_ANY_BUILD=1, else the build check refuses the other kind at start) accuse
  across kinds at step 0, so the two kinds' scalars really differ.
- A liar (node 2, native) that shifts each scalar by 1.2 × the scalar tolerance is excluded from
  step 0 with the evidence; node 1 stays. One that shifts by 0.8 × passes (the in-process
  threshold cases at 1.05 and 0.95: tests/unit/roles/test_recompute.py).

The base weights are the debug config's tiny model built here and saved, which every process
loads: a random init is drawn by kernels that differ without vector code (docs/trust.md).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from conftest import procs_ok
from test_churn_gloo import ADVERSARY, WORLD

import runs
from seedflood.comm import identity

pytestmark = [pytest.mark.dist, pytest.mark.timeout(900)]
MIXED = 1  # the node whose process runs without vector kernels (rank 2)
LIAR = 2
STEPS = 6
TOLERANCE = 1e-5  # nats: 5e-3 on a scalar at zo.eps 1e-3, ~14 × the largest kind difference measured


def mixed(argv: list[str]) -> list[str]:
    """`argv` through a shell that sets ATEN_CPU_CAPABILITY=default in node MIXED's process only."""
    script = f'if [ "$RANK" = {MIXED + 1} ]; then export ATEN_CPU_CAPABILITY=default; fi; exec "$@"'
    return ["/bin/sh", "-c", script, "sh", *argv]


def base_model(tmp_path: Path) -> Path:
    from seedflood.core.config import runconfig
    from seedflood.ml import model

    loaded = model.load(runconfig.load(runs.DEBUG, []).model)
    model.save(loaded, tmp_path / "base")
    return tmp_path / "base"


def signed_sets(tmp_path: Path, out: Path, *extra: str) -> tuple[str, ...]:
    identity.write_keys(tmp_path / "keys", 4)
    trust = ("trust.sign=true", f"trust.keys={tmp_path / 'keys'}", "trust.audit=1")
    return runs.churn(out, STEPS, f"model.name={base_model(tmp_path)}", *trust, *extra)


@pytest.mark.parametrize("shift", [0.0, 1.2, 0.8], ids=["honest", "liar-above", "liar-below"])
def test_a_signed_run_mixing_kinds_of_cpu_excludes_only_a_liar_beyond_the_tolerance(run_world, tmp_path, shift):
    out = tmp_path / "run"
    sets = signed_sets(tmp_path, out, f"trust.audit_tolerance={TOLERANCE}")
    argv = runs.train(*sets)
    if shift:
        lie = str(shift * TOLERANCE / (2 * 1e-3))  # the scalar tolerance at the debug config's zo.eps
        argv = [sys.executable, str(ADVERSARY), str(LIAR), "shift", lie, *argv[3:]]
    procs = run_world(mixed(argv), nprocs=WORLD, watch=[out / "log.bin"])
    if shift > 1:
        s = runs.summary(out)
        assert all(p.returncode == 0 for i, p in enumerate(procs) if i != LIAR + 1), [p.describe() for p in procs]
        assert s["left"] == [LIAR], s.get("membership_changes")
        assert [h for n, h in enumerate(s["client_hashes"]) if n != LIAR] == [s["param_hash"]] * 3
        assert s["membership_changes"][0].startswith("step 0: leave 2"), s["membership_changes"]
        assert "recompute" in procs[LIAR].stderr + procs[LIAR + 2].stderr  # its neighbours said why
        assert runs.replay(out) == {"steps": STEPS, "param_hash": s["param_hash"]}
        return
    procs_ok(procs)
    s = runs.check_churn_run(out, STEPS)
    for n, f in enumerate(s["flood"]):
        a = f["audit"]
        assert a["recomputed"] == 3 * STEPS and a["found"] == {} and a["sent"] == 0 and a["false"] == {}, (n, a)
        assert f["forged"] == 0


def test_control_the_same_kinds_at_tolerance_0_accuse_each_other(run_world, tmp_path):
    out = tmp_path / "run"
    # at tolerance 0 the run's build check refuses the other kind at start (rundir/build.py); let it
    # through, so that the audit itself shows what it would find
    procs = run_world(
        mixed(runs.train(*signed_sets(tmp_path, out, "churn.settle=0"))), nprocs=WORLD, env={"SEEDFLOOD_ANY_BUILD": "1"}
    )
    said = "".join(p.stderr for p in procs)
    across = rf"node {MIXED}'s scalar of step 0 \(k 0\) is \S+, node [023] recomputed|node [023]'s scalar of step 0 \(k 0\) is \S+, node {MIXED} recomputed"
    assert re.search(across, said), said[-3000:]
    assert any(p.returncode != 0 for p in procs)
