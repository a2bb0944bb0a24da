"""Objective: MeZO's classification loss and the evaluation scores of a model on examples.

Owns:
- `candidate_scores` / `loss`: a candidate's score is the mean log-probability of its option
  tokens after the prompt; the loss is the cross-entropy of the C scores against the gold index.
  Sequences are packed without padding (block-diagonal causal mask, positions restarting per
  sequence; `plan`, `forward_packed`), the output head runs only at the positions that predict
  option tokens, and when every candidate is a single token one forward over the prompts scores
  all of them (they are columns of the last prompt position's log-softmax);
- `evaluate`: scores of a list of examples plus `scoring.metrics`;
- `parts`: a model's decoder and output head.

Assumes: decoder-only HF models whose `get_decoder()` accepts position_ids and a 4-D additive
attention mask (transformers' masking_utils passes it through as is) and whose last_hidden_state
feeds `get_output_embeddings()` directly: Llama, Mistral, Qwen, OPT style; not models with
logit soft-capping or scaling.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from seedflood.ml import scoring
from seedflood.ml.datafiles import Example
from seedflood.ml.encoding import Batch, encode
from seedflood.ml.tasks import TaskSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


_PACK_TOKENS = 512
"""Tokens per packed row. A row's attention costs O(row²) whatever the mask, so rows stay short;
measured on CPU, SmolLM2 scores an rt batch of 16 (~430 tokens) as fast in one row as in 2 or 4."""


def parts(model: PreTrainedModel) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(decoder returning last_hidden_state, output head mapping hidden states to vocab logits)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    return decoder, model.get_output_embeddings()


def plan(lens: Sequence[int]) -> tuple[list[int], list[tuple[int, int]]]:
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


def forward_packed(
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
    fill, place = plan(lens)
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
        hidden, start = forward_packed(decoder, batch.input_ids, batch.lengths)
        last = hidden[start + batch.lengths.to(device) - 1]  # B×H at each prompt's last token
        logp = head(last).float().log_softmax(dim=-1)  # B×V: the only full-vocab logits
        return logp.gather(1, batch.first_tokens().to(device))  # B×C
    ids, _, positions = batch.expand()  # (B·C)×S, (B·C)×L; row r = (example r // C, candidate r % C)
    option_ids, real = batch.row_options()  # (B·C)×L each: fixed or per-example candidates
    hidden, start = forward_packed(decoder, ids, batch.lengths.repeat_interleave(c) + real.sum(1))
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


def evaluate(
    model: PreTrainedModel,
    examples: Sequence[Example],
    spec: TaskSpec,
    tokenizer: PreTrainedTokenizerBase,
    max_tokens: int,
    batch_size: int,
    dev: Mapping[str, Any] | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Score `examples`: {"scores": N×C float32 array, "labels": N int64 array, "metrics": Metrics}.

    Pass a previous result on the dev split as `dev` to get the test accuracy at the dev-tuned
    margin threshold (binary tasks). `on_batch` (a progress display) is called after each batch
    with the number of examples scored so far.
    """
    if not examples:
        raise ValueError("evaluate needs at least one example")
    chunks = []
    for i in range(0, len(examples), batch_size):
        batch = encode(examples[i : i + batch_size], spec, tokenizer, max_tokens)
        chunks.append(candidate_scores(model, batch).cpu().numpy())
        if on_batch is not None:
            on_batch(min(i + batch_size, len(examples)))
    scores = np.concatenate(chunks)
    labels = np.array([e.label for e in examples], dtype=np.int64)
    metrics = scoring.metrics(
        scores, labels, None if dev is None else dev["scores"], None if dev is None else dev["labels"]
    )
    return {"scores": scores, "labels": labels, "metrics": metrics}
