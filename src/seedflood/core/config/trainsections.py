"""The config sections of what is trained and how: run, zo, subspace, task, model.

Owns: one dataclass per section, its keys (their annotations are the types pydantic checks in
seedflood.core.config.validation; their docstrings are the user documentation of every key) and its
range and cross-field rules, checked in `__post_init__` so a section built in code is checked
too. The whole config, its loading and the other sections live in seedflood.core.config.runconfig and
seedflood.core.config.systemsections.

Assumes nothing about the environment: pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from seedflood.core.config.configerror import ConfigError, require


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
    step_delay_s: float = 0.0
    """Seconds a client (launched or in process) sleeps in each step before its forwards: emulates a
    slower device (a run's bits do not change; only its pace). 0 = none."""
    slow_nodes: list[int] = field(default_factory=list)
    """The clients that take run.step_delay_s; empty = every client."""
    node_delay_s: dict[int, float] = field(default_factory=dict)
    """{node: seconds}: what those clients sleep in place of the delay above (unequal devices:
    `{6: 0.45, 7: 0.45}` with run.step_delay_s 0.15 makes two clients 3x slower). Pace only."""

    def __post_init__(self) -> None:
        require(self.seed >= 0, "run.seed", f"must be >= 0, got {self.seed}")
        delay = self.step_delay_s
        require(math.isfinite(delay) and delay >= 0, "run.step_delay_s", f"must be a finite number >= 0, got {delay}")
        require(all(n >= 0 for n in self.slow_nodes), "run.slow_nodes", f"must be node ids >= 0, got {self.slow_nodes}")
        require(
            all(n >= 0 and math.isfinite(d) and d >= 0 for n, d in self.node_delay_s.items()),
            "run.node_delay_s",
            f"must map node ids >= 0 to finite seconds >= 0, got {self.node_delay_s}",
        )
        require(self.steps >= 1, "run.steps", f"must be >= 1, got {self.steps}")
        require(self.threads >= 0, "run.threads", f"must be >= 0, got {self.threads}")
        require(bool(self.out_dir), "run.out_dir", "must not be empty")


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
    clip: float = 0.0
    """Scalar clip, a backstop against peers that lie (docs/trust.md): each step's scalars are
    clamped to ±clip × median(|scalar|) over that step's messages before they are applied.
    0 = off (the default); otherwise >= 1. Changes the bits of a run (it is in the trajectory)."""
    stride: dict[int, int] = field(default_factory=dict)
    """{node: m}: a slow client that originates its K messages only on steps s with s % m == 0
    (on the others it still hops, forwards and applies every update; docs/churn.md, Unequal
    speeds). Every client knows the schedule, so each step's expected origins are a pure
    function of it; with aggregate mean, w = 1/(the clients that originate at that step).
    {} = every client every step. Changes the bits of a run (in the trajectory when set)."""

    def __post_init__(self) -> None:
        require(self.eps > 0, "zo.eps", f"must be > 0, got {self.eps}")
        require(self.lr >= 0, "zo.lr", f"must be >= 0, got {self.lr}")
        require(self.warmup_steps >= 0, "zo.warmup_steps", "must be >= 0")
        require(1 <= self.perturbations <= 64, "zo.perturbations", "must be in 1..64")
        require(len(self.trainable) > 0, "zo.trainable", "needs at least one pattern")
        require(
            math.isfinite(self.clip) and (self.clip == 0 or self.clip >= 1),
            "zo.clip",
            f"must be 0 (off) or a finite number >= 1 (below 1 the bound is under the median, so at "
            f"least half of every step's honest scalars would be clipped), got {self.clip}",
        )
        for node, m in self.stride.items():
            require(node >= 0, "zo.stride", f"must name node ids >= 0, got {node}")
            require(m >= 1, "zo.stride", f"node {node}: m must be >= 1 (it originates on steps s % m == 0), got {m}")


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
        require(1 <= self.rank <= 4096, "subspace.rank", f"must be in 1..4096, got {self.rank}")
        require(self.refresh >= 1, "subspace.refresh", f"must be >= 1, got {self.refresh}")
        require(self.merge_every >= 0, "subspace.merge_every", "must be >= 0 (0 = once per epoch)")
        require(
            self.refresh % self.merge_period == 0,
            "subspace.merge_every",
            f"must divide subspace.refresh={self.refresh}, got {self.merge_every}",
        )


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
            require(getattr(self, key) >= 0, f"task.{key}", "must be >= 0")
        require(self.batch_size >= 1, "task.batch_size", "must be >= 1")
        require(self.max_tokens >= 4, "task.max_tokens", "must be >= 4")
        require(self.alpha > 0, "task.alpha", f"must be > 0, got {self.alpha}")
        slots = self.template_slots(self.template) if self.template else []
        require(not self.template or bool(slots), "task.template", f"names no {{column}}, got {self.template!r}")
        if self.name == "table":
            require(bool(self.template), "task.template", 'is required for task table, e.g. "{text} It was"')
            require(bool(self.candidates), "task.candidates", 'is required for task table, e.g. [" bad", " good"]')
            require(
                self.label_field not in slots and "label" not in slots,
                "task.template",
                f"must not show the label column, got {self.template!r}",
            )
        if self.candidates:
            require(len(self.candidates) >= 2, "task.candidates", f"needs at least 2 strings, got {self.candidates!r}")
            require(all(self.candidates), "task.candidates", f"must not hold an empty string, got {self.candidates!r}")
            require(
                len(set(self.candidates)) == len(self.candidates),
                "task.candidates",
                f"must be distinct, got {self.candidates!r}",
            )
        for key in ("text_fields", "label_values"):
            values = getattr(self, key)
            require(all(v.strip() for v in values), f"task.{key}", f"must not hold an empty string, got {values!r}")
        unknown = [f for f in self.text_fields if f not in slots]
        require(not unknown, "task.text_fields", f"{unknown!r} not named in task.template (it names {slots!r})")
        require(bool(self.label_field.strip()), "task.label_field", "must not be empty")
        lowered = [v.strip().lower() for v in self.label_values]
        require(
            len(set(lowered)) == len(lowered),
            "task.label_values",
            f"must be distinct (case-insensitively), got {self.label_values!r}",
        )
        require(
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
            require(
                bool(name.strip()) and not name.isdigit(),
                "task.template",
                f"slots must name a column, got {template!r}",
            )
            require(
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
        require(bool(self.name), "model.name", "must not be empty")
        require(
            self.device == "cpu" or self.device.startswith("cuda"),
            "model.device",
            f"must be cpu, cuda or cuda:N, got {self.device!r}",
        )
