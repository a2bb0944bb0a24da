"""Model: a loaded base model (frozen, on its device), its hash, saving, and shared weight pages.

Owns:
- `load(cfg, local_rank, device)`: the base model from its source (sources.py), frozen, in eval
  mode, on this process's device (the one given, else modelcheck.local_device) in cfg.dtype,
  with its tokenizer (pad token set, right padding), an identity string and the sha256 of its
  weights (`weights_hash`);
- `save`: model + tokenizer as a HF directory, with pending updates folded in;
- `map_weights(model, directory)`: parameters loaded from a directory (and the SmolLM2 cache)
  point into a private, copy-on-write memory map of its safetensors files, so the pages training
  never writes (embeddings, norms, non-trainable matrices; trainable ones until their first
  update) are one copy in the page cache shared by every process on the machine;
  `bytes_in_private_maps`: the parameter bytes that lie in such a map, by address.

Assumes: decoder-only HF causal LMs (what objective.py scores); never touches torch's global RNG.
"""

from __future__ import annotations

import json
import logging
import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from seedflood.core.config.trainsections import ModelConfig
from seedflood.core.zo.replay import tensors_hash
from seedflood.ml import modelcheck, sources
from seedflood.ml.sources import ModelError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass
class Loaded:
    model: PreTrainedModel
    """Eval mode, requires_grad False everywhere, on modelcheck.local_device(cfg.device, ...) in cfg.dtype."""
    tokenizer: PreTrainedTokenizerBase
    """Its tokenizer: pad token set, padding_side = "right"."""
    identity: str
    """Where the base weights came from, e.g. "smollm2-135m-instruct (gguf Q4_1)"."""
    base_hash: str
    """weights_hash of the base model as loaded (before any update)."""
    mapped_bytes: int = 0
    """Parameter bytes that lie in a private memory map of the weights files, by their addresses
    (`map_weights`, `bytes_in_private_maps`); 0 for a model not loaded from a directory."""


def weights_hash(model: torch.nn.Module | Mapping[str, torch.Tensor]) -> str:
    """sha256 of a model's state dict (replay.tensors_hash: name, dtype, shape and raw bytes)."""
    return tensors_hash(model.state_dict() if isinstance(model, torch.nn.Module) else model)


def save(loaded: Loaded, path: Path, tensors: Mapping[str, torch.Tensor] | None = None) -> None:
    """save_pretrained model + tokenizer into `path`, with `tensors` replacing state-dict entries
    (e.g. the trainable matrices with pending updates folded in), quietly."""
    state = dict(loaded.model.state_dict())
    state.update(tensors or {})
    with sources.quiet_transformers():
        loaded.model.save_pretrained(path, state_dict=state)
        loaded.tokenizer.save_pretrained(path)


def load(cfg: ModelConfig, local_rank: int = 0, device: str | None = None) -> Loaded:
    """The base model and tokenizer named by cfg (see the module docstring for the sources), on
    `device` (a launched process's placement, modelcheck.place), else on
    modelcheck.local_device(cfg.device, local_rank) (this process's GPU, or the CPU)."""
    device = device or modelcheck.local_device(cfg.device, local_rank)
    src = sources.source(cfg)
    dtype = getattr(torch, cfg.dtype)
    identity = src.identity
    model, tokenizer, directory = sources.instantiate(src, cfg, dtype)  # directory: safetensors copy, or None

    model = model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    mapped = map_weights(model, directory) if directory is not None else 0
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelError(f"tokenizer of {identity} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    loaded = Loaded(model, tokenizer, identity, weights_hash(model), mapped)
    log.info(
        "loaded %s: %.1fM parameters, %s on %s, hash %s, %.0f MB mapped from the weights file",
        identity,
        sum(p.numel() for p in model.parameters()) / 1e6,
        cfg.dtype,
        device,
        loaded.base_hash[:12],
        mapped / 1e6,
    )
    return loaded


_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def map_weights(model: torch.nn.Module, directory: Path) -> int:
    """Point each CPU parameter at the bytes of the same tensor in `directory`'s *.safetensors
    files, mapped privately (MAP_PRIVATE: a write copies the page, the file never changes);
    return the parameter bytes that now lie in a private map of those files, found by address
    (`bytes_in_private_maps`; without /proc, the bytes re-pointed).

    A parameter moves only when name, dtype and shape match and the file's bytes equal its
    bytes (so a loader that converted anything keeps its own copy, and the model's bits cannot
    change). Tied parameters are one Parameter object: both names follow. Pages read but never
    written stay shared, through the page cache, by every process that maps the file: with N
    clients on a machine the frozen part of the model is resident once, not N times.
    """
    params = dict(model.named_parameters())  # tied parameters appear once
    mapped = 0  # bytes re-pointed: what the map holds unless its buffer is not the file's
    files = sorted(directory.glob("*.safetensors"))
    for path in files:
        try:
            with open(path, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))  # safetensors: u64 LE header size, JSON header, data
                header = json.loads(f.read(size))
                view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # MAP_PRIVATE, writable
        except (OSError, ValueError, struct.error) as e:  # transformers read it; keep its copies
            log.warning("not memory-mapping %s: %s", path, sources.first_line(e))
            continue
        start = 8 + size
        for name, meta in header.items():
            p = params.get(name)
            if (
                p is None
                or not isinstance(meta, dict)
                or p.device.type != "cpu"
                or not p.is_contiguous()
                or not p.numel()
            ):
                continue
            dtype = _SAFETENSORS_DTYPES.get(str(meta.get("dtype")))
            offset = start + meta["data_offsets"][0]
            if dtype != p.dtype or list(meta["shape"]) != list(p.shape) or offset % p.element_size():
                continue
            t = torch.frombuffer(view, dtype=dtype, count=p.numel(), offset=offset).view(p.shape)  # keeps `view` alive
            if torch.equal(t.view(-1).view(torch.uint8), p.detach().view(-1).view(torch.uint8)):  # equal bits
                p.data = t
                mapped += p.numel() * p.element_size()
    found = bytes_in_private_maps(model, files)
    return mapped if found is None else found


def bytes_in_private_maps(model: torch.nn.Module, files: list[Path]) -> int | None:
    """Bytes of `model`'s CPU parameters (tied ones once) that lie inside a private (MAP_PRIVATE)
    memory map of one of `files`, by their addresses in /proc/self/maps; None without that file
    (not Linux). What `Loaded.mapped_bytes` reports: a parameter that is a copy counts 0."""
    names = {str(f.resolve()) for f in files}
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    ranges: list[list[int]] = []
    for line in lines:
        parts = line.split(maxsplit=5)  # address perms offset dev inode path
        if len(parts) == 6 and parts[1][3:4] == "p" and parts[5] in names:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            ranges.append([lo, hi])
    ranges.sort()
    merged: list[list[int]] = []  # adjacent maps of the files: one range (a tensor may span both)
    for r in ranges:
        if merged and r[0] <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], r[1])
        else:
            merged.append(r)
    total = 0
    for p in model.parameters():
        lo, n = p.data_ptr(), p.numel() * p.element_size()
        if p.device.type == "cpu" and any(a <= lo and lo + n <= b for a, b in merged):
            total += n
    return total
