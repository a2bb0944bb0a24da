"""A churn run's health for the sinks: the clients' counters summed, as scalars at a step.

Owns `HealthReader`: reads the clients' live status records (status.py, `Status.health`, from
core/churn/health.py) and turns their totals into the scalars TensorBoard and the trackers plot
under `health/` (metrics.MetricsWriter.health):

  commit_hops        commit latency in hops: hops from the start of a local step to its commit,
                     averaged over the commits since the last reading (all clients)
  ballots_per_step   ballots a client voted in per step it committed, averaged likewise
  drops, heals       edge ends lost and healed so far, summed over the clients (an edge that
                     fails is usually counted at both its ends)
  clients            client records read

The evaluator adds the roster's joins and exclusions (the committed changes it logged). Timing
figures: never in metrics.jsonl, which stays the same for the same run.

Assumes: the records are on this disk (a launched run's clients and evaluator share the run
directory); where they are not, only the evaluator's own figures are written. Records are
cumulative per process: a restarted client starts from 0 again, so a sum may step back.
"""

from __future__ import annotations

from seedflood.rundir.layout import RunDir
from seedflood.rundir.status import CLIENT, read_statuses


class HealthReader:
    def __init__(self, run: RunDir) -> None:
        self.run = run
        self._last: dict[str, int] = {}

    def totals(self) -> tuple[dict[str, int], int]:
        """The clients' counters summed, and how many client records there were."""
        found, _ = read_statuses(self.run)
        clients = [s for s in found if s.role == CLIENT and s.health]
        out: dict[str, int] = {}
        for s in clients:
            for k, v in s.health.items():
                out[k] = out.get(k, 0) + v
        return out, len(clients)

    def read(self) -> dict[str, float]:
        """The health scalars now (the averages over the commits since the last reading)."""
        now, clients = self.totals()
        last = self._last
        out: dict[str, float] = {"clients": float(clients)}
        if clients:
            out["drops"] = float(now.get("drops", 0))
            out["heals"] = float(now.get("heals", 0))
        commits = now.get("commits", 0) - last.get("commits", 0)
        if commits > 0:
            out["commit_hops"] = (now.get("commit_hops", 0) - last.get("commit_hops", 0)) / commits
        voted = now.get("voted", 0) - last.get("voted", 0)
        if voted > 0:
            out["ballots_per_step"] = (now.get("ballots", 0) - last.get("ballots", 0)) / voted
        self._last = now
        return out
