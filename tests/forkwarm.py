"""Imported last by the fork server (forked.PRELOAD): the start-up work every forked `seedflood`
command would otherwise repeat, with a result that is the same in every process.

Owns: importing what `seedflood.cli.build_parser` pulls in (the experiments' subcommands: sweep,
compare, reproduce, gpuevidence, and numpy.random / numpy.ma under them), what a run imports
lazily (the byte tokenizer, tensorboardX for the metrics sink, safetensors for checkpoints), and
building the pydantic model of every config section (`validation.fields_model`, cached per
section class, ~0.1 s of a process's first config load). About 0.3 s of CPU per started process.

Assumes: all of this is pure set-up (module state and caches keyed by class), so a child forked
after it runs the same code on the same values as one that did it itself.
"""

from __future__ import annotations

import numpy.ma  # noqa: F401  # imported by the experiments' plotting helpers
import numpy.random  # noqa: F401
import safetensors.torch  # noqa: F401  # checkpoints
import tensorboardX  # noqa: F401  # the run's metrics sink

import seedflood.ml.bytetokenizer  # noqa: F401  # the tiny model's tokenizer
from seedflood.cli import build_parser
from seedflood.core.config import runconfig, validation

build_parser()
for section in runconfig.SECTIONS.values():
    validation.fields_model(section)
