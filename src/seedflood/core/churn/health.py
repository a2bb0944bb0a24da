"""A churn client's health counters: how its commits, edges and ballots went (for the sinks).

Owns `Health`: running totals a churn client (its core/churn/member.py) adds to as it
works, read about once a second into its live status record (livestatus.py, `Status.health`)
and summed over the clients by the evaluator (rundir/health.py) for TensorBoard and the
trackers. Counts only: nothing here is sent, logged or decided on.

  commits       steps this client began and then committed by the votes it held
  commit_hops   the sum, over those, of the hops from the start of its local step s to the
                commit of s (its commit latency in hops; delay × hops when nothing waits)
  voted         commits of steps this client voted on
  ballots       the sum, over those, of the ballots it voted in (1: the first ballot decided)
  drops         peers its transport lost or it cut off (a bad frame)
  heals         down edges it brought back up

Assumes: one thread adds (the training thread); a reader on another thread reads ints that are
replaced whole, so a torn snapshot is at most one count behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class Health:
    commits: int = 0
    commit_hops: int = 0
    voted: int = 0
    ballots: int = 0
    drops: int = 0
    heals: int = 0
    _began: dict[int, int] = field(default_factory=dict, repr=False)  # local step -> hops run at its start

    def begin(self, step: int, hops_run: int) -> None:
        """Local step `step` starts with `hops_run` exchanges behind it."""
        self._began.setdefault(step, hops_run)

    def commit(self, step: int, hops_run: int, ballot: int | None) -> None:
        """Step `step` committed after `hops_run` exchanges; `ballot`: the last ballot this client
        voted in for it (None: it did not vote on it)."""
        began = self._began.pop(step, None)
        if began is not None:  # else a step it did not begin (a rejoin's catch-up): no latency
            self.commits += 1
            self.commit_hops += max(0, hops_run - began)
        for s in [s for s in self._began if s < step]:
            del self._began[s]
        if ballot is not None:
            self.voted += 1
            self.ballots += ballot + 1

    def snapshot(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.repr}  # the counters, not _began
