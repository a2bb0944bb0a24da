"""Strict or churn is decided once, where a process is put together (roles/wiring.py): the mode's
wiring hands the client its strategy and the evaluator its settings and inbox, and nothing
downstream asks `Protocol.churn` again."""

import ast
from pathlib import Path

from seedflood.core.config import runconfig as config
from seedflood.core.flood.protocol import Protocol
from seedflood.core.topology import resolve as topology
from seedflood.ml.workload import Workload
from seedflood.roles.evaluator import Settings
from seedflood.roles.strictwiring import StrictWiring
from seedflood.roles.wiring import Process

ROOT = Path(__file__).resolve().parents[3]
ROLES = ROOT / "src" / "seedflood" / "roles"
DEBUG = ROOT / "launch" / "configs" / "debug.yaml"


def _reads_of_churn(path: Path) -> list[int]:
    """Lines that read `<...>protocol.churn` (or `p.churn`, a protocol's usual short name)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "churn":
            v = node.value
            if (isinstance(v, ast.Name) and v.id in ("protocol", "p")) or (
                isinstance(v, ast.Attribute) and v.attr == "protocol"
            ):
                lines.append(node.lineno)
    return lines


def test_protocol_churn_is_read_only_where_a_process_is_put_together():
    reads = {p.name: _reads_of_churn(p) for p in sorted(ROLES.glob("*.py"))}
    # train.run picks the wiring; inprocess.simulate composes the in-process run (its network,
    # each client's strategy, which faults it may inject)
    assert {name for name, lines in reads.items() if lines} == {"train.py", "inprocess.py"}, reads
    assert len(reads["train.py"]) == 1, reads["train.py"]


def test_a_strict_evaluator_looks_for_no_client_logs(tmp_path):
    """Strict clients keep no logs of their own: a stream that ends short is an error, never
    completed from a clients/ directory that happens to lie in the run directory."""
    cfg = config.load(DEBUG, [f"run.out_dir={tmp_path}"])
    top = topology.build(cfg.topology)
    process = Process(cfg, top, Protocol.of(cfg, top.diameter), Workload.build(cfg))
    assert Settings.of(cfg).run.clients is not None  # eval.client_logs is on by default (churn runs use it)
    settings = StrictWiring(process).settings()
    assert settings.run.clients is None
    assert settings.run.root == Settings.of(cfg).run.root
