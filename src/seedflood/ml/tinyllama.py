"""TinyLlama: the "tiny" test model as a Llama written in plain torch, without transformers.

Owns:
- `TinyConfig`: the Llama hyper-parameters the tiny model varies (sources.TINY_DEFAULTS), and
  the config.json it writes;
- `TinyLlama`: transformers' LlamaForCausalLM as far as this project uses it: the same parameter
  names, shapes and module class names (so the same keyed init gives the same weights and
  weights_hash), the same forward (RMSNorm, rotary embeddings, grouped-query attention through
  scaled_dot_product_attention, SiLU MLP, tied output head; the op order of transformers' sdpa
  path: the scores came out bit-equal when measured), `get_decoder()` taking
  input_ids, position_ids and a 4-D additive mask, `get_output_embeddings()`, and
  `save_pretrained(dir, state_dict=)` writing a standard Llama directory that transformers loads;
- `is_tiny_dir(dir)` / `load_dir(dir, dtype)`: a directory this module saved, loaded back by it.

Why: `from transformers import LlamaConfig, LlamaForCausalLM` costs about 2.5 s of CPU per
process (it pulls torch.distributed.tensor, sympy and torch._dynamo), and every launched test
process paid it for a 0.09 M-parameter model; transformers' generic forward also costs more
Python per call than the model's arithmetic at this size.

Assumes: a decoder-only use (no KV cache, no generation); float dtypes; tests check that the
directory it saves loads in transformers with the same weights and scores to float tolerance.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

MARK = "seedflood_tiny"  # config.json key: this module saved the directory (transformers ignores it)
_ROPE_THETA = 10000.0
_EPS = 1e-6


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    pad_token_id: int = 0
    bos_token_id: int = 1
    eos_token_id: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_json(self, dtype: torch.dtype) -> dict[str, object]:
        """config.json of a transformers Llama with these sizes (defaults spelled out)."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **asdict(self),
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": _EPS,
            "rope_theta": _ROPE_THETA,
            "rope_parameters": {"rope_type": "default", "rope_theta": _ROPE_THETA},
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "tie_word_embeddings": True,
            "use_cache": False,
            "dtype": str(dtype).removeprefix("torch."),
            MARK: 1,
        }


class LlamaRMSNorm(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _EPS)
        return self.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, c: TinyConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, _ = x.shape  # x: B×T×H; cos, sin: B×1×T×D; mask: B×1×T×T additive, or None (causal)
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # B×heads×T×D
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # B×kv_heads×T×D
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        groups = self.heads // self.kv_heads  # each key/value head serves `groups` query heads
        if groups > 1:
            k = k[:, :, None].expand(b, self.kv_heads, groups, t, self.head_dim).reshape(b, self.heads, t, -1)
            v = v[:, :, None].expand(b, self.kv_heads, groups, t, self.head_dim).reshape(b, self.heads, t, -1)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=self.head_dim**-0.5, is_causal=mask is None and t > 1
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1).contiguous())


class LlamaMLP(nn.Module):
    def __init__(self, c: TinyConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, c: TinyConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(c)
        self.mlp = LlamaMLP(c)
        self.input_layernorm = LlamaRMSNorm(c.hidden_size)
        self.post_attention_layernorm = LlamaRMSNorm(c.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """The decoder: token ids -> last hidden states (B×T×H)."""

    def __init__(self, c: TinyConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, c.pad_token_id)
        self.layers = nn.ModuleList(LlamaDecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = LlamaRMSNorm(c.hidden_size)
        self.register_buffer("inv_freq", _inv_freq(c), persistent=False)  # not in the state dict

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **_: object,  # use_cache and the like: there is no cache
    ) -> SimpleNamespace:
        x = self.embed_tokens(input_ids)  # B×T×H
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=x.device)[None].expand(b, t)
        mask = _additive_mask(attention_mask, t, x.dtype)
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)  # B×T×D/2
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype)[:, None], emb.sin().to(x.dtype)[:, None]  # B×1×T×D
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return SimpleNamespace(last_hidden_state=self.norm(x))


def _inv_freq(c: TinyConfig) -> torch.Tensor:
    """D/2 rotary frequencies, as transformers' default RoPE computes them."""
    return 1.0 / (_ROPE_THETA ** (torch.arange(0, c.head_dim, 2, dtype=torch.float) / c.head_dim))


def _additive_mask(mask: torch.Tensor | None, t: int, dtype: torch.dtype) -> torch.Tensor | None:
    """B×1×T×T additive attention mask: a 4-D one as given, a B×T padding mask (1 = token) made
    causal, None for plain causal attention (sdpa's is_causal)."""
    if mask is None or mask.dim() == 4:
        return mask
    if mask.dim() != 2:
        raise ValueError(f"attention_mask must be B×T or B×1×T×T, got shape {tuple(mask.shape)}")
    causal = torch.ones(t, t, dtype=torch.bool, device=mask.device).tril()
    allowed = causal[None] & mask.bool()[:, None, :]  # B×T×T: causal and not padding
    out = torch.zeros(allowed.shape, dtype=dtype, device=mask.device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return out[:, None]


class TinyLlama(nn.Module):
    """LlamaForCausalLM's names, shapes and forward (see the module docstring)."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight  # tied, as tie_word_embeddings=True

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def get_decoder(self) -> LlamaModel:
        return self.model

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def forward(self, input_ids: torch.Tensor, **kwargs: object) -> SimpleNamespace:
        hidden = self.model(input_ids, **kwargs).last_hidden_state
        return SimpleNamespace(logits=self.lm_head(hidden), last_hidden_state=hidden)

    def save_pretrained(self, path: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """config.json + model.safetensors as transformers writes a tied Llama (no lm_head.weight)."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = dict(self.state_dict() if state_dict is None else state_dict)
        state.pop("lm_head.weight", None)  # tied: transformers restores it from the embedding
        dtype = state["model.embed_tokens.weight"].dtype
        (path / "config.json").write_text(json.dumps(self.config.to_json(dtype), indent=2) + "\n")
        tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def is_tiny_dir(path: Path) -> bool:
    """True when `path` holds a model TinyLlama.save_pretrained wrote."""
    try:
        return bool(json.loads((path / "config.json").read_text()).get(MARK))
    except (OSError, ValueError, AttributeError):
        return False


def load_dir(path: Path, dtype: torch.dtype) -> TinyLlama:
    """The TinyLlama saved in `path` (on the CPU, in `dtype`)."""
    from safetensors.torch import load_file

    meta = json.loads((path / "config.json").read_text())
    config = TinyConfig(**{k: meta[k] for k in TinyConfig.__dataclass_fields__})
    with torch.device("meta"):
        model = TinyLlama(config)
    state = load_file(str(path / "model.safetensors"))
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, assign=True)
    model.lm_head.weight = model.model.embed_tokens.weight  # assign=True replaced both: tie again
    model.model.inv_freq = _inv_freq(config)  # buffers are not in the file (meta until now)
    return model.to(dtype)
