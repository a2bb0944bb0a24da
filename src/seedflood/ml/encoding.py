"""Encoding: examples -> a `Batch` of CPU tensors the model scores.

Owns: `encode` (right-padded prompts + candidate option tokens: one C×L table for fixed
candidates, a (B·C)×L table when each example has its own) in two halves, `tokenize` (per example,
so a client can tokenize each example of its shard once) and `collate`; and `Batch`, with the
layouts the model's scoring reads (`row_options`, `first_tokens`, `expand`).

Assumes: a HF tokenizer with a pad token; the task's template and candidates come from its
`TaskSpec` (tasks.get). Bad input raises `TaskError` with one line naming the task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from seedflood.ml import prompts
from seedflood.ml.datafiles import Example, TaskError
from seedflood.ml.tasks import TaskSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Batch:
    """Encoded examples (CPU tensors unless moved with `to`).

    Fixed candidates (every task but COPA) are task constants, so options are stored once (C×L),
    not per example; the sequence scored for (example b, candidate c) is prompt_b followed by
    option_c. With per-example candidates (`per_example`, COPA) the table holds every example's
    own: (B·C)×L, row b·C + c. `n_candidates`, `row_options()` and `first_tokens()` read both
    layouts the same way.
    """

    input_ids: torch.Tensor
    """B×T int64 prompt tokens, right-padded with the pad id."""
    attention_mask: torch.Tensor
    """B×T int64, 1 on prompt tokens."""
    lengths: torch.Tensor
    """B int64 prompt lengths; row b's last prompt token sits at lengths[b] − 1."""
    option_ids: torch.Tensor
    """C×L int64 option tokens of each candidate, right-padded with 0."""
    option_mask: torch.Tensor
    """C×L bool, True on real option tokens."""
    labels: torch.Tensor
    """B int64 gold candidate index."""
    per_example: bool = False
    """True: option_ids/option_mask are (B·C)×L, each example's own candidates."""

    @property
    def n_candidates(self) -> int:
        """C, candidates per example."""
        rows = self.option_ids.shape[0]
        return rows // self.input_ids.shape[0] if self.per_example else rows

    @property
    def single_token(self) -> bool:
        """True when every candidate is one token: one forward over the prompts scores them all."""
        return bool((self.option_mask.sum(dim=1) == 1).all())

    def row_options(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Option ids and mask of every scored row ((B·C)×L; row b·C + c = example b, candidate c)."""
        if self.per_example:
            return self.option_ids, self.option_mask
        b = self.input_ids.shape[0]
        return self.option_ids.repeat(b, 1), self.option_mask.repeat(b, 1)

    def first_tokens(self) -> torch.Tensor:
        """B×C int64: each candidate's first option token (all of it when `single_token`)."""
        b, c = self.input_ids.shape[0], self.n_candidates
        if self.per_example:
            return self.option_ids[:, 0].view(b, c)
        return self.option_ids[:, 0].expand(b, c)

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device) for t in self._tensors()), per_example=self.per_example)

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.input_ids, self.attention_mask, self.lengths, self.option_ids, self.option_mask, self.labels)

    def expand(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The B·C scored sequences (row b·C + c = prompt b + option c), still right-padded.

        Returns ids and attention mask ((B·C)×(T+L)) and `positions` ((B·C)×L): the position
        whose next-token distribution predicts option token j, i.e. ids[r, positions[r, j] + 1]
        == option_ids[c, j] wherever option_mask[c, j].
        """
        b, t = self.input_ids.shape
        c, width = self.n_candidates, self.option_ids.shape[1]  # width: L, option tokens
        # Slots right of a row's real tokens hold filler (0 or pad): causal attention never lets a
        # real position see them, so their value does not matter.
        ids = torch.cat([self.input_ids, self.input_ids.new_zeros(b, width)], 1).repeat_interleave(c, 0)
        mask = torch.cat([self.attention_mask, self.attention_mask.new_zeros(b, width)], 1).repeat_interleave(c, 0)
        start = self.lengths.repeat_interleave(c)  # (B·C) first option position
        cols = start[:, None] + torch.arange(width, device=ids.device)  # (B·C)×L
        opt_ids, opt_mask = self.row_options()  # (B·C)×L, row b·C + c holds example b's option c
        rows = torch.arange(b * c, device=ids.device)[:, None].expand(-1, width)
        ids[rows[opt_mask], cols[opt_mask]] = opt_ids[opt_mask]
        mask[rows[opt_mask], cols[opt_mask]] = 1
        return ids, mask, cols - 1


def _cut(texts: list[str], tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> list[str]:
    """Each text cut to its first max_tokens tokens (at a character boundary of the original)."""
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [
            text if len(offs) <= max_tokens else text[: offs[max_tokens - 1][1]]
            for text, offs in zip(texts, enc["offset_mapping"])
        ]
    enc = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [t if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens]) for t, ids in zip(texts, enc)]


@dataclass(frozen=True)
class Tokens:
    """One example tokenized: its prompt ids (with the tokenizer's special tokens) and, for tasks
    whose examples carry their own candidates, the option ids of each."""

    prompt: list[int]
    options: list[list[int]] | None
    label: int


def tokenize(
    examples: Sequence[Example], spec: TaskSpec, tokenizer: PreTrainedTokenizerBase, max_tokens: int
) -> list[Tokens]:
    """Each example's `Tokens`: truncated fields cut to `max_tokens` tokens first, then the template
    applied. Per example and independent of the others (a caller may cache the result per example)."""
    if tokenizer.pad_token_id is None:
        raise TaskError("the tokenizer has no pad token")
    fields = [dict(e.fields) for e in examples]
    for name in spec.truncate:
        for f, text in zip(fields, _cut([f[name] for f in fields], tokenizer, max_tokens)):
            f[name] = text
    try:
        texts = [spec.template(f) for f in fields]
        choices = [spec.choices(f) for f in fields] if spec.choices else None
    except prompts.PromptError as e:
        raise TaskError(f"task {spec.name}: {e}") from None
    if choices is not None and any(len(c) != spec.n_labels for c in choices):
        raise TaskError(f"task {spec.name}: every example needs {spec.n_labels} candidates")
    prompt_ids = tokenizer(texts)["input_ids"] if texts else []
    if choices is None:
        return [Tokens(p, None, e.label) for p, e in zip(prompt_ids, examples)]
    flat = _options([c for cs in choices for c in cs], spec, tokenizer)
    k = spec.n_labels
    return [Tokens(p, flat[i * k : (i + 1) * k], e.label) for i, (p, e) in enumerate(zip(prompt_ids, examples))]


def _options(candidates: list[str], spec: TaskSpec, tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    """Option ids of each candidate (no special tokens); TaskError if one tokenizes to nothing."""
    options = tokenizer(candidates, add_special_tokens=False)["input_ids"]
    if any(len(o) == 0 for o in options):
        bad = [c for c, o in zip(candidates, options) if not o]
        raise TaskError(f"task {spec.name}: a candidate tokenizes to nothing: {bad[:3]}")
    return options


def collate(rows: Sequence[Tokens], spec: TaskSpec, tokenizer: PreTrainedTokenizerBase) -> Batch:
    """The `Batch` of tokenized examples: prompts right-padded with the pad id, options padded with 0."""
    if not rows:
        raise TaskError("cannot encode an empty list of examples")
    if spec.choices:
        options = [o for r in rows for o in r.options or ()]
    else:
        options = _options(list(spec.candidates), spec, tokenizer)

    def padded(seqs: list[list[int]], fill: int) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), fill, dtype=torch.int64)
        mask = torch.zeros((len(seqs), width), dtype=torch.bool)
        for i, r in enumerate(seqs):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.int64)
            mask[i, : len(r)] = True
        return ids, mask

    input_ids, attn = padded([r.prompt for r in rows], tokenizer.pad_token_id)
    option_ids, option_mask = padded(options, 0)
    return Batch(
        input_ids=input_ids,
        attention_mask=attn.to(torch.int64),
        lengths=torch.tensor([len(r.prompt) for r in rows], dtype=torch.int64),
        option_ids=option_ids,
        option_mask=option_mask,
        labels=torch.tensor([r.label for r in rows], dtype=torch.int64),
        per_example=spec.choices is not None,
    )


def encode(examples: Sequence[Example], spec: TaskSpec, tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> Batch:
    """Tokenize prompts (with the tokenizer's special tokens, e.g. BOS) and the candidates:
    `collate(tokenize(...))`.

    The truncated fields are cut to `max_tokens` tokens first, then the template is applied.
    Options are tokenized on their own (no special tokens) and appended to the prompt ids; for
    byte-level BPE tokenizers (GPT-2, Llama-3, SmolLM2) this equals tokenizing the joined text
    because pre-tokenization splits before the candidate's leading space or after the newline.
    """
    if not examples:
        raise TaskError("cannot encode an empty list of examples")
    return collate(tokenize(examples, spec, tokenizer, max_tokens), spec, tokenizer)
