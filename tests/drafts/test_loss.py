"""The top-k KL with a tail bucket: exact against hand-computed KLs, zero at equality, finite gradients."""

from __future__ import annotations

import torch

from drafts.loss import teacher_topk, topk_kl
from drafts.vocab import target_to_draft_map


def _kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:  # [..., n] probabilities -> [...]
    return (p * (p.log() - q.log())).sum(-1)


def test_full_k_is_the_full_kl() -> None:
    generator = torch.Generator().manual_seed(0)
    teacher_logits = 3 * torch.randn(2, 5, 11, generator=generator)
    draft_logits = 3 * torch.randn(2, 5, 11, generator=generator)
    ids, logprobs = teacher_topk(teacher_logits, k=11)
    mask = torch.ones(2, 5, dtype=torch.bool)
    out = topk_kl(draft_logits, ids, logprobs, mask, None)
    expected = _kl(teacher_logits.softmax(-1), draft_logits.softmax(-1)).mean()
    torch.testing.assert_close(out.loss, expected, atol=1e-6, rtol=1e-5)


def test_top_k_merges_the_rest_into_one_bucket() -> None:
    generator = torch.Generator().manual_seed(1)
    teacher_logits = 2 * torch.randn(1, 3, 9, generator=generator)
    draft_logits = 2 * torch.randn(1, 3, 9, generator=generator)
    k = 3
    ids, logprobs = teacher_topk(teacher_logits, k)
    out = topk_kl(draft_logits, ids, logprobs, torch.ones(1, 3, dtype=torch.bool), None)
    p, q = teacher_logits.softmax(-1)[0], draft_logits.softmax(-1)[0]
    expected = []
    for pos in range(3):
        top = ids[0, pos]
        rest = torch.ones(9, dtype=torch.bool)
        rest[top] = False
        p_coarse = torch.cat([p[pos, top], p[pos, rest].sum()[None]])
        q_coarse = torch.cat([q[pos, top], q[pos, rest].sum()[None]])
        expected.append(_kl(p_coarse, q_coarse))
    torch.testing.assert_close(out.loss, torch.stack(expected).mean(), atol=1e-6, rtol=1e-5)


def test_reduced_vocabulary_sends_missing_tokens_to_the_tail() -> None:
    generator = torch.Generator().manual_seed(2)
    vocab_ids = torch.tensor([0, 2, 3, 5, 7])  # the draft emits 5 of 8 tokens
    teacher_logits = 2 * torch.randn(1, 4, 8, generator=generator)
    draft_logits = 2 * torch.randn(1, 4, 5, generator=generator)
    ids, logprobs = teacher_topk(teacher_logits, 4)
    out = topk_kl(draft_logits, ids, logprobs, torch.ones(1, 4, dtype=torch.bool), target_to_draft_map(vocab_ids, 8))
    p, q = teacher_logits.softmax(-1)[0], draft_logits.softmax(-1)[0]
    expected = []
    for pos in range(4):
        chosen = [int(t) for t in ids[0, pos] if int(t) in vocab_ids.tolist()]
        rows = [vocab_ids.tolist().index(t) for t in chosen]
        rest_rows = [r for r in range(5) if r not in rows]
        p_coarse = torch.cat([p[pos, chosen], (1 - p[pos, chosen].sum())[None]])
        q_coarse = torch.cat([q[pos, rows], q[pos, rest_rows].sum()[None]])
        expected.append(_kl(p_coarse, q_coarse))
    torch.testing.assert_close(out.loss, torch.stack(expected).mean(), atol=1e-6, rtol=1e-5)


def test_identical_distributions_give_zero_and_mask_drops_positions() -> None:
    generator = torch.Generator().manual_seed(3)
    logits = 2 * torch.randn(2, 6, 10, generator=generator)
    ids, logprobs = teacher_topk(logits, 4)
    mask = torch.tensor([[True] * 6, [True] * 2 + [False] * 4])
    out = topk_kl(logits, ids, logprobs, mask, None)
    assert abs(float(out.loss)) < 1e-6
    assert out.num_positions == 8
    assert out.top1_agreement == 1.0
    # A masked position can hold anything without changing the loss.
    draft = logits.clone()
    draft[1, 3:] = 50 * torch.randn(3, 10, generator=generator)
    assert abs(float(topk_kl(draft, ids, logprobs, mask, None).loss)) < 1e-6


def test_gradients_are_finite_when_every_draft_token_is_selected() -> None:
    # k covers the whole (reduced) draft vocabulary: the draft has no tail; no NaN may appear.
    vocab_ids = torch.tensor([1, 4])
    teacher_logits = torch.tensor([[[0.0, 5.0, -1.0, 0.5, 4.0, -3.0]]])
    draft_logits = torch.tensor([[[0.3, -0.2]]], requires_grad=True)
    ids, logprobs = teacher_topk(teacher_logits, 6)
    out = topk_kl(draft_logits, ids, logprobs, torch.ones(1, 1, dtype=torch.bool), target_to_draft_map(vocab_ids, 6))
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(draft_logits.grad).all()
    assert draft_logits.grad.abs().sum() > 0
