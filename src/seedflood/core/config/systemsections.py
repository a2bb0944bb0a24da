"""The config sections of how the decentralized system runs: topology, flood, transport, churn,
eval, checkpoint, sim, and which algorithm (seedflood or a baseline) the clients run.

Owns: one dataclass per section, its keys (their annotations are the types pydantic checks in
seedflood.core.config.validation; their docstrings are the user documentation of every key) and its
range and cross-field rules, checked in `__post_init__` so a section built in code is checked
too. `AlgorithmName`, every `algorithm.name`.

Assumes nothing about the environment: pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from seedflood.core.config.configerror import require
from seedflood.core.config.hostport import host_port


@dataclass
class FloodConfig:
    hops_per_step: int = 0
    """Hops per step; 0 = the diameter (every step completes before the next one)."""
    max_scalar: float = 1e6
    """Frames carrying |scalar| above this are rejected."""
    step_window: int = 64
    """Frames with a step further than this ahead of the receiver's step are rejected."""
    overlap: bool = False
    """Run the hops of step t on a background thread while step t+1's forwards compute (step
    time → max(compute, communication)); costs one more step of staleness (protocol delay + 1)."""

    def __post_init__(self) -> None:
        require(self.hops_per_step >= 0, "flood.hops_per_step", "must be >= 0 (0 = diameter)")
        require(self.max_scalar > 0, "flood.max_scalar", "must be > 0")
        require(self.step_window >= 1, "flood.step_window", "must be >= 1")


@dataclass
class TopologyConfig:
    kind: Literal[
        "ring",
        "grid",
        "torus",
        "complete",
        "star",
        "tree",
        "random_regular",
        "erdos_renyi",
        "watts_strogatz",
        "file",
    ] = "ring"
    nodes: int = 4
    """Number of clients (topology nodes 0..N-1 = ranks 1..N)."""
    rows: int = 0
    """grid/torus rows; 0 = as square as possible."""
    degree: int = 3
    """random_regular degree."""
    p: float = 0.3
    """erdos_renyi edge probability / watts_strogatz rewiring probability."""
    k: int = 4
    """watts_strogatz neighbours per node."""
    seed: int = 0
    """Seed of the random graph builders."""
    file: str = ""
    """Edge-list YAML (kind = file); relative paths resolve against the config file, then topologies/."""

    def __post_init__(self) -> None:
        require(self.nodes >= 1, "topology.nodes", f"must be >= 1, got {self.nodes}")
        require(self.rows >= 0, "topology.rows", "must be >= 0")
        require(0.0 <= self.p <= 1.0, "topology.p", f"must be in [0, 1], got {self.p}")
        require(self.seed >= 0, "topology.seed", f"must be >= 0, got {self.seed}")
        require(self.k >= 2, "topology.k", f"must be >= 2, got {self.k}")
        require(self.degree >= 1, "topology.degree", f"must be >= 1, got {self.degree}")
        require(self.kind != "file" or bool(self.file), "topology.file", "is required when kind = file")


@dataclass
class EvalConfig:
    every: int = 10
    """Score the consensus model every this many steps (0 = only at the end)."""
    trackers: list[Literal["mlflow", "trackio", "wandb"]] = field(default_factory=list)
    """Experiment trackers the evaluator also sends its metrics to, beside metrics.jsonl and
    TensorBoard (always written, in tb/): each gets the run's settings, every score, a churn
    run's health and the final state hash, in a local store under trackers/ of the run directory
    (W&B offline). Each needs its package (`pip install 'seedflood[mlflow]'`, `[trackio]`,
    `[wandb]`); the preflight refuses one that is missing. Reporting only: never in the trajectory."""
    batch_size: int = 32
    attach: int = 0
    """Topology node the evaluator attaches to as a leaf."""
    client_logs: str = "clients"
    """Churn runs: where each client keeps its own copy of the agreed log (node-N/: config.yaml,
    log.bin, report.json), relative to run.out_dir unless absolute, on the client's own disk. An
    evaluator that could not get a step from the stream (restarted after the clients finished)
    takes it from the longest client log it can read here; any copy replays (`seedflood replay
    DIR/node-N`). "" = none: a step the evaluator misses is then on no disk once the clients exit."""
    device: str = ""
    """Where the evaluator (rank 0) computes. "" = as model.device says for every process (with
    cuda: GPU 0 of its host, shared with the client of local rank GPUs, i.e. client 7 on 8 GPUs
    with 8 clients); "own" = a GPU of its own, cuda:0, the clients of its host spread over the
    others (needs model.device=cuda, 2 GPUs); "cpu" = off the GPUs, the clients of its host
    spread over all of them from cuda:0; "cuda:K" = GPU K, shared with the client placed there.
    `seedflood world-size` prints the plan. Same algorithm, other hardware: the evaluator's bits
    equal the clients' only where both devices compute the update alike (its hash is checked
    against theirs at the end: summary.json's consensus)."""

    def __post_init__(self) -> None:
        require(self.every >= 0, "eval.every", "must be >= 0")
        require(
            len(set(self.trackers)) == len(self.trackers), "eval.trackers", f"names a tracker twice: {self.trackers}"
        )
        require(self.batch_size >= 1, "eval.batch_size", "must be >= 1")
        require(self.attach >= 0, "eval.attach", "must be >= 0")
        kind, colon, index = self.device.partition(":")
        require(
            self.device in ("", "own", "cpu") or (kind == "cuda" and colon == ":" and index.isdigit()),
            "eval.device",
            f'must be "", own, cpu or cuda:K, got {self.device!r}',
        )


@dataclass
class CheckpointConfig:
    every: int = 50
    """Write a full checkpoint (state + HF model dir) every this many steps (0 = only at the end)."""
    hf_model: bool = True
    """Also materialize a save_pretrained directory."""
    resume: bool = True
    """Resume from the run directory's latest checkpoint + log when one exists."""

    def __post_init__(self) -> None:
        require(self.every >= 0, "checkpoint.every", "must be >= 0")


@dataclass
class TransportConfig:
    timeout_s: float = 300.0
    """Process-group timeout: a silent peer fails the run after this long."""
    startup_timeout_s: float = 600.0
    """Start-up bound, apart from the hop timeout: how long every process waits for the others to
    load their model and reach the rendezvous (said on screen while it waits). A client later
    than this is left out at step 0 (churn) or stops the run (strict); an evaluator waits this
    long (at least 10 × timeout_s) for a client to stream to it."""

    def __post_init__(self) -> None:
        require(self.timeout_s > 0, "transport.timeout_s", "must be > 0")
        require(self.startup_timeout_s > 0, "transport.startup_timeout_s", "must be > 0")


@dataclass
class ChurnConfig:
    """Surviving failures (docs/churn-design.md, Settings and the delay). `settle` > 0 turns it on: no step is applied until
    a quorum of the last agreed roster committed its content, so clients may crash, stall or be
    cut off while a connected majority trains on, and no timing can fork the run."""

    settle: int = 0
    """Extra steps between a step's hops and the clients' votes on it (part of the delay, so it
    changes the bits). 0 = strict: every client must deliver every step, a failure stops the run.
    Safety does not depend on it; more settle means fewer split votes (and waits) after a failure."""
    audit_every: int = 0
    """Every this many steps each client floods the hash of its state; a client whose hash differs
    from the majority's is named and excluded. 0 = no audits. Needs settle >= 1."""
    max_nodes: int = 0
    """Open membership: node ids 0..max_nodes-1 may take part, so brand-new ids topology.nodes ..
    max_nodes-1 may join a running run (in process, and launched: SEEDFLOOD_NODE; docs/churn.md). 0 = the
    topology's nodes and no others. Needs settle >= 1; recorded in the log (replay needs it)."""
    repair: bool = False
    """Graph repair: a committed step that leaves members out also links the members left
    under-linked, split or too far apart, by a rule over the committed history (in process and
    launched: docs/churn.md). Changes the graph, never how a step is applied: not in the
    trajectory. Every client of a run must set it alike. Needs settle >= 1."""
    log_server: str = ""
    """HOST:PORT of a `seedflood serve-log`: a restarted or brand-new client fetches the decided
    prefix there and checks it before it asks for a sponsor, which then sends only the steps
    after it (docs/churn.md). "" = the sponsor sends the whole log. A server that is down, slow
    or serves a bad prefix costs one line and the whole log. Not in the trajectory."""

    def __post_init__(self) -> None:
        require(self.settle >= 0, "churn.settle", f"must be >= 0 (0 = strict, no failures survived), got {self.settle}")
        require(self.audit_every >= 0, "churn.audit_every", f"must be >= 0 (0 = no audits), got {self.audit_every}")
        require(
            not self.audit_every or self.settle >= 1,
            "churn.audit_every",
            "needs churn.settle >= 1 (an excluded client is handled like a crashed one)",
        )
        require(0 <= self.max_nodes <= 100_000, "churn.max_nodes", f"must be in 0..100000, got {self.max_nodes}")
        require(
            not self.max_nodes or self.settle >= 1,
            "churn.max_nodes",
            "needs churn.settle >= 1 (a new id is admitted by a committed step)",
        )
        require(
            not self.repair or self.settle >= 1, "churn.repair", "needs churn.settle >= 1 (a committed step repairs)"
        )
        require(
            not self.log_server or host_port(self.log_server) is not None,
            "churn.log_server",
            f"must be HOST:PORT (a `seedflood serve-log`), got {self.log_server!r}",
        )
        require(not self.log_server or self.settle > 0, "churn.log_server", "needs churn.settle >= 1 (a churn run)")


@dataclass
class TrustConfig:
    """Peers that may not follow the protocol (docs/trust.md)."""

    sign: bool = False
    """Origins sign what they originate and voters their votes (Ed25519); a client drops and
    counts anything unsigned or forged, so nobody without a node's key can act as that node."""
    keys: str = ""
    """The directory `seedflood keys` wrote: roster.json (every node's public key) and, on each
    node, its own node-<i>.key."""
    audit: float = 0.0
    """Verification by recomputation: the expected fraction of the other origins' scalars each
    client recomputes per step (0 = off; 1 = every scalar). Costs rate × (N−1) × K × 2 forwards
    per client per step; a scalar that does not recompute bit for bit (or within
    audit_tolerance) is evidence against its origin (docs/trust.md, Verification by recomputation). Changes no bit while nobody lies."""
    audit_tolerance: float = 0.0
    """What the audit may assume of the clients' hardware. 0 = one kind (same CPU instruction
    set, libraries and thread count): a recomputed scalar must equal the sent one bit for bit.
    Otherwise a run that mixes kinds: the largest difference in loss units (nats) allowed between
    two clients' L(θ+εz) − L(θ−εz), so a scalar passes within this / (2·zo.eps) of its
    recomputation and a liar may shift each scalar that much unseen (docs/trust.md, Mixed
    hardware: 2e-5 for a run mixing CPU instruction sets; `python -m seedflood.bench.auditkinds`
    measures it). Every client must use the same value. Needs trust.audit > 0."""

    def __post_init__(self) -> None:
        require(
            not self.sign or bool(self.keys),
            "trust.keys",
            "needed when trust.sign is true: the directory `seedflood keys --nodes N --out DIR` writes",
        )
        require(0.0 <= self.audit <= 1.0, "trust.audit", f"must be a rate in [0, 1] (0 = off), got {self.audit}")
        require(
            self.audit_tolerance >= 0.0,
            "trust.audit_tolerance",
            f"must be >= 0 (loss units; 0 = exact), got {self.audit_tolerance}",
        )
        require(not self.audit_tolerance or self.audit > 0.0, "trust.audit_tolerance", "needs trust.audit > 0")


AlgorithmName = Literal[
    "seedflood", "dzsgd", "dsgd", "choco", "diloco", "mezo", "dzsgd-lora", "dsgd-lora", "choco-lora"
]
"""Every `algorithm.name`, in `seedflood compare`'s table order."""


@dataclass
class SimConfig:
    """`seedflood simulate` only (the shared-model simulation); a launched run ignores it."""

    batched: bool = False
    """Compute every client's perturbed forwards of a step in one batched forward (batched.py):
    scalars equal the sequential ones up to floating-point reduction order, so the run is no
    longer bit-identical to a launched run (it is still exact to replay from its own log).
    false = one client after another, bit-identical to the launched run."""
    clients_per_forward: int = 0
    """Clients stacked into one batched forward (each brings 2·K perturbed batches); 0 = all N.
    Bounds activation memory; also changes GEMM shapes, so the scalars' last bits."""

    def __post_init__(self) -> None:
        require(self.clients_per_forward >= 0, "sim.clients_per_forward", "must be >= 0 (0 = all)")


@dataclass
class AlgorithmConfig:
    """Which training algorithm a run uses. `seedflood` is the product; the others are the
    paper's baselines, run by `seedflood simulate` / `seedflood compare` over the same transport,
    byte counter and evaluator (docs/design.md, Experiments). Keys other than `name` act only on the
    baselines that read them."""

    name: AlgorithmName = "seedflood"
    """seedflood (this system), dzsgd (gossip ZO: a MeZO step, then Metropolis-Hastings mixing),
    dsgd (gossip first-order SGD), choco (CHOCO-SGD, top-k compressed), diloco (inner AdamW,
    outer Nesterov on the averaged pseudo-gradient), mezo (one client, all the data). A `-lora`
    name is that gossip algorithm on LoRA adapters only (the paper's DSGD-LoRA, ChocoSGD-LoRA
    and DZSGD-LoRA): the base weights stay frozen and identical on every client, only the
    adapters train and travel. diloco, mezo and seedflood have no LoRA variant."""
    lr: float = 0.0
    """Local step size of a baseline (ZO SGD for dzsgd/mezo, SGD for dsgd/choco, inner AdamW for
    diloco); 0 = that algorithm's default (baselines.DEFAULT_LR)."""
    gossip_every: int = 1
    """dzsgd/dsgd/choco: local steps between two mixing rounds."""
    wire: Literal["frames", "counted"] = "frames"
    """dzsgd/dsgd (and their -lora variants): how a mixing round's vectors reach the neighbours.
    `frames`: each a DENSE tensor frame through the in-process transport, whose byte counter
    counts it as sent. `counted`: each neighbour's vector is read where it lies (its device), and
    each directed edge is counted the bytes its frame would be (the same count; on the CPU the
    same bits, since the frame is lossless): no encode, CRC or decode per edge, which is most of
    a dense round's time on a GPU host (0.91 s per 106 M-scalar frame on the H200's CPU), at
    the cost of 2N vectors at the round's peak instead of about N."""
    gamma: float = 0.5
    """choco: consensus step size γ."""
    topk: float = 0.01
    """choco: fraction of a tensor's entries sent (top-k by magnitude of x − x̂)."""
    inner_steps: int = 5
    """diloco: H, inner AdamW steps per outer step."""
    outer_lr: float = 0.7
    """diloco: outer Nesterov learning rate."""
    outer_momentum: float = 0.9
    """diloco: outer Nesterov momentum."""
    compress: Literal["none", "int8"] = "none"
    """diloco: pseudo-gradient compression on the wire (int8: per-tensor absmax scale)."""
    overlap: bool = False
    """diloco: DiLoCoX's one-step-delayed overlap (apply the previous outer round's average while
    the next H inner steps run)."""
    lora_rank: int = 8
    """-lora algorithms: r, the adapters' rank (MeZO's LoRA setting, and the paper's: r = 8)."""
    lora_alpha: float = 16.0
    """-lora algorithms: α; the adapter's output is scaled by α / r (MeZO's and peft's 16)."""
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    """-lora algorithms: the nn.Linear modules that get adapters, by the last part of their name
    (Llama and OPT name the attention's query and value projections q_proj and v_proj)."""

    def __post_init__(self) -> None:
        require(self.lr >= 0, "algorithm.lr", f"must be >= 0 (0 = the algorithm's default), got {self.lr}")
        require(self.gossip_every >= 1, "algorithm.gossip_every", f"must be >= 1, got {self.gossip_every}")
        require(0 < self.gamma <= 1, "algorithm.gamma", f"must be in (0, 1], got {self.gamma}")
        require(0 < self.topk <= 1, "algorithm.topk", f"must be in (0, 1], got {self.topk}")
        require(self.inner_steps >= 1, "algorithm.inner_steps", f"must be >= 1, got {self.inner_steps}")
        require(self.outer_lr > 0, "algorithm.outer_lr", f"must be > 0, got {self.outer_lr}")
        require(
            0 <= self.outer_momentum < 1, "algorithm.outer_momentum", f"must be in [0, 1), got {self.outer_momentum}"
        )
        require(self.lora_rank >= 1, "algorithm.lora_rank", f"must be >= 1, got {self.lora_rank}")
        require(self.lora_alpha > 0, "algorithm.lora_alpha", f"must be > 0, got {self.lora_alpha}")
        require(len(self.lora_targets) > 0, "algorithm.lora_targets", "needs at least one module name")
        require(
            all(t.strip() and "." not in t for t in self.lora_targets),
            "algorithm.lora_targets",
            f"must be module names without dots, e.g. [q_proj, v_proj], got {self.lora_targets!r}",
        )
