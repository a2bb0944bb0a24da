"""A model loaded from a safetensors directory holds no private copy of its weights (issue 43
item 6): every parameter byte lies inside a private memory map of the weights file, found by its
address in /proc/self/maps (read here, independently of model.bytes_in_private_maps).

Two checks, each with a control that makes it fail:
- the loader (sources.instantiate: the locked transformers' from_pretrained, or safetensors'
  load_file for a tiny directory) already hands out views of a private map of the file, before
  model.map_weights runs; `test_control_a_copying_loader` clones what it hands out and the check
  finds no byte in the map (map_weights then re-points the copies into its own map);
- after model.load, every parameter byte is in the map and `Loaded.mapped_bytes` says so;
  `test_control_a_load_that_copies` makes every view of a buffer a copy (torch.frombuffer clones)
  and the check finds no byte in the map, and mapped_bytes reports 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seedflood.core.config.trainsections import ModelConfig
from seedflood.ml import model as M
from seedflood.ml import sources, tinyllama

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="needs Linux /proc")


def _private_map_ranges(path: Path) -> list[tuple[int, int]]:
    """Address ranges of this process's private (copy-on-write) maps of `path`."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)  # address perms offset dev inode path
            if len(parts) == 6 and parts[1].endswith("p") and parts[5].strip() == str(path.resolve()):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi))
    return out


def _bytes(model: torch.nn.Module, directory: Path) -> tuple[int, int]:
    """(parameter bytes, those inside a private map of `directory`/model.safetensors); the tied
    head and embedding once."""
    params = list(model.parameters())
    ranges = _private_map_ranges(directory / "model.safetensors")
    total = in_map = 0
    for p in params:
        lo, n = p.data_ptr(), p.numel() * p.element_size()
        total += n
        in_map += n if any(a <= lo and lo + n <= b for a, b in ranges) else 0
    return total, in_map


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """The tiny model saved: loaded back by tinyllama.load_dir (safetensors' load_file)."""
    tiny = M.load(ModelConfig(name="tiny"))
    path = tmp_path_factory.mktemp("tiny")
    tiny.model.save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def llama_dir(tiny_dir, tmp_path_factory) -> Path:
    """The same files without tinyllama's mark: a plain Llama directory, loaded by transformers."""
    path = tmp_path_factory.mktemp("llama")
    for f in tiny_dir.iterdir():
        (path / f.name).write_bytes(f.read_bytes())
    config = json.loads((path / "config.json").read_text())
    del config[tinyllama.MARK]
    (path / "config.json").write_text(json.dumps(config))
    return path


def _instantiate(path: Path) -> torch.nn.Module:
    cfg = ModelConfig(name=str(path))
    model, _, directory = sources.instantiate(sources.source(cfg), cfg, torch.float32)
    assert directory == path
    return model


@pytest.mark.parametrize("which", ["tiny_dir", "llama_dir"])
def test_the_loader_hands_out_views_of_the_file(which, request):
    path: Path = request.getfixturevalue(which)
    total, in_map = _bytes(_instantiate(path), path)
    assert in_map == total > 0


@pytest.mark.parametrize("which", ["tiny_dir", "llama_dir"])
def test_after_load_every_parameter_byte_is_in_the_map(which, request):
    path: Path = request.getfixturevalue(which)
    loaded = M.load(ModelConfig(name=str(path)))
    total, in_map = _bytes(loaded.model, path)
    assert loaded.mapped_bytes == in_map == total > 0


def test_control_a_copying_loader(llama_dir, monkeypatch):
    """The loader's check fails when the loader hands out copies; model.load still ends with
    every byte in its own map (map_weights re-points them), so that check alone would not see it."""
    real = sources.instantiate

    def copying(*args, **kwargs):
        model, tokenizer, directory = real(*args, **kwargs)
        for p in model.parameters():
            p.data = p.data.clone()
        return model, tokenizer, directory

    monkeypatch.setattr(sources, "instantiate", copying)
    total, in_map = _bytes(_instantiate(llama_dir), llama_dir)
    assert total > 0 and in_map == 0
    loaded = M.load(ModelConfig(name=str(llama_dir)))
    assert loaded.mapped_bytes == _bytes(loaded.model, llama_dir)[1] == total


@pytest.mark.parametrize("which", ["tiny_dir", "llama_dir"])
def test_control_a_load_that_copies(which, request, monkeypatch):
    """Every view taken of a buffer is a copy (what a path falling back to copying hands out):
    the same bits, but no parameter byte in the map, and mapped_bytes does not claim any."""
    path: Path = request.getfixturevalue(which)
    expected = M.load(ModelConfig(name=str(path))).base_hash
    real = torch.frombuffer
    monkeypatch.setattr(torch, "frombuffer", lambda *a, **k: real(*a, **k).clone())
    loaded = M.load(ModelConfig(name=str(path)))
    total, in_map = _bytes(loaded.model, path)
    assert loaded.base_hash == expected
    assert total > 0 and in_map == 0 and loaded.mapped_bytes == 0


@pytest.mark.slow
def test_smollm2_every_parameter_byte_is_in_the_map():
    """The embedded default (its safetensors cache): the loader's views and model.load's."""
    cfg = ModelConfig(name="smollm2-135m")
    src = sources.source(cfg)
    directory = sources.gguf_dir(Path(src.where))
    model, _, _ = sources.instantiate(src, cfg, torch.float32)
    total, in_map = _bytes(model, directory)
    assert in_map == total > 500e6  # float32
    del model
    loaded = M.load(cfg)
    assert loaded.mapped_bytes == _bytes(loaded.model, directory)[1] == total
