"""Test-only: a fake torch.cuda with FAKE_CUDA_GPUS GPUs in every process started with this
directory on PYTHONPATH (tests/e2e/test_gpu_placement.py puts it there; the product has no hook).

When torch is imported, torch.cuda says it is available with FAKE_CUDA_GPUS devices;
`set_device` / `current_device` keep a current index as CUDA would (FAKE_CUDA_IGNORE_SET_DEVICE=1
makes `set_device` do nothing: the control of a process that never sets its device); and
`nn.Module.to` with a cuda device records the device asked for and the current device at that
moment, then moves nothing (tensors stay on the CPU, so the run computes as on the CPU). At exit a
process that imported torch writes what it saw to FAKE_CUDA_OUT/<pid>.json, with its launcher's
RANK and LOCAL_RANK (SEEDFLOOD_RANK under launch/churn.sh).

Python imports the first sitecustomize on sys.path: PYTHONPATH comes before site-packages, so
this one is loaded instead of any other (none is installed in the project's venv).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import sys

GPUS = int(os.environ.get("FAKE_CUDA_GPUS", "0"))
OUT = os.environ.get("FAKE_CUDA_OUT", "")


def _patch(torch) -> None:
    state = {"current": 0, "set": [], "moves": []}

    def set_device(device) -> None:
        index = torch.device(device).index if not isinstance(device, int) else device
        if index is None or not 0 <= index < GPUS:
            raise RuntimeError(f"fake CUDA: invalid device ordinal {device!r} ({GPUS} GPUs)")
        state["set"].append(index)
        if os.environ.get("FAKE_CUDA_IGNORE_SET_DEVICE") != "1":
            state["current"] = index

    original_to = torch.nn.Module.to

    def module_to(self, *args, **kwargs):
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "cuda":
            index = state["current"] if device.index is None else device.index
            if not 0 <= index < GPUS:
                raise RuntimeError(f"fake CUDA: invalid device ordinal {index} ({GPUS} GPUs)")
            state["moves"].append({"device": f"cuda:{index}", "current": f"cuda:{state['current']}"})
            return original_to(self, dtype=dtype) if dtype is not None else self
        return original_to(self, *args, **kwargs)

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: GPUS
    torch.cuda.set_device = set_device
    torch.cuda.current_device = lambda: state["current"]
    torch.cuda.get_device_name = lambda device=None: "fake GPU"  # the run's build record names it
    torch.nn.Module.to = module_to

    def report() -> None:
        if not OUT:
            return
        env = os.environ
        rank = env.get("SEEDFLOOD_RANK", env.get("RANK"))
        local = env.get("SEEDFLOOD_RANK", env.get("LOCAL_RANK"))
        record = {
            "argv": sys.argv,
            "rank": None if rank is None else int(rank),
            "local_rank": None if local is None else int(local),
            "current": f"cuda:{state['current']}",
            "set_device": [f"cuda:{i}" for i in state["set"]],
            "moves": state["moves"],
        }
        with open(os.path.join(OUT, f"{os.getpid()}.json"), "w") as f:
            json.dump(record, f)

    atexit.register(report)


class _TorchHook(importlib.abc.MetaPathFinder):
    """Patches torch.cuda right after `import torch` has run torch/__init__.py."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched(module) -> None:
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = patched  # type: ignore[method-assign]
        return spec


if GPUS > 0:
    sys.meta_path.insert(0, _TorchHook())
