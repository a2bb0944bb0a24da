"""Imported once by `seedflood launch`'s fork server (cli/launch.py) before it forks any rank: what
every `seedflood train` process would otherwise import and set up on its own.

Owns: importing torch, torch.distributed, the train role and the tiny model, what a run imports
lazily (the byte tokenizer, tensorboardX for the metrics sink, safetensors for checkpoints), and
building the parser and every config section's pydantic model once. A forked rank shares these
pages with the server and its siblings until it writes to them.

Assumes: all of this is pure set-up (module state, caches keyed by class) that starts no thread,
runs no torch kernel (no OpenMP pool exists before the fork) and does not initialise CUDA (a
forked child could not use it), so a child forked after it runs
the same code on the same values as a fresh interpreter.
"""

from __future__ import annotations

import safetensors.torch  # noqa: F401  # checkpoints
import tensorboardX  # noqa: F401  # the run's metrics sink
import torch  # noqa: F401
import torch.distributed  # noqa: F401

import seedflood.ml.bytetokenizer  # noqa: F401  # the tiny model's tokenizer
import seedflood.ml.tinyllama  # noqa: F401
import seedflood.roles.train  # noqa: F401
from seedflood.cli import build_parser
from seedflood.core.config import runconfig, validation

build_parser()
for section in runconfig.SECTIONS.values():
    validation.fields_model(section)
