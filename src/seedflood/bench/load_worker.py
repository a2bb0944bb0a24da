"""The measured process of `seedflood bench --only load` (bench/load.py starts one per repeat).

Owns: `python -m seedflood.bench.load_worker MODEL DEVICE`, which loads MODEL once through
model.load (the shipped path) on DEVICE and prints one JSON line: this process's anonymous memory
(/proc/self/smaps_rollup `Anonymous`, bytes) at three points and its peak during the load, the
model's parameter bytes, the bytes of them that lie in a private map of the weights file
(`Loaded.mapped_bytes`, found by address) and the weights hash.

The points: `torch` (torch and seedflood.ml.model imported; on cuda, CUDA initialised: what a
client holds before it loads), `imports` (also what the load would import: torch's own on a first
load_state_dict of a meta-device module, safetensors, and for a transformers model the package,
the Auto classes, the config's model class and its tokenizer class; a tiny directory never
imports transformers), `end` (the model loaded, still referenced). "Load alone" is end - imports;
"with imports" is end - torch. The peak is sampled every 5 ms by a thread (a lower bound).

Assumes: Linux (/proc/self/smaps_rollup); the source is already converted (bench/load.py calls
sources.gguf_dir first), so no conversion is measured. Imports stay inside `main` so that `torch`
is the first point that holds them.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

SAMPLE_S = 0.005  # peak sampling period


def anonymous() -> int:
    """This process's Anonymous bytes (/proc/self/smaps_rollup, kB there)."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Anonymous line in /proc/self/smaps_rollup")


class PeakSampler:
    """The highest Anonymous reading while running (a thread reading every SAMPLE_S)."""

    def __init__(self) -> None:
        self.peak = anonymous()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.peak = max(self.peak, anonymous())

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, anonymous())  # the end is a sample too


def _warm_imports(torch: Any, directory: Path | None, transformers_model: bool) -> None:
    """Import what the load imports before it reads a weight: what torch imports when a model is
    first built on the meta device and assigned a state (an embedding with a padding index pulls
    torch._dynamo and sympy: about 70 MB), safetensors, and for a transformers directory the
    package, the Auto classes, the config's model class and its tokenizer class."""
    import safetensors.torch  # noqa: F401

    with torch.device("meta"):
        toy = torch.nn.Embedding(4, 2, padding_idx=0)
    toy.load_state_dict(torch.nn.Embedding(4, 2).state_dict(), assign=True)
    if not transformers_model:
        return
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig  # noqa: F401
    from transformers.models.auto.auto_factory import _get_model_class
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    if directory is None:
        return
    config = AutoConfig.from_pretrained(directory)
    if type(config) in AutoModelForCausalLM._model_mapping:
        _get_model_class(config, AutoModelForCausalLM._model_mapping)
    try:
        name = json.loads((directory / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        name = None
    if isinstance(name, str):
        tokenizer_class_from_name(name)


def main(argv: list[str]) -> int:
    name, device = argv
    import torch

    from seedflood.core.config.trainsections import ModelConfig
    from seedflood.ml import model as M
    from seedflood.ml import sources, tinyllama

    if device.startswith("cuda"):
        torch.empty(1, device=device)  # the CUDA context's host memory is not the load's
    points = {"torch": anonymous()}
    cfg = ModelConfig(name=name, device=device)
    src = sources.source(cfg)
    directory = sources.gguf_dir(Path(src.where)) if src.kind == "gguf" else Path(src.where) if src.where else None
    tiny = src.kind == "tiny" or (directory is not None and tinyllama.is_tiny_dir(directory))
    _warm_imports(torch, directory if src.kind != "hub" else None, not tiny)
    points["imports"] = anonymous()
    with PeakSampler() as sampler:
        loaded = M.load(cfg, device=device)
    points["end"] = anonymous()
    result: dict[str, Any] = {
        "device": device,
        "model_bytes": sum(p.numel() * p.element_size() for p in loaded.model.parameters()),  # tied: once
        "mapped_bytes": loaded.mapped_bytes,
        "hash": loaded.base_hash,
        "points": points,
        "peak": sampler.peak,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
