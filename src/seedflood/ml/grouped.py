"""Grouped forwards: the losses of G groups of batches from one decoder forward (batched.py).

Owns `grouped_losses` and `GroupLayout` (which packed rows belong to which group), so a caller
can perturb each group's rows differently inside one forward.

Assumes: objective.py's packing (`plan`) and model split (`parts`); every group alone would be
scored exactly as `objective.candidate_scores_grad` scores it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from seedflood.ml.encoding import Batch
from seedflood.ml.objective import parts, plan

if TYPE_CHECKING:
    from transformers import PreTrainedModel


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
    plans = [plan(lengths.tolist()) for _, lengths in inputs]
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
