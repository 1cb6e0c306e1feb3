"""Penalties, logit_bias and the min_tokens mask: exact values on hand-made cases."""

from __future__ import annotations

import torch

from engine.sample.sampler import Sampler
from engine.sample.sampling_metadata import SamplingMetadata
from engine.sampling_params import SamplingParams

INF = float("inf")


def build(params: list[SamplingParams], prompts: list[list[int]], outputs: list[list[int]],
          vocab_size: int, eos: frozenset[int] = frozenset()) -> SamplingMetadata:
    return SamplingMetadata.build(params, prompts, outputs, eos, vocab_size, "cpu")


BASE = [2.0, -1.0, 0.5, -0.5, 1.0, 0.0, 3.0]  # 7 tokens; every value and result below is exact in fp32


def test_penalties_exact_values() -> None:
    params = [
        # Repetition over prompt+output, then presence/frequency over output counts.
        SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25),
        # Presence/frequency only: prompt tokens are not penalized.
        SamplingParams(presence_penalty=1.0, frequency_penalty=0.5),
        # No penalties: row untouched even though the batch has some.
        SamplingParams(),
        # Repetition below 1 rewards seen tokens (HF semantics, applied symmetrically).
        SamplingParams(repetition_penalty=0.5),
    ]
    prompts = [[0, 1], [0, 1], [0, 1], [1, 6]]
    outputs = [[2, 2, 3], [2, 2, 3, 4], [2, 3], [3]]
    logits = torch.tensor([BASE] * 4)
    Sampler().process_logits(logits, build(params, prompts, outputs, 7))
    expected = torch.tensor([
        # 0: prompt, 2/2. 1: prompt, -1*2. 2: out x2, 0.5/2 - 0.25*2 - 0.5. 3: out x1, -0.5*2 - 0.25 - 0.5.
        [1.0, -2.0, -0.75, -1.75, 1.0, 0.0, 3.0],
        # 2: 0.5 - 0.5*2 - 1. 3: -0.5 - 0.5 - 1. 4: 1 - 0.5 - 1.
        [2.0, -1.0, -1.5, -2.0, -0.5, 0.0, 3.0],
        BASE,
        # 1: prompt, -1*0.5. 3: output, -0.5*0.5. 6: prompt, 3/0.5.
        [2.0, -0.5, 0.5, -0.25, 1.0, 0.0, 6.0],
    ])
    assert torch.equal(logits, expected)


def test_repetition_penalty_changes_greedy_choice() -> None:
    # Token 6 leads, but it was in the prompt; with penalty 4 it drops to 0.75 < 2.0 (token 0).
    logits = torch.tensor([BASE, BASE])
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, repetition_penalty=4.0)]
    out = Sampler()(logits, build(params, [[6], [6]], [[], []], 7))
    assert out.sampled_token_ids.tolist() == [6, 0]


def test_logit_bias_adds_exactly_and_steers_greedy() -> None:
    params = [SamplingParams(temperature=0.0, logit_bias={4: 2.5, 6: -100.0}), SamplingParams(temperature=0.0)]
    logits = torch.tensor([BASE, BASE])
    meta = build(params, [[0], [0]], [[], []], 7)
    Sampler().process_logits(logits, meta)
    assert torch.equal(logits[0], torch.tensor([2.0, -1.0, 0.5, -0.5, 3.5, 0.0, -97.0]))
    assert torch.equal(logits[1], torch.tensor(BASE))
    out = Sampler()(torch.tensor([BASE, BASE]), build(params, [[0], [0]], [[], []], 7))
    assert out.sampled_token_ids.tolist() == [4, 6]


def test_min_tokens_blocks_eos_and_stop_ids() -> None:
    eos = frozenset({6})
    params = [
        SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[0]),
        SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[0]),  # already has 2 outputs
        SamplingParams(temperature=0.0, min_tokens=1, ignore_eos=True),
    ]
    outputs = [[3], [3, 4], []]
    logits = torch.tensor([BASE] * 3)
    Sampler().process_logits(logits, build(params, [[1]] * 3, outputs, 7, eos))
    assert torch.isneginf(logits[0, [0, 6]]).all() and torch.isfinite(logits[0, 1:6]).all()
    assert torch.isfinite(logits[1]).all()
    assert torch.isneginf(logits[2, 6]) and torch.isfinite(logits[2, :6]).all()

    out = Sampler()(torch.tensor([BASE] * 3), build(params, [[1]] * 3, outputs, 7, eos))
    # Row 0 cannot take 6 (EOS) or 0 (stop id), so takes the best remaining (4, logit 1.0).
    assert out.sampled_token_ids.tolist() == [4, 6, 0]


def test_min_tokens_mask_holds_under_random_sampling() -> None:
    torch.manual_seed(0)
    num_rows = 4000
    # EOS (6) and stop id (0) carry almost all the mass; they must still never be drawn.
    logits = torch.tensor([[8.0, 0.0, 0.0, 0.0, 0.0, 0.0, 9.0]]).repeat(num_rows, 1)
    params = [SamplingParams(min_tokens=1, stop_token_ids=[0])] * num_rows
    meta = build(params, [[1]] * num_rows, [[]] * num_rows, 7, frozenset({6}))
    sampled = Sampler()(logits, meta).sampled_token_ids
    counts = torch.bincount(sampled, minlength=7)
    assert counts[0] == 0 and counts[6] == 0
    assert (counts[1:6] > 0).all()  # the other five tokens are all reachable
