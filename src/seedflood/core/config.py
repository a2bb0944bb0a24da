"""Typed configuration: one dataclass per component, loaded from YAML plus `--set` overrides.

Owns: the schema of a run (every key a user can write), parsing YAML and `section.field=value`
overrides, and validation. Each component receives only its own section. Any unknown key, wrong
type, non-finite number, duplicate YAML key or out-of-range value raises `ConfigError` with one
line naming the key and what is allowed.

Validation has two layers. Types are checked by pydantic (strict: a bool must be a bool, an int
must not be a float or a bool, a float takes an int but never inf/nan, unknown keys are refused)
against the section dataclasses' own annotations; its errors are rewritten here into this
module's one-line messages. Ranges and cross-field rules live in each dataclass's `__post_init__`,
which raises `ConfigError` itself, so building a section in code checks them too.

YAML is read with a SafeLoader that also resolves YAML 1.2 floats without a dot (`1e-3`, which
PyYAML's YAML 1.1 would read as text) and refuses a key written twice in one mapping.

Assumes nothing about the environment: pure Python + yaml + pydantic (no torch, no network).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml
from pydantic_core import ErrorDetails


class ConfigError(ValueError):
    """A configuration problem; the message is one line naming the key."""

    def __init__(self, message: str) -> None:
        # One line whatever went into it (a key or value quoted from a file may hold a newline).
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"))


def _require(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


@dataclass
class RunConfig:
    seed: int = 0
    """Run seed: every direction, batch and basis derives from it."""
    steps: int = 100
    """Number of ZO steps every client takes."""
    out_dir: str = "runs/default"
    """Run directory: log, metrics, checkpoints."""
    threads: int = 0
    """torch intra-op threads per process; 0 = leave torch's default."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    hash_steps: bool = False
    """Hash every client's state after every step (a consensus check; costs O(d) per step)."""

    def __post_init__(self) -> None:
        _require(self.seed >= 0, "run.seed", f"must be >= 0, got {self.seed}")
        _require(self.steps >= 1, "run.steps", f"must be >= 1, got {self.steps}")
        _require(self.threads >= 0, "run.threads", f"must be >= 0, got {self.threads}")
        _require(bool(self.out_dir), "run.out_dir", "must not be empty")


@dataclass
class ZOConfig:
    direction: Literal["subcge", "gaussian"] = "subcge"
    """Direction family: subcge (low-rank canonical coordinates) or gaussian (MeZO)."""
    eps: float = 1e-3
    """Perturbation scale: scalar = (L(θ+εz) − L(θ−εz)) / 2ε."""
    lr: float = 10.0
    """Peak learning rate; an update is θ ← θ − lr(step)·w·scalar·z."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0
    aggregate: Literal["sum", "mean"] = "sum"
    """w = 1 (sum over clients: progress per step grows with N) or 1/N (mean: lower variance)."""
    perturbations: int = 1
    """Messages (k = 0..K-1) each client originates per step."""
    trainable: list[str] = field(default_factory=lambda: ["*layers.*.weight", "*.h.*.weight"])
    """fnmatch patterns of parameter names that train; only 2-D matrices are taken."""

    def __post_init__(self) -> None:
        _require(self.eps > 0, "zo.eps", f"must be > 0, got {self.eps}")
        _require(self.lr >= 0, "zo.lr", f"must be >= 0, got {self.lr}")
        _require(self.warmup_steps >= 0, "zo.warmup_steps", "must be >= 0")
        _require(1 <= self.perturbations <= 64, "zo.perturbations", "must be in 1..64")
        _require(len(self.trainable) > 0, "zo.trainable", "needs at least one pattern")


@dataclass
class SubspaceConfig:
    rank: int = 32
    """r: columns of U (m×r) and V (k×r) per matrix; the core is r×r."""
    refresh: int = 1000
    """Steps per basis epoch: U, V are redrawn at step multiples of this."""
    merge_every: int = 0
    """Merge W ← W + U·S·Vᵀ every this many steps (and always at a refresh); must divide refresh.
    0 = once per epoch, at the refresh: replay and resume then cost O(messages) + one O(r·d)
    merge per epoch, and live steps pay one W + U·S·Vᵀ per step instead of a merge (see forward)."""
    forward: Literal["materialize", "lowrank"] = "materialize"
    """How forwards see the pending core: `materialize` computes W + U·S·Vᵀ once per state into a
    second copy of the trainable matrices (≈ one merge per step, then plain forwards); `lowrank`
    adds (x·V)·(U·S)ᵀ in every layer (no extra memory; cheaper only for few tokens per forward,
    about ≤ 128 on SmolLM2). The two differ in the last bits of every forward."""

    @property
    def merge_period(self) -> int:
        """Steps between merges (merge_every, or refresh when merge_every is 0)."""
        return self.merge_every or self.refresh

    def __post_init__(self) -> None:
        _require(1 <= self.rank <= 4096, "subspace.rank", f"must be in 1..4096, got {self.rank}")
        _require(self.refresh >= 1, "subspace.refresh", f"must be >= 1, got {self.refresh}")
        _require(self.merge_every >= 0, "subspace.merge_every", "must be >= 0 (0 = once per epoch)")
        _require(
            self.refresh % self.merge_period == 0,
            "subspace.merge_every",
            f"must divide subspace.refresh={self.refresh}, got {self.merge_every}",
        )


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
        _require(self.hops_per_step >= 0, "flood.hops_per_step", "must be >= 0 (0 = diameter)")
        _require(self.max_scalar > 0, "flood.max_scalar", "must be > 0")
        _require(self.step_window >= 1, "flood.step_window", "must be >= 1")


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
        _require(self.nodes >= 1, "topology.nodes", f"must be >= 1, got {self.nodes}")
        _require(self.rows >= 0, "topology.rows", "must be >= 0")
        _require(0.0 <= self.p <= 1.0, "topology.p", f"must be in [0, 1], got {self.p}")
        _require(self.seed >= 0, "topology.seed", f"must be >= 0, got {self.seed}")
        _require(self.k >= 2, "topology.k", f"must be >= 2, got {self.k}")
        _require(self.degree >= 1, "topology.degree", f"must be >= 1, got {self.degree}")
        _require(self.kind != "file" or bool(self.file), "topology.file", "is required when kind = file")


@dataclass
class TaskConfig:
    name: str = "rt"
    """Registered task name (rt, sst2, rte, cb, boolq, wic, multirc, copa, synthetic) or `table`
    (your own csv/tsv/json/jsonl/parquet files, described by the keys below)."""
    data_files: dict[str, str] = field(default_factory=dict)
    """Optional local files per split, e.g. {train: a.csv, test: b.csv}."""
    train_examples: int = 1000
    dev_examples: int = 500
    test_examples: int = 1000
    batch_size: int = 16
    """Examples per client per step."""
    max_tokens: int = 64
    """Input text is cut to this many tokens before the template is applied."""
    split: Literal["iid", "dirichlet"] = "iid"
    """How the train split is dealt to clients: iid (every N-th example) or dirichlet (per label,
    client shares drawn from Dirichlet(alpha); every client still gets >= 1 example)."""
    alpha: float = 0.5
    """Dirichlet concentration (split = dirichlet): small = each client sees few labels; large = iid."""
    template: str = ""
    """Prompt with {column} slots, e.g. "{text} It was" (required for table; for a registered task
    it replaces MeZO's prompt; "" = the task's own). {{ and }} write literal braces."""
    candidates: list[str] = field(default_factory=list)
    """Verbalizer: one string per label, in label order, appended verbatim to the prompt (so
    usually with a leading space: [" terrible", " great"]). Required for table; for a
    registered task it replaces MeZO's verbalizer; [] = the task's own."""
    text_fields: list[str] = field(default_factory=list)
    """table: the template's columns cut to max_tokens tokens ([] = every column it names)."""
    label_field: str = "label"
    """table: the column holding the label."""
    label_values: list[str] = field(default_factory=list)
    """table: the raw label values in label order (e.g. [negative, positive]; matched as text,
    case-insensitively; a boolean reads as true/false; quote "yes"/"no", which YAML reads as
    booleans). [] = labels are the integers 0..C-1."""

    def __post_init__(self) -> None:
        for key in ("train_examples", "dev_examples", "test_examples"):
            _require(getattr(self, key) >= 0, f"task.{key}", "must be >= 0")
        _require(self.batch_size >= 1, "task.batch_size", "must be >= 1")
        _require(self.max_tokens >= 4, "task.max_tokens", "must be >= 4")
        _require(self.alpha > 0, "task.alpha", f"must be > 0, got {self.alpha}")
        slots = self.template_slots(self.template) if self.template else []
        _require(not self.template or bool(slots), "task.template", f"names no {{column}}, got {self.template!r}")
        if self.name == "table":
            _require(bool(self.template), "task.template", 'is required for task table, e.g. "{text} It was"')
            _require(bool(self.candidates), "task.candidates", 'is required for task table, e.g. [" bad", " good"]')
            _require(
                self.label_field not in slots and "label" not in slots,
                "task.template",
                f"must not show the label column, got {self.template!r}",
            )
        if self.candidates:
            _require(len(self.candidates) >= 2, "task.candidates", f"needs at least 2 strings, got {self.candidates!r}")
            _require(all(self.candidates), "task.candidates", f"must not hold an empty string, got {self.candidates!r}")
            _require(
                len(set(self.candidates)) == len(self.candidates),
                "task.candidates",
                f"must be distinct, got {self.candidates!r}",
            )
        for key in ("text_fields", "label_values"):
            values = getattr(self, key)
            _require(all(v.strip() for v in values), f"task.{key}", f"must not hold an empty string, got {values!r}")
        unknown = [f for f in self.text_fields if f not in slots]
        _require(not unknown, "task.text_fields", f"{unknown!r} not named in task.template (it names {slots!r})")
        _require(bool(self.label_field.strip()), "task.label_field", "must not be empty")
        lowered = [v.strip().lower() for v in self.label_values]
        _require(
            len(set(lowered)) == len(lowered),
            "task.label_values",
            f"must be distinct (case-insensitively), got {self.label_values!r}",
        )
        _require(
            not self.label_values or not self.candidates or len(self.label_values) == len(self.candidates),
            "task.label_values",
            f"has {len(self.label_values)} values but task.candidates has {len(self.candidates)} (one per label)",
        )

    @staticmethod
    def template_slots(template: str) -> list[str]:
        """The {column} slots of a task template, in order of first use; ConfigError (task.template)
        on a malformed one: unbalanced braces, an empty/positional slot, or a conversion, format spec,
        attribute or index (only a plain column name is allowed)."""
        import string

        out: list[str] = []
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as e:
            raise ConfigError(f"task.template: {e} in {template!r}") from None
        for _, name, spec, conversion in parsed:
            if name is None:
                continue
            _require(
                bool(name.strip()) and not name.isdigit(),
                "task.template",
                f"slots must name a column, got {template!r}",
            )
            _require(
                not (spec or conversion or any(c in name for c in ".[")),
                "task.template",
                f"slot {{{name}}} must be a plain column name (no !conversion, :format, . or [), got {template!r}",
            )
            if name not in out:
                out.append(name)
        return out


@dataclass
class ModelConfig:
    name: str = "smollm2-135m"
    """Hub id, local directory, 'smollm2-135m' (the PyPI-shipped GGUF) or 'tiny' (random, for tests)."""
    gguf_file: str = ""
    """GGUF file name inside `name` when it is a directory."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    """cpu, cuda, or cuda:N."""
    tiny: dict[str, int] = field(default_factory=dict)
    """Overrides of the tiny random model's config (hidden_size, num_hidden_layers, ...)."""

    def __post_init__(self) -> None:
        _require(bool(self.name), "model.name", "must not be empty")
        _require(
            self.device == "cpu" or self.device.startswith("cuda"),
            "model.device",
            f"must be cpu, cuda or cuda:N, got {self.device!r}",
        )


@dataclass
class EvalConfig:
    every: int = 10
    """Score the consensus model every this many steps (0 = only at the end)."""
    batch_size: int = 32
    attach: int = 0
    """Topology node the evaluator attaches to as a leaf."""
    client_logs: str = "clients"
    """Churn runs: where each client keeps its own copy of the agreed log (node-N/: config.yaml,
    log.bin, report.json), relative to run.out_dir unless absolute, on the client's own disk. An
    evaluator that could not get a step from the stream (restarted after the clients finished)
    takes it from the longest client log it can read here; any copy replays (`seedflood replay
    DIR/node-N`). "" = none: a step the evaluator misses is then on no disk once the clients exit."""

    def __post_init__(self) -> None:
        _require(self.every >= 0, "eval.every", "must be >= 0")
        _require(self.batch_size >= 1, "eval.batch_size", "must be >= 1")
        _require(self.attach >= 0, "eval.attach", "must be >= 0")


@dataclass
class CheckpointConfig:
    every: int = 50
    """Write a full checkpoint (state + HF model dir) every this many steps (0 = only at the end)."""
    hf_model: bool = True
    """Also materialize a save_pretrained directory."""
    resume: bool = True
    """Resume from the run directory's latest checkpoint + log when one exists."""

    def __post_init__(self) -> None:
        _require(self.every >= 0, "checkpoint.every", "must be >= 0")


@dataclass
class TransportConfig:
    backend: Literal["gloo"] = "gloo"
    timeout_s: float = 300.0
    """Process-group timeout: a silent peer fails the run after this long."""
    startup_timeout_s: float = 600.0
    """Start-up bound, apart from the hop timeout: how long every process waits for the others to
    load their model and reach the rendezvous (said on screen while it waits). A client later
    than this is left out at step 0 (churn) or stops the run (strict); an evaluator waits this
    long (at least 10 × timeout_s) for a client to stream to it."""

    def __post_init__(self) -> None:
        _require(self.timeout_s > 0, "transport.timeout_s", "must be > 0")
        _require(self.startup_timeout_s > 0, "transport.startup_timeout_s", "must be > 0")


@dataclass
class ChurnConfig:
    """Surviving failures (docs/design.md §13). `settle` > 0 turns it on: no step is applied until
    a quorum of the last agreed roster committed its content, so clients may crash, stall or be
    cut off while a connected majority trains on, and no timing can fork the run."""

    settle: int = 0
    """Extra steps between a step's hops and the clients' votes on it (part of the delay, so it
    changes the bits). 0 = strict: every client must deliver every step, a failure stops the run.
    Safety does not depend on it; more settle means fewer split votes (and waits) after a failure."""
    audit_every: int = 0
    """Every this many steps each client floods the hash of its state; a client whose hash differs
    from the majority's is named and excluded. 0 = no audits. Needs settle >= 1."""

    def __post_init__(self) -> None:
        _require(
            self.settle >= 0, "churn.settle", f"must be >= 0 (0 = strict, no failures survived), got {self.settle}"
        )
        _require(self.audit_every >= 0, "churn.audit_every", f"must be >= 0 (0 = no audits), got {self.audit_every}")
        _require(
            not self.audit_every or self.settle,
            "churn.audit_every",
            "needs churn.settle >= 1 (an excluded client is handled like a crashed one)",
        )


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
        _require(self.clients_per_forward >= 0, "sim.clients_per_forward", "must be >= 0 (0 = all)")


@dataclass
class AlgorithmConfig:
    """Which training algorithm a run uses. `seedflood` is the product; the others are the
    paper's baselines, run by `seedflood simulate` / `seedflood compare` over the same transport,
    byte counter and evaluator (docs/design.md §12). Keys other than `name` act only on the
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
        _require(self.lr >= 0, "algorithm.lr", f"must be >= 0 (0 = the algorithm's default), got {self.lr}")
        _require(self.gossip_every >= 1, "algorithm.gossip_every", f"must be >= 1, got {self.gossip_every}")
        _require(0 < self.gamma <= 1, "algorithm.gamma", f"must be in (0, 1], got {self.gamma}")
        _require(0 < self.topk <= 1, "algorithm.topk", f"must be in (0, 1], got {self.topk}")
        _require(self.inner_steps >= 1, "algorithm.inner_steps", f"must be >= 1, got {self.inner_steps}")
        _require(self.outer_lr > 0, "algorithm.outer_lr", f"must be > 0, got {self.outer_lr}")
        _require(
            0 <= self.outer_momentum < 1, "algorithm.outer_momentum", f"must be in [0, 1), got {self.outer_momentum}"
        )
        _require(self.lora_rank >= 1, "algorithm.lora_rank", f"must be >= 1, got {self.lora_rank}")
        _require(self.lora_alpha > 0, "algorithm.lora_alpha", f"must be > 0, got {self.lora_alpha}")
        _require(len(self.lora_targets) > 0, "algorithm.lora_targets", "needs at least one module name")
        _require(
            all(t.strip() and "." not in t for t in self.lora_targets),
            "algorithm.lora_targets",
            f"must be module names without dots, e.g. [q_proj, v_proj], got {self.lora_targets!r}",
        )


@dataclass
class Config:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    run: RunConfig = field(default_factory=RunConfig)
    zo: ZOConfig = field(default_factory=ZOConfig)
    subspace: SubspaceConfig = field(default_factory=SubspaceConfig)
    flood: FloodConfig = field(default_factory=FloodConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    churn: ChurnConfig = field(default_factory=ChurnConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    source: str = field(default="", compare=False)
    """Path of the YAML this came from ('' if built in code); not a user key."""

    def __post_init__(self) -> None:
        _require(
            self.eval.attach < self.topology.nodes,
            "eval.attach",
            f"must name a node in 0..{self.topology.nodes - 1}, got {self.eval.attach}",
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d


SECTIONS: dict[str, type] = {
    f.name: f.default_factory().__class__  # type: ignore[misc]
    for f in dataclasses.fields(Config)
    if f.name != "source"
}


def flat(d: Mapping[str, Any]) -> dict[str, Any]:
    """{section: {key: value}} -> {"section.key": value}, the names `--set` takes.

    One level only: a mapping-valued field (model.tiny, task.data_files) stays one value, and a
    top-level entry that is not a mapping keeps its own name.
    """
    out: dict[str, Any] = {}
    for name, section in d.items():
        if isinstance(section, Mapping):
            for key, value in section.items():
                out[f"{name}.{key}"] = value
        else:
            out[str(name)] = section
    return out


# --- type validation (pydantic) ------------------------------------------------------------------

_STRICT = pydantic.ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


@functools.cache
def _fields_model(cls: type) -> type[pydantic.BaseModel]:
    """A pydantic model with the fields and annotations of the section dataclass `cls`.

    Every field defaults to None and is left out of the result unless the input set it, so the
    defaults stay the dataclass's own and `__post_init__` runs (raising ConfigError) on `cls(**set)`.
    """
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {f.name: (hints[f.name], None) for f in dataclasses.fields(cls)}
    return pydantic.create_model(f"{cls.__name__}Fields", __config__=_STRICT, **fields)


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    return getattr(tp, "__name__", str(tp))


def _annotation(cls: type, loc: tuple[int | str, ...]) -> Any:
    """The annotation a pydantic error location points at inside section `cls`."""
    is_key = loc[-1] == "[key]"  # (field, ..., bad_key, "[key]"): the mapping's key type
    tp: Any = typing.get_type_hints(cls)[loc[0]]
    for _ in loc[1:-2] if is_key else loc[1:]:
        tp = (typing.get_args(tp) or (Any,))[-1]  # list[X] -> X, dict[K, V] -> V
    return (typing.get_args(tp) or (Any,))[0] if is_key else tp


def _key(name: str, loc: tuple[int | str, ...]) -> str:
    """'section.field', 'section.field[3]' or 'section.field.sub'; a bad mapping key names the mapping."""
    parts = loc[:-2] if loc[-1] == "[key]" else loc
    return name + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


_MESSAGES = {
    "bool_type": "must be true or false",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
}


def _message(name: str, cls: type, err: ErrorDetails) -> str:
    """One pydantic error as this module's one-line message."""
    loc, kind, value = err["loc"], err["type"], err.get("input")
    if kind in ("extra_forbidden", "invalid_key"):
        allowed = ", ".join(sorted(f.name for f in dataclasses.fields(cls)))
        return f"unknown key '{name}.{loc[0]}' (allowed in {name}: {allowed})"
    key, tp = _key(name, loc), _annotation(cls, loc)
    if kind == "literal_error":
        allowed = ", ".join(map(str, typing.get_args(tp)))
        return f"{key}: must be one of {allowed}; got {value!r}"
    if kind == "list_type":
        (item,) = typing.get_args(tp) or (Any,)
        return f"{key}: must be a list of {_type_name(item)}, got {value!r}"
    what = _MESSAGES.get(kind)
    if what is None:  # a kind this schema does not produce today: pydantic's own one-line text
        what = str(err["msg"]).splitlines()[0]
    if loc[-1] == "[key]":
        what = "keys " + what
    return f"{key}: {what}, got {value!r}"


def _build_section(name: str, cls: type, values: Any) -> Any:
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise ConfigError(f"{name}: must be a mapping of keys, got {values!r}")
    try:
        checked = _fields_model(cls).model_validate(dict(values))
    except pydantic.ValidationError as e:
        order = {k: i for i, k in enumerate(values)}
        first = min(e.errors(), key=lambda err: order.get(err["loc"][0], len(order)))  # as written
        raise ConfigError(_message(name, cls, first)) from None
    return cls(**{k: getattr(checked, k) for k in checked.model_fields_set})


def from_dict(data: Mapping[str, Any], source: str = "") -> Config:
    """Build and validate a Config from a nested mapping (the YAML document)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"config must be a mapping of sections, got {type(data).__name__}")
    for name in data:
        if name not in SECTIONS:
            raise ConfigError(f"unknown section '{name}' (allowed: {', '.join(SECTIONS)})")
    sections = {name: _build_section(name, cls, data.get(name)) for name, cls in SECTIONS.items()}
    return Config(**sections, source=source)


# --- YAML -----------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader + the YAML 1.2 floats YAML 1.1 reads as text: 1e-3, 2E5, 1.5e3, .5e-2."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?|[-+]?\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


class _DuplicateKey(yaml.YAMLError):
    """A key written twice in one YAML mapping; `key` is its dotted path in the document."""

    def __init__(self, key: str, line: int, first: int) -> None:
        super().__init__(f"duplicate key '{key}' at line {line} (first at line {first})")
        self.key, self.line, self.first = key, line, first


def _check_duplicates(node: yaml.Node, path: str, seen: set[int]) -> None:
    """Raise _DuplicateKey for the first mapping in `node` that names a scalar key twice."""
    if id(node) in seen:  # an alias: already walked (and recursive anchors must not loop)
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_line: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            child = path
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                child = f"{path}.{key_node.value}" if path else str(key_node.value)
                ident = (key_node.tag, key_node.value)
                line = key_node.start_mark.line + 1
                if ident in first_line:
                    raise _DuplicateKey(child, line, first_line[ident])
                first_line[ident] = line
            _check_duplicates(value_node, child, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(item, f"{path}[{i}]", seen)


def _parse_yaml(text: str, path: str = "") -> Any:
    """One YAML document (None if empty) read with `_Loader`; keys are named under `path`."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_duplicates(node, path, set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def parse_override(text: str) -> tuple[str, str, Any]:
    """'section.field=value' -> (section, field, YAML-parsed value)."""
    key, sep, raw = text.partition("=")
    if not sep or "." not in key:
        raise ConfigError(f"override {text!r} must look like section.field=value")
    key = key.strip()
    section, _, name = key.partition(".")
    try:
        value = _parse_yaml(raw, key) if raw.strip() else ""
    except _DuplicateKey as e:
        raise ConfigError(f"{key}: value {raw!r} has duplicate key '{e.key}'") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{key}: value {raw!r} is not valid YAML ({e.__class__.__name__})") from None
    return section, name, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `section.field=value` applied (validated later)."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    for text in overrides:
        section, name, value = parse_override(text)
        if section not in SECTIONS:
            raise ConfigError(f"unknown section '{section}' in {text!r} (allowed: {', '.join(SECTIONS)})")
        current = out.get(section)
        if current is None:
            current = out[section] = {}
        if not isinstance(current, dict):
            raise ConfigError(f"{section}: must be a mapping of keys, got {current!r}")
        current[name] = value
    return out


def read_yaml(path: str | Path, what: str = "config file", error: type[Exception] = ConfigError) -> Any:
    """The parsed YAML document at `path`; a missing file, bad YAML or a key written twice in one
    mapping raises `error` in one line. Floats like `1e-3` read as floats (YAML 1.2)."""
    p = Path(path)
    if not p.is_file():
        raise error(f"{what} {str(p)!r} does not exist")
    try:
        return _parse_yaml(p.read_text())
    except _DuplicateKey as e:
        raise error(f"{p}: line {e.line}: duplicate key '{e.key}' (first at line {e.first})") from None
    except yaml.YAMLError as e:
        raise error(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None


def load(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (or the defaults when path is None) and apply overrides."""
    data: dict[str, Any] = {}
    source = ""
    if path is not None:
        p = Path(path)
        loaded = read_yaml(p)
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, Mapping):
            raise ConfigError(f"{p}: must be a mapping of sections")
        data = dict(loaded)
        source = str(p.resolve())
    data = apply_overrides(data, overrides or [])
    return from_dict(data, source=source)


def dump(cfg: Config) -> str:
    """The config as YAML (what a run records next to its log)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
