"""Distillation loss: KL(teacher || draft) on the teacher's top-k tokens with the tail as one bucket.

The teacher gives, per position, k target token ids and their log-probabilities under the full
softmax. Tokens the draft cannot emit (outside a reduced draft vocabulary) and tokens beyond the
top k are merged into one "tail" outcome on both sides, so the loss is an exact KL between two
distributions over (selected tokens + tail):

    KL = sum_{x in S} p(x) (log p(x) - log q(x)) + p_tail (log p_tail - log q_tail)

with S = top-k ∩ draft vocabulary, p_tail = 1 - sum_S p and q_tail = the draft's mass outside S
(a logsumexp over the unselected logits, never 1 - sum, which cancels catastrophically). With
k = the whole vocabulary this is the full KL; the tail then only holds what the draft cannot
emit, a constant that carries no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Below this teacher tail mass the tail term is dropped (nothing to learn, avoids 0 * log 0).
_TAIL_EPS = 1e-6
# log q_tail is clamped from below so an all-selected row never turns gradients into NaN.
_MIN_LOG = -100.0


@dataclass
class LossOutput:
    loss: torch.Tensor  # [] mean KL over valid positions (what backward runs on)
    num_positions: int
    top1_agreement: float  # share of valid positions where the draft's argmax is the teacher's top-1


def topk_kl(
    draft_logits: torch.Tensor,  # [*positions, num_outputs] float32 (any leading shape, e.g. [batch, seq])
    teacher_ids: torch.Tensor,  # [*positions, k] int64 target token ids, best first
    teacher_logprobs: torch.Tensor,  # [*positions, k] float32, log-probs under the full softmax
    mask: torch.Tensor,  # [*positions] bool: positions that count
    target_to_draft: torch.Tensor | None,  # [target_vocab] int64 output row of each token, -1 if none
) -> LossOutput:
    draft_logp = torch.log_softmax(draft_logits.float(), dim=-1)  # [*positions, num_outputs]
    rows = teacher_ids if target_to_draft is None else target_to_draft[teacher_ids]  # [*positions, k]
    inside = rows >= 0  # [*positions, k]
    safe_rows = rows.clamp(min=0)
    teacher_logprobs = teacher_logprobs.float()
    p = teacher_logprobs.exp() * inside  # [*positions, k]
    q_logp = draft_logp.gather(-1, safe_rows)  # [*positions, k]
    selected_term = (p * (teacher_logprobs - q_logp)).sum(-1)  # [*positions]

    # Tail on the draft side: logsumexp over the rows not selected (a row may appear twice
    # when two teacher ids are outside the vocabulary and both clamp to 0: count, don't set).
    hits = torch.zeros_like(draft_logp).scatter_add_(-1, safe_rows, inside.to(draft_logp.dtype))
    selected = hits > 0  # [*positions, num_outputs]
    log_q_tail = torch.logsumexp(draft_logp.masked_fill(selected, float("-inf")), dim=-1).clamp(min=_MIN_LOG)
    p_tail = (1.0 - p.sum(-1)).clamp(min=0.0)  # [*positions]
    has_rest = selected.sum(-1) < draft_logp.shape[-1]
    use_tail = (p_tail > _TAIL_EPS) & has_rest
    safe_p_tail = torch.where(use_tail, p_tail, torch.ones_like(p_tail))
    tail_term = torch.where(use_tail, p_tail * (safe_p_tail.log() - log_q_tail), torch.zeros_like(p_tail))

    per_position = selected_term + tail_term  # [*positions]
    num_positions = int(mask.sum())
    loss = (per_position * mask).sum() / max(num_positions, 1)
    with torch.no_grad():
        draft_top = draft_logp.argmax(-1)  # [*positions] output rows
        teacher_top = rows[..., 0]  # [*positions] output row of the teacher's best token (-1 if none)
        agree = ((draft_top == teacher_top) & mask).sum()
    return LossOutput(loss, num_positions, float(agree) / max(num_positions, 1))


def teacher_topk(
    teacher_logits: torch.Tensor,  # [..., target_vocab] float32
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([..., k] int64 ids, [..., k] float32 log-probs), best first
    logprobs = torch.log_softmax(teacher_logits.float(), dim=-1)
    values, ids = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
    return ids, values
