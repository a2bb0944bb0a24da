"""LoRA adapters for the baselines' `-lora` algorithms: inject, initialise, name and count them.

Owns turning a loaded model into frozen base weights plus trainable adapters, in place:
- `inject(model, rank, alpha, targets, seed)`: every nn.Linear whose last name part is in
  `targets` (default q_proj and v_proj, MeZO's and the paper's choice) becomes a peft
  `lora.Linear` (peft's `inject_adapter_in_model`: the model keeps its class, the original module
  is its `base_layer`, its weight the same Parameter) computing W·x + (α/r)·B·A·x, with no
  dropout and no bias. Returns the adapter parameter names (per module lora_A then lora_B, in the
  model's parameter order): what the baselines train, mix and send.
- The initial adapters are fixed by the run seed alone: A (r×in) ~ U(−1/√in, 1/√in), the
  kaiming-uniform (a = √5) distribution peft and nn.Linear use, drawn from a keyed generator
  (TAG_LORA, run seed, module index) rather than torch's global RNG, so every client and every
  process starts from the same bits whatever peft version or call order; B (out×r) = 0, so the
  adapted model starts equal to the base model.
- `numel(model, rank, targets)`: Σ over the targeted Linears of r·(in + out), the exact size of
  one client's adapter vector (a DENSE tensorwire frame of it is 20 + 4·numel bytes).

After `inject` no parameter requires grad (the baselines switch it on for the client vector only
while they backpropagate). Refusals are one-line `ConfigError`s naming the algorithm key.

Assumes: targets are nn.Linear modules (Llama, OPT, Mistral attention projections; GPT-2's
Conv1D c_attn is refused); peft is imported only when adapters are injected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from seedflood.core.config import rng
from seedflood.core.config.configerror import ConfigError

TAG_LORA = 0x10BA  # domain tag of the adapters' initial A matrices
ADAPTER = "default"  # peft's adapter name: parameters are <module>.lora_A.default.weight


def targeted(model: nn.Module, targets: Sequence[str]) -> list[tuple[str, nn.Module]]:
    """(name, module) of every module whose last name part is in `targets`, in model order;
    ConfigError when none matches or a match is not an nn.Linear."""
    found = [(n, m) for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in set(targets)]
    if not found:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ConfigError(
            f"algorithm.lora_targets: no module of the model is named {list(targets)} "
            f"(its nn.Linear modules: {', '.join(linear)})"
        )
    for name, mod in found:
        if type(mod) is not nn.Linear:
            raise ConfigError(f"algorithm.lora_targets: {name} is a {type(mod).__name__}; LoRA here needs nn.Linear")
    return found


def numel(model: nn.Module, rank: int, targets: Sequence[str]) -> int:
    """Entries of the adapters `inject` would add: Σ r·(in_features + out_features)."""
    return sum(rank * (m.in_features + m.out_features) for _, m in targeted(model, targets))  # type: ignore[operator]


def inject(model: nn.Module, rank: int, alpha: float, targets: Sequence[str], seed: int) -> list[str]:
    """Add LoRA adapters to `model` in place (see the module doc); returns their parameter names."""
    if rank < 1:
        raise ConfigError(f"algorithm.lora_rank: must be >= 1, got {rank}")
    found = targeted(model, targets)
    too_wide = [n for n, m in found if rank > min(m.in_features, m.out_features)]  # type: ignore[type-var]
    if too_wide:
        raise ConfigError(f"algorithm.lora_rank: {rank} exceeds the width of {too_wide[0]}")
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=[n for n, _ in found],  # exact names: nothing else is touched
        lora_dropout=0.0,
        bias="none",
    )
    inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    model.requires_grad_(False)
    names = []
    with torch.no_grad():
        for j, (name, _) in enumerate(found):
            layer = model.get_submodule(name)
            a = layer.lora_A[ADAPTER].weight
            b = layer.lora_B[ADAPTER].weight
            bound = 1.0 / math.sqrt(a.shape[1])
            g = rng.torch_generator(TAG_LORA, seed, j)
            init = torch.rand(a.shape, generator=g, dtype=torch.float32).mul_(2 * bound).sub_(bound)
            a.copy_(init.to(a.dtype))
            b.zero_()
            names += [f"{name}.lora_A.{ADAPTER}.weight", f"{name}.lora_B.{ADAPTER}.weight"]
    order = {n: i for i, (n, _) in enumerate(model.named_parameters())}
    missing = [n for n in names if n not in order]
    if missing:  # peft named them otherwise: a version this module was not written for
        raise RuntimeError(f"LoRA parameter {missing[0]} not found after peft's injection")
    return sorted(names, key=order.__getitem__)


def is_adapter(name: str) -> bool:
    """True for a parameter `inject` added (lora_A / lora_B weights)."""
    return f".lora_A.{ADAPTER}." in name or f".lora_B.{ADAPTER}." in name
