"""The protocol of one run: the rules every process must share, as one frozen value.

Owns what a client, the evaluator, replay and resume must agree on, derived once from the config
and the topology and then handed to each component in place of the whole `Config`:
- who takes part: `n_origins` clients (topology nodes 0..N-1: the founders), `ids` the node ids
  that may ever take part (churn.max_nodes: brand-new ids N..ids-1 may join a churn run; `roster`
  the founders' roster over them), `perturbations` messages (k) per origin per step, and the rank map (topology.rank_of: rank 0 is the evaluator, node i is
  rank i + 1), re-exported here so roles take it from the protocol;
- what a message may be: its seed is `derive(run_seed, origin, step, k)`, its scalar is finite
  and within `max_scalar`; `limits(lo, hi)` builds the codec's check for a step window and
  `check_step` validates one complete step (every origin, every k, nothing else) wherever steps
  come from: the wire, the evaluator's stream, a log on disk or a resume broadcast;
- who originates when (zo.stride, docs/churn.md, Unequal speeds): a listed node originates only
  on steps s with s % m == 0 (`originates`, `origins`); the codec refuses its messages of other
  steps, and completeness, `check_step` and the churn rule expect exactly the due origins;
- the update rule: lr(step) (warmup, then constant / linear / cosine over `steps`), the
  aggregation weight w (1 for sum; 1/N for mean, or with zo.stride 1/N_s, N_s the founders due
  at step s: `weight_at`) and the optional scalar clip (`coefficients`:
  a step's scalars clamped to ±clip × their median magnitude, docs/trust.md);
- the schedule: `hops` per step and the application `delay` = ⌈diameter / hops⌉ − 1, plus one
  with `overlap` (the hops of step t run while step t+1 is estimated, so step t+1's estimates
  cannot see what those hops complete: one more step of staleness, and nothing else — an
  overlapped client produces exactly the bits of a plain client of the same delay);
- `trajectory(...)`: every setting that changes the bits a run produces, flat and JSON-ready,
  stored in the log header so a resume or replay with other settings is refused by name.

Assumes: pure Python (the core); the config was validated and the topology is connected.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from seedflood.core.config import rng
from seedflood.core.config.configerror import ConfigError
from seedflood.core.config.runconfig import Config
from seedflood.core.flood import columnrules
from seedflood.core.flood.columns import StepColumns
from seedflood.core.membership.roster import Roster
from seedflood.core.topology.resolve import EVALUATOR_RANK, node_of, rank_of  # the rank map (rank 0: evaluator)
from seedflood.core.wire.message import FrameError, Limits, Message

__all__ = ["EVALUATOR_RANK", "Protocol", "digest", "node_of", "rank_of", "trajectory"]


def schedule(diameter: int, hops: int, overlap: bool = False, settle: int = 0) -> tuple[int, int]:
    """(vote_lag, delay) in steps. Step s is complete after the hops of steps s..s+D (D =
    ⌈diameter/hops⌉ − 1); with overlap those of s+D end only once step s+D+1 is estimated, so it
    is applied there. With churn (settle > 0) clients vote on s `settle` steps later still, and
    apply it once the votes have had the hops a message gets (⌈diameter/hops⌉ steps)."""
    spread = math.ceil(diameter / hops)
    complete = max(0, spread - 1) + int(overlap)
    if not settle:
        return 0, complete
    return complete + settle, complete + settle + spread


@dataclass(frozen=True)
class Protocol:
    run_seed: int
    n_origins: int
    """N: clients, i.e. origins 0..N-1."""
    perturbations: int
    """K: messages per origin per step (k = 0..K-1)."""
    steps: int
    """Steps of the run (the horizon of a decaying lr schedule)."""
    lr: float
    schedule: str
    warmup_steps: int
    weight: float
    """w in θ ← θ − lr·w·scalar·z: 1 (sum) or 1/N (mean)."""
    eps: float
    hops: int
    """Hops per step."""
    delay: int
    """Steps between originating step s and applying it: s is applied at local step s + delay."""
    max_scalar: float
    step_window: int
    """Frames may carry steps within ± this of the receiver's step."""
    overlap: bool = False
    """Hops of step t run on a background thread during step t+1's estimates (`delay` includes
    the extra step). Every client of a run must agree: it changes how many hops `drain` runs."""
    settle: int = 0
    """Churn (docs/churn-design.md, Settings and the delay): steps of hops after a step's own before clients vote on it
    (included in `delay`); 0 = strict (every origin's messages must arrive, else the run stops)."""
    vote_lag: int = 0
    """Churn: a client votes on step s at the end of local step s + vote_lag; the votes then get
    ⌈diameter / hops⌉ steps of hops, so s is applied at s + delay, delay = vote_lag + that."""
    audit_every: int = 0
    """Churn: every this many steps each client floods its state hash (0 = never)."""
    clip: float = 0.0
    """zo.clip: a step's scalars are clamped to ±clip × median(|scalar|) of that step (0 = off)."""
    audit: float = 0.0
    """trust.audit: the expected fraction of the other origins' scalars a client recomputes per
    step (0 = off). Changes no bit of an honest run, so it is not in the trajectory."""
    audit_tolerance: float = 0.0
    """trust.audit_tolerance: how far apart two honest clients' L(θ+εz) − L(θ−εz) may be, in loss
    units (0 = exact: one kind of hardware). Every client must hold the same value (it decides
    who is a liar); not in the trajectory, like `audit`."""
    max_nodes: int = 0
    """churn.max_nodes: node ids 0..max_nodes-1 may take part (0 = the founders 0..N-1 only)."""
    stride: tuple[tuple[int, int], ...] = ()
    """zo.stride as sorted (node, m) pairs with m > 1 (m = 1 changes nothing): node originates
    only on steps s with s % m == 0. () = every origin every step."""
    mean: bool = False
    """zo.aggregate is mean (with a stride, w is 1/N_s per step: `weight_at`)."""
    repair: bool = False
    """churn.repair (docs/churn-design.md, Graph repair): a committed step that leaves members out
    adds edges between the members left (membership.growth). Every client must hold the same
    value: it decides the graph."""

    # -- churn constants every client shares (timing of edge work; not settings of a run) ------
    LATE_FACTOR: ClassVar[int] = 10
    """A peer that still heartbeats is waited for up to this many timeouts per hop (it may be
    waiting on a silent node of its own; dropping it would cascade)."""
    HEAL_FACTOR: ClassVar[int] = 2
    """Over a healing transport: a client that has waited `patience_hops` for a commit waits up to
    this many more timeouts (paced) before it stops as a minority: an edge anywhere in its part
    may heal meanwhile (a stalled member wakes, a cut link comes back)."""
    HEAL_AHEAD: ClassVar[int] = 2
    """A heal proposes the exchange index this many past both ends' clocks: the other end takes
    the proposal at its next ask, one exchange after the clock it posted."""
    JOIN_GRACE: ClassVar[int] = 4
    """Exchanges from a brand-new id's claim until the heal negotiation has brought its edges up:
    the newcomer asks at its first exchange, the other end takes the proposal (HEAL_AHEAD past
    both clocks) at its next, one more for a proposal withdrawn once."""

    @cached_property
    def _strides(self) -> dict[int, int]:
        return dict(self.stride)

    def originates(self, origin: int, step: int) -> bool:
        """`origin` originates its K messages of `step` (zo.stride)."""
        return step % self._strides.get(origin, 1) == 0

    @property
    def due(self) -> Callable[[int, int], bool] | None:
        """`originates` when a stride is set, else None (every origin every step): what the
        flood, the codec and the agreement are handed."""
        return self.originates if self.stride else None

    def origins(self, step: int, members: Iterable[int] | None = None) -> list[int]:
        """The origins among `members` (default: the founders 0..N-1) due at `step`, ascending."""
        pool = range(self.n_origins) if members is None else sorted(members)
        return [o for o in pool if self.originates(o, step)]

    @property
    def ids(self) -> int:
        """How many node ids may take part: origins 0..ids-1 pass the codec's checks and fill
        the vote's member masks. N unless churn.max_nodes opens membership to new ids."""
        return max(self.n_origins, self.max_nodes)

    def roster(self, attach: int = 0) -> Roster:
        """The roster before step 0: the N founders, over `ids` possible origins."""
        return Roster(self.ids, frozenset(range(self.n_origins)), attach=attach)

    @property
    def churn(self) -> bool:
        """Steps are committed by a majority's votes (agreement.py), not required complete."""
        return self.settle > 0

    @property
    def patience_hops(self) -> int:
        """Churn: extra hops a client runs waiting for a step to be committed before it stops
        (it cannot reach a majority that agrees): four delay windows, at least 16 steps' worth."""
        return self.hops * max(16, 4 * (self.delay + 1))

    @property
    def scalar_tolerance(self) -> float:
        """The audit's tolerance on a scalar (absolute, scalar units): `audit_tolerance` / 2ε. The
        scalar is (L+ − L−) / 2ε and another kind of hardware rounds each loss differently by an
        amount of the order of an ulp of L, whatever ε and whatever the scalar's size: so its error
        is absolute, that over 2ε; a relative test would accuse honest scalars near zero."""
        return self.audit_tolerance / (2.0 * self.eps) if self.audit_tolerance else 0.0

    def audits(self, step: int) -> bool:
        """Each client floods an AUDIT note of its state after applying `step`."""
        return bool(self.audit_every) and (step + 1) % self.audit_every == 0

    @classmethod
    def of(cls, cfg: Config, diameter: int) -> Protocol:
        """The protocol of `cfg` on a topology of the given diameter (hops: 0 = the diameter)."""
        hops = cfg.flood.hops_per_step or max(1, diameter)
        overlap = cfg.flood.overlap
        settle = cfg.churn.settle
        if settle and overlap:
            raise ConfigError("churn.settle: not supported together with flood.overlap yet; set one of them")
        if cfg.trust.audit and any(m > 1 for m in cfg.zo.stride.values()):
            raise ConfigError("zo.stride: not supported together with trust.audit yet; set one of them")
        vote_lag, delay = schedule(diameter, hops, overlap, settle)
        if cfg.flood.step_window <= delay:
            raise ConfigError(
                f"flood.step_window: must exceed the flooding delay {delay} (diameter {diameter}, "
                f"{hops} hops per step{', overlap' if overlap else ''}), got {cfg.flood.step_window}"
            )
        n = cfg.topology.nodes
        return cls(
            run_seed=cfg.run.seed,
            n_origins=n,
            perturbations=cfg.zo.perturbations,
            steps=cfg.run.steps,
            lr=cfg.zo.lr,
            schedule=cfg.zo.schedule,
            warmup_steps=cfg.zo.warmup_steps,
            weight=1.0 if cfg.zo.aggregate == "sum" else 1.0 / n,
            eps=cfg.zo.eps,
            hops=hops,
            delay=delay,
            max_scalar=cfg.flood.max_scalar,
            step_window=cfg.flood.step_window,
            overlap=overlap,
            settle=settle,
            vote_lag=vote_lag,
            audit_every=cfg.churn.audit_every,
            clip=cfg.zo.clip,
            audit=cfg.trust.audit,
            audit_tolerance=cfg.trust.audit_tolerance,
            max_nodes=cfg.churn.max_nodes,
            stride=tuple(sorted((o, m) for o, m in cfg.zo.stride.items() if m > 1)),
            mean=cfg.zo.aggregate == "mean",
            repair=cfg.churn.repair,
        )

    # -- messages ------------------------------------------------------------------------------
    def seed(self, origin: int, step: int, k: int = 0) -> int:
        return rng.derive(self.run_seed, origin, step, k)

    def limits(self, lo: int, hi: int) -> Limits:
        """What a receiver accepts for steps lo..hi."""
        return Limits(
            n_origins=self.ids,
            min_step=max(0, lo),
            max_step=hi,
            max_k=self.perturbations,
            max_scalar=self.max_scalar,
            seed_of=self.seed,
            due=self.due,
        )

    def wire_limits(self, step: int) -> Limits:
        """Frames a client accepts during the hops of `step`."""
        return self.limits(step - self.step_window, step + self.step_window)

    def owed_from(self, join_step: int) -> int:
        """The first step whose committed messages a member owes a newcomer it connects at the
        hop its JOIN note (for `join_step` = e) names (docs/churn-design.md, A sponsor that fails
        before it relays): its catch-up came before step t = e − delay − 1 and held the steps
        from t − delay as its sponsor then did, so e − 2·delay − 1; none older than the
        newcomer's wire window takes there (its local step is at most e + 1 at that hop: a
        catch-up off the hop clock's phase shortens its first step)."""
        return max(join_step - 2 * self.delay - 1, join_step + 2 - self.step_window)

    @property
    def per_step(self) -> int:
        """Messages in one complete step without a stride: N·K."""
        return self.n_origins * self.perturbations

    def check_step(self, step: int, messages: Sequence[Message], members: Collection[int] | None = None) -> None:
        """Raise FrameError unless `messages` are exactly the K valid messages of every origin in
        `members` (default: all N) due at `step` (`origins`)."""
        limits = self.limits(step, step)
        for m in messages:
            limits.check(m)
        want = {(o, step, k) for o in self.origins(step, members) for k in range(self.perturbations)}
        ids = {m.id for m in messages}
        if len(ids) != len(messages) or ids != want:
            raise FrameError(
                f"step {step} holds {len(messages)} messages ({len(ids)} distinct), a complete step has "
                f"{len(want)}" + (f" (members {sorted(members)})" if members is not None else "")
            )

    def first_bad(self, cols: StepColumns, members: Sequence[frozenset[int] | None]) -> int | None:
        """The first record of `cols` that `check_step` (with `members[i]`) rejects, or None:
        the same rule as arrays (columnrules.py), for a log's whole records at once."""
        return columnrules.first_bad(self, cols, members)

    # -- the update rule -------------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        """Learning rate of `step` (0-based): linear warmup, then constant / linear decay / cosine."""
        if self.warmup_steps and step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return self.lr
        span = max(1, self.steps - self.warmup_steps)
        frac = min(1.0, (step - self.warmup_steps) / span)
        if self.schedule == "linear":
            return self.lr * (1.0 - frac)
        return self.lr * 0.5 * (1.0 + math.cos(math.pi * frac))

    def weight_at(self, step: int) -> float:
        """w of `step`: `weight`, except that a strided mean run divides by N_s, the founders due
        at `step` (every message of a strict step comes from them; under churn, as 1/N, it counts
        the schedule, not who is still a member). Without a stride exactly `weight`."""
        if not (self.stride and self.mean):
            return self.weight
        return 1.0 / max(1, len(self.origins(step)))

    def coefficient(self, m: Message) -> float:
        """c in θ ← θ + c·z(seed) for message m: −lr(step)·w·scalar (no clip)."""
        return -self.lr_at(m.step) * self.weight_at(m.step) * m.scalar

    def clip_bound(self, messages: Sequence[Message]) -> float:
        """clip × median(|scalar|) over one step's messages (math.inf when the clip is off or
        there are none). The median is taken over float64 copies of the f32 scalars, sorted, so
        it depends on the set of messages only: every client that applies the same committed set
        gets the same bits, whatever order the messages came in."""
        if not self.clip or not messages:
            return math.inf
        return self.clip * statistics.median(sorted(abs(m.scalar) for m in messages))

    def coefficients(self, messages: Sequence[Message]) -> list[float]:
        """The coefficient of each message of ONE step, in the order given (the applier hands them
        in canonical order): `coefficient(m)`, except that with the clip on a scalar whose
        magnitude exceeds `clip_bound(messages)` is first clamped to ±bound (its sign kept).
        Clip off: exactly `coefficient(m)` for each message (the bits of a run without the key)."""
        bound = self.clip_bound(messages)
        if bound == math.inf:
            return [self.coefficient(m) for m in messages]
        lr_w = -self.lr_at(messages[0].step) * self.weight_at(messages[0].step)  # as coefficient() does
        return [lr_w * (m.scalar if abs(m.scalar) <= bound else math.copysign(bound, m.scalar)) for m in messages]


def trajectory(cfg: Config, protocol: Protocol, train_digest: str) -> dict[str, Any]:
    """Every setting that changes the bits of a run's steps, as a flat JSON-ready dict.

    Left out on purpose, because they may change between a run and its resume: where the run
    lives, how fast and how it reports (run.out_dir, threads, log level, hash_steps, step_delay_s,
    slow_nodes, node_delay_s, eval.*, checkpoint.*),
    timeouts (transport.*), the device (model.device: same algorithm, other hardware), the
    frame step window, and the graph itself — the trajectory depends on the topology only through
    N and the delay. The train split enters by its digest (files, sizes and the split seed all
    act through it); the base weights by the hash stored next to this in the log header.
    run.steps matters only to a decaying lr schedule, so a constant-lr run may be extended.
    flood.overlap acts only through the delay (an overlapped run has exactly the bits of a plain
    run with the same delay), so toggling it is refused as `flood.delay (D -> D+1)`.
    """
    zo = cfg.zo
    return {
        "run.seed": cfg.run.seed,
        "run.steps": cfg.run.steps if zo.schedule != "constant" else None,
        "zo.direction": zo.direction,
        "zo.eps": zo.eps,
        "zo.lr": zo.lr,
        "zo.schedule": zo.schedule,
        "zo.warmup_steps": zo.warmup_steps,
        "zo.aggregate": zo.aggregate,
        "zo.perturbations": zo.perturbations,
        "zo.trainable": list(zo.trainable),
        "subspace.rank": cfg.subspace.rank if zo.direction == "subcge" else None,
        "subspace.refresh": cfg.subspace.refresh if zo.direction == "subcge" else None,
        "subspace.merge_every": cfg.subspace.merge_every if zo.direction == "subcge" else None,
        "subspace.forward": cfg.subspace.forward if zo.direction == "subcge" else None,
        "flood.max_scalar": cfg.flood.max_scalar,
        # only when set (some m > 1), so earlier run directories still resume; pairs survive JSON
        **({"zo.stride": [list(p) for p in protocol.stride]} if protocol.stride else {}),
        # only when set, so run directories written before the clip existed still resume
        **({"zo.clip": cfg.zo.clip} if cfg.zo.clip else {}),
        "topology.nodes": protocol.n_origins,
        # only when set (open membership), so earlier run directories still resume
        **({"churn.max_nodes": cfg.churn.max_nodes} if cfg.churn.max_nodes else {}),
        "flood.delay": protocol.delay,
        "task.name": cfg.task.name,
        "task.batch_size": cfg.task.batch_size,
        "task.max_tokens": cfg.task.max_tokens,
        "task.train_digest": train_digest,
        # Only when set, so run directories written before these keys existed still resume.
        **({"task.split": cfg.task.split, "task.alpha": cfg.task.alpha} if cfg.task.split != "iid" else {}),
        **({"task.template": cfg.task.template} if cfg.task.template else {}),
        **({"task.candidates": list(cfg.task.candidates)} if cfg.task.candidates else {}),
        **({"task.text_fields": list(cfg.task.text_fields)} if cfg.task.text_fields else {}),
        # batched simulation: scalars equal the sequential ones only up to reduction order (and
        # the grouping), so its bits are its own; absent when off, so older logs still resume
        **({"sim.batched": True, "sim.clients_per_forward": cfg.sim.clients_per_forward} if cfg.sim.batched else {}),
        "model.name": cfg.model.name,
        "model.gguf_file": cfg.model.gguf_file,
        "model.dtype": cfg.model.dtype,
        "model.tiny": dict(sorted(cfg.model.tiny.items())),
    }


def digest(records: Iterable[Any]) -> str:
    """sha256 (16 hex digits) of JSON-serialisable records, e.g. (fields, label) of each example."""
    h = hashlib.sha256()
    for r in records:
        h.update(json.dumps(r, sort_keys=True).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]
