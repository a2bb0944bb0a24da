"""The model's preflight and the GPU plan: what can be checked about cfg.model, and where each
process of a run computes, without loading weights.

Owns:
- `resolve_device(device, local_rank, device_count)`: model.device for one process; "cuda" =
  cuda:(local_rank mod GPUs) (more processes than GPUs share them round-robin);
- `place(model_device, eval_device, rank, local_rank, gpus)`: the device of rank `rank` under
  model.device and eval.device (the evaluator's placement: "" as the other processes, "own",
  "cpu" or "cuda:K"), pure; `plan(...)`: every rank's device on every host (`Plan`: what
  `seedflood world-size` prints, with the notice when the evaluator shares a client's GPU and
  the warning when two clients share one that model.device did not pin);
- `process_device(...)` (`place` with this machine's visible GPU count) and `use_device(device)`
  (torch.cuda.set_device: a launched process calls it before it builds anything on its GPU, so
  whatever lands on "cuda" without an index, CUDA's own context included, lands on its GPU);
- `local_device(device, local_rank)`, `check_source(cfg, local_rank, gpus)`: the preflight —
  device, source and tiny config, no weights.

Why a module of its own: the launchers' `seedflood world-size` runs this before any process
starts, and importing torch costs seconds of CPU per call. torch is imported here only to count
GPUs, i.e. only when a cuda device is named and no GPU count is given; model.device=cpu never
imports it (nor does sources.source, which imports torch only to build a model).

Assumes: model.device and eval.device were validated by the config. Ranks are contiguous per
host (torchrun, SLURM's default block distribution): rank 0, the evaluator, is local rank 0 of
its host, and a process whose rank equals its local rank shares that host with it. Errors are
sources.ModelError, one line naming the setting.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from seedflood.core.config.trainsections import ModelConfig
from seedflood.ml import sources
from seedflood.ml.sources import ModelError


def resolve_device(device: str, local_rank: int, device_count: int, key: str = "model.device") -> str:
    """The torch device this process uses for model.device `device` (pure; raises ModelError).

    "cpu" stays "cpu". "cuda" means this process's GPU: cuda:(local_rank mod device_count), so the
    processes of one node spread over its visible GPUs and share them round-robin when there are
    more processes than GPUs. "cuda:N" stays cuda:N (every process on GPU N). `local_rank` is the
    launcher's per-node process index (LOCAL_RANK, SLURM_LOCALID); `device_count` the number of
    GPUs this process sees (after CUDA_VISIBLE_DEVICES), 0 without CUDA. `key` names the setting
    in errors.
    """
    if device == "cpu":
        return device
    kind, colon, index = device.partition(":")
    if kind != "cuda" or (colon and not index.isdigit()):
        raise ModelError(f"{key} must be cpu, cuda or cuda:N, got {device!r}")
    if local_rank < 0:
        raise ModelError(f"{key} {device}: local rank {local_rank} is negative")
    if device_count < 1:
        raise ModelError(f"{key} is {device} but CUDA is not available")
    if not colon:
        return f"cuda:{local_rank % device_count}"
    if int(index) >= device_count:
        raise ModelError(f"{key} is {device} but only {device_count} GPU(s) exist")
    return f"cuda:{int(index)}"


def place(model_device: str, eval_device: str, rank: int, local_rank: int, gpus: int) -> str:
    """The device of launched rank `rank` (local rank `local_rank`, `gpus` visible GPUs) (pure).

    eval.device "" (the default): every process, the evaluator included, as model.device says
    (`resolve_device`): with "cuda" the evaluator is cuda:0 of its host, which the client of
    local rank `gpus` shares, as before this setting existed. "own": the evaluator alone on
    cuda:0, the clients of its host spread over cuda:1..gpus-1 (needs model.device=cuda and two
    GPUs). "cpu" or "cuda:K": the evaluator there, the clients of its host spread over every GPU
    from cuda:0 (a client on K shares the evaluator's). Clients on the other hosts always follow
    model.device. A client's slot on the evaluator's host is its local rank less the
    evaluator's, so with "own", "cpu" or "cuda:K" clients are numbered from 0 there too.
    """
    if rank == 0:
        if eval_device == "":
            return resolve_device(model_device, local_rank, gpus)
        if eval_device == "own":
            _own_fits(model_device, gpus)
            return "cuda:0"
        return resolve_device(eval_device, 0, gpus, key="eval.device")
    if eval_device == "" or rank != local_rank or model_device != "cuda":
        return resolve_device(model_device, local_rank, gpus)
    if eval_device == "own":
        _own_fits(model_device, gpus)
        return f"cuda:{1 + (local_rank - 1) % (gpus - 1)}"
    return resolve_device(model_device, local_rank - 1, gpus)


def _own_fits(model_device: str, gpus: int) -> None:
    if model_device != "cuda":
        raise ModelError(f"eval.device=own needs model.device=cuda, got {model_device}")
    if gpus < 2:
        raise ModelError(f"eval.device=own needs at least 2 GPUs, {gpus} visible")


def needs_gpus(model_device: str, eval_device: str) -> bool:
    """Whether a run with these settings uses a GPU (and so needs to count them)."""
    return model_device != "cpu" or eval_device not in ("", "cpu")


def local_gpus() -> int:
    """GPUs this process sees (after CUDA_VISIBLE_DEVICES); imports torch."""
    import torch  # counting GPUs needs torch.cuda

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def process_device(model_device: str, eval_device: str, rank: int, local_rank: int) -> str:
    """`place` with this machine's visible GPU count (an all-CPU run imports no torch here)."""
    gpus = local_gpus() if needs_gpus(model_device, eval_device) else 0
    return place(model_device, eval_device, rank, local_rank, gpus)


def use_device(device: str) -> None:
    """Make `device` this process's current CUDA device (torch.cuda.set_device); "cpu" does
    nothing. Call it before anything is built on the GPU: what is created on "cuda" without an
    index (and CUDA's context, which the first call creates) goes to the current device, which
    is otherwise cuda:0 in every process."""
    if device == "cpu":
        return
    import torch

    torch.cuda.set_device(torch.device(device))


def local_device(device: str, local_rank: int) -> str:
    """resolve_device with this machine's visible GPU count ("cpu" asks no GPU question, so it
    imports no torch: resolve_device("cpu", ...) is "cpu" whatever the count)."""
    if device == "cpu":
        return device
    return resolve_device(device, local_rank, local_gpus())


def check_source(cfg: ModelConfig, local_rank: int = 0, gpus: int | None = None) -> None:
    """Preflight: raise ModelError for every problem found without loading weights (`gpus`: the
    GPU count to check model.device against; None counts this machine's)."""
    if gpus is None:
        local_device(cfg.device, local_rank)
    else:
        resolve_device(cfg.device, local_rank, gpus)
    sources.source(cfg)


@dataclass(frozen=True)
class Plan:
    """Where every rank of a launch computes: `hosts[h]` lists (rank, device) of host h."""

    gpus: int
    """GPUs per host."""
    hosts: list[list[tuple[int, str]]]
    pinned: bool
    """model.device names one GPU (cuda:N): clients share it on purpose."""
    notices: list[str] = field(default_factory=list)
    """The evaluator shares a client's GPU."""
    warnings: list[str] = field(default_factory=list)
    """Two clients share a GPU that model.device did not pin."""

    def lines(self) -> list[str]:
        """The plan as text: a header, a line per device per host (client n is rank n + 1)."""
        world = sum(len(h) for h in self.hosts)
        hosts, gpus = len(self.hosts), self.gpus
        out = [
            f"GPU plan: {world} processes on {hosts} host{'s' * (hosts > 1)} of {gpus} GPU{'s' * (gpus != 1)}"
            f"{' each' * (hosts > 1)} (client n is rank n+1)"
        ]
        for h, procs in enumerate(self.hosts):
            where = f"host {h} " if len(self.hosts) > 1 else ""
            for device, ranks in _by_device(procs).items():
                out.append(f"  {where}{device}: {_who(ranks)}")
        return out + [f"notice: {n}" for n in self.notices] + [f"warning: {w}" for w in self.warnings]


def plan(model_device: str, eval_device: str, world: int, gpus: int, hosts: int = 1) -> Plan:
    """Every rank's device when `world` processes run on `hosts` hosts of `gpus` GPUs each, split
    as launch/torchrun.sh splits them (world / hosts each, the remainder to the first hosts;
    contiguous ranks) (pure; raises ModelError as `place` does)."""
    if hosts < 1 or world < hosts:
        raise ModelError(f"{world} processes cannot fill {hosts} hosts")
    layout: list[list[tuple[int, str]]] = []
    rank = 0
    for h in range(hosts):
        count = world // hosts + (h < world % hosts)
        layout.append([(rank + i, place(model_device, eval_device, rank + i, i, gpus)) for i in range(count)])
        rank += count
    pinned = model_device.startswith("cuda:")
    notices, warnings = [], []
    for h, procs in enumerate(layout):
        where = f" on host {h}" if hosts > 1 else ""
        for device, ranks in _by_device(procs).items():
            clients = [r for r in ranks if r]
            if 0 in ranks and clients and device != "cpu":
                notices.append(
                    f"the evaluator shares {device} with {_who(clients)}"
                    " (eval.device=own gives it a GPU of its own, eval.device=cpu takes it off the GPUs)"
                )
            if len(clients) > 1 and device != "cpu" and not pinned:
                warnings.append(
                    f"{len(clients)} clients share {device}{where} ({_who(clients)}): a strict step waits "
                    "for the slowest client; give each client a GPU (more GPUs or hosts, fewer clients)"
                )
    return Plan(gpus, layout, pinned, notices, warnings)


def _by_device(procs: list[tuple[int, str]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for rank, device in procs:
        out[device].append(rank)
    return dict(sorted(out.items(), key=lambda kv: (kv[0] == "cpu", len(kv[0]), kv[0])))


def _who(ranks: list[int]) -> str:
    """'evaluator, clients 0-3, 7' for ranks [0, 1, 2, 3, 4, 8] (client n is rank n + 1)."""
    nodes = [r - 1 for r in ranks if r]
    spans: list[list[int]] = []  # [first, last] of each run of consecutive node ids
    for n in nodes:
        if spans and spans[-1][1] == n - 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    parts = ["evaluator"] if 0 in ranks else []
    if spans:
        text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
        parts.append(("client " if len(nodes) == 1 else "clients ") + text)
    return ", ".join(parts)
