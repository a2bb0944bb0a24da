"""The model's preflight: what can be checked about cfg.model without loading weights.

Owns:
- `resolve_device(device, local_rank, device_count)`: "cuda" = this process's GPU
  (cuda:local_rank mod GPUs; clients share GPUs when there are more clients than GPUs);
- `local_device(device, local_rank)`: the same with this machine's visible GPU count;
- `check_source(cfg, local_rank)`: the preflight — device, source and tiny config, no weights.

Why a module of its own: the launchers' `seedflood world-size` runs this before any process
starts, and importing torch costs seconds of CPU per call. torch is imported here only to count
GPUs, i.e. only when model.device is a cuda device; model.device=cpu never imports it (nor does
sources.source, which imports torch only to build a model).

Assumes: model.device was validated by the config ("cpu", "cuda" or "cuda:..."); errors are
sources.ModelError, one line naming the device.
"""

from __future__ import annotations

from seedflood.core.config.trainsections import ModelConfig
from seedflood.ml import sources
from seedflood.ml.sources import ModelError


def resolve_device(device: str, local_rank: int, device_count: int) -> str:
    """The torch device this process uses for model.device `device` (pure; raises ModelError).

    "cpu" stays "cpu". "cuda" means this process's GPU: cuda:(local_rank mod device_count), so the
    processes of one node spread over its visible GPUs and share them round-robin when there are
    more processes than GPUs. "cuda:N" stays cuda:N (every process on GPU N). `local_rank` is the
    launcher's per-node process index (LOCAL_RANK, SLURM_LOCALID); `device_count` the number of
    GPUs this process sees (after CUDA_VISIBLE_DEVICES), 0 without CUDA.
    """
    if device == "cpu":
        return device
    kind, colon, index = device.partition(":")
    if kind != "cuda" or (colon and not index.isdigit()):
        raise ModelError(f"model.device must be cpu, cuda or cuda:N, got {device!r}")
    if local_rank < 0:
        raise ModelError(f"model.device {device}: local rank {local_rank} is negative")
    if device_count < 1:
        raise ModelError(f"model.device is {device} but CUDA is not available")
    if not colon:
        return f"cuda:{local_rank % device_count}"
    if int(index) >= device_count:
        raise ModelError(f"model.device is {device} but only {device_count} GPU(s) exist")
    return f"cuda:{int(index)}"


def local_device(device: str, local_rank: int) -> str:
    """resolve_device with this machine's visible GPU count ("cpu" asks no GPU question, so it
    imports no torch: resolve_device("cpu", ...) is "cpu" whatever the count)."""
    if device == "cpu":
        return device
    import torch  # counting GPUs needs torch.cuda

    return resolve_device(device, local_rank, torch.cuda.device_count() if torch.cuda.is_available() else 0)


def check_source(cfg: ModelConfig, local_rank: int = 0) -> None:
    """Preflight: raise ModelError for every problem found without loading weights."""
    local_device(cfg.device, local_rank)
    sources.source(cfg)
