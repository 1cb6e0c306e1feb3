"""The rejection sampler keeps the target's distribution exactly (chi-square over many draws)
and the greedy path exactly."""

from __future__ import annotations

import math

import pytest
import torch

from engine.sample.rejection_sampler import RejectionSampler, VerifyRequest
from engine.sample.sampler import Sampler
from engine.sample.sampling_metadata import SamplingMetadata
from engine.sampling_params import SamplingParams

VOCAB = 8


def _meta(params: SamplingParams, num_rows: int) -> SamplingMetadata:
    return SamplingMetadata.build([params] * num_rows, [[0]] * num_rows, [[]] * num_rows, frozenset(), VOCAB, "cpu")


def _target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:  # [rows, vocab]
    meta = _meta(params, logits.shape[0])
    return Sampler().compute_probs(logits.clone(), meta)


def _chi_square_ok(counts: torch.Tensor, probs: torch.Tensor, draws: int) -> None:
    expected = probs * draws
    keep = expected > 0
    assert (counts[~keep] == 0).all(), "a token outside the target's support was emitted"
    statistic = float((((counts[keep] - expected[keep]) ** 2) / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    # p < 1e-4 critical value, approximated (Wilson-Hilferty): tight enough to catch a wrong
    # residual or acceptance rule with these sample sizes, loose enough to never flake.
    z = 3.72
    critical = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3 if dof > 0 else 0.0
    assert statistic < critical, (statistic, critical, counts, expected)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.9, top_k=6, top_p=0.9, min_p=0.05),
], ids=["t1", "topk", "topp", "all"])
@pytest.mark.parametrize("draft_kind", ["one_hot", "sampled"])
def test_emitted_tokens_follow_the_target(params: SamplingParams, draft_kind: str) -> None:
    torch.manual_seed(0)
    k = 2
    logits = torch.randn(k + 1, VOCAB) * 2  # p_1, p_2, p_3: the same for every trial
    target = _target_probs(logits, params)
    draft_probs = torch.softmax(torch.randn(k, VOCAB) * 2, dim=-1)  # q_1, q_2
    sampler = RejectionSampler(Sampler())
    draws = 4000
    generator = torch.Generator().manual_seed(1)
    # All trials in one batch: each trial is a request whose k + 1 rows hold the same logits.
    requests = []
    for trial in range(draws):
        if draft_kind == "sampled":
            drafts = [int(torch.multinomial(draft_probs[j], 1, generator=generator)) for j in range(k)]
            q = draft_probs
        else:
            drafts = [int(torch.randint(VOCAB, (1,), generator=generator)) for _ in range(k)]
            q = None
        requests.append(VerifyRequest(first_row=trial * (k + 1), draft_token_ids=drafts, greedy=False,
                                      draft_probs=q))
    tokens, _ = sampler(logits.repeat(draws, 1), _meta(params, draws * (k + 1)), requests)
    first = torch.zeros(VOCAB)
    second = torch.zeros(VOCAB)
    num_second = 0
    for emitted in tokens:
        assert 1 <= len(emitted) <= k + 1
        first[emitted[0]] += 1
        if len(emitted) >= 2:
            second[emitted[1]] += 1
            num_second += 1
    _chi_square_ok(first, target[0], draws)
    # Given that the first draft was kept, the next token follows p_2 (p_2 here does not depend
    # on the first token).
    assert num_second > 200
    _chi_square_ok(second, target[1], num_second)


def test_greedy_accepts_the_matching_prefix_then_corrects() -> None:
    logits = torch.full((4, VOCAB), -5.0)
    argmax = [3, 1, 6, 2]
    for row, token in enumerate(argmax):
        logits[row, token] = 5.0
    params = SamplingParams(temperature=0.0)
    sampler = RejectionSampler(Sampler())
    cases = {(3, 1, 6): [3, 1, 6, 2], (3, 1, 0): [3, 1, 6], (0, 1, 6): [3], (3, 4, 6): [3, 1]}
    for drafts, expected in cases.items():
        tokens, _ = sampler(logits.clone(), _meta(params, 4),
                            [VerifyRequest(0, list(drafts), greedy=True)])
        assert tokens == [expected]


def test_mixed_batch_and_logprobs() -> None:
    torch.manual_seed(3)
    logits = torch.randn(5, VOCAB)
    params = [SamplingParams(temperature=0.0, logprobs=2)] * 3 + [SamplingParams(temperature=0.8, seed=5)] * 2
    meta = SamplingMetadata.build(params, [[0]] * 5, [[]] * 5, frozenset(), VOCAB, "cpu")
    argmax = logits.argmax(-1).tolist()
    requests = [VerifyRequest(0, [argmax[0], argmax[1]], greedy=True),
                VerifyRequest(3, [0], greedy=False)]
    tokens, logprobs = RejectionSampler(Sampler())(logits.clone(), meta, requests)
    assert tokens[0] == argmax[:3]
    assert 1 <= len(tokens[1]) <= 2
    assert logprobs is not None and len(logprobs[0]) == 3 and all(e is not None for e in logprobs[0])
    expected = torch.log_softmax(logits, -1)
    for j, (token_id, logprob, top) in enumerate(logprobs[0]):
        assert token_id == argmax[j] and logprob == pytest.approx(float(expected[j, token_id]), abs=1e-5)
        assert len(top) == 2
    assert all(e is None for e in logprobs[1])


def test_a_seeded_request_emits_what_plain_sampling_would() -> None:
    """With one-hot drafts, a seeded row is sampled with the noise plain decoding uses at that
    output position, so the emitted tokens are plain decoding's, whatever the drafts: all of them
    when the drafts are right, up to and including the correction when one is wrong."""
    torch.manual_seed(7)
    k = 4
    params = SamplingParams(temperature=1.0, seed=1234)
    logits = torch.randn(k + 1, VOCAB)  # row j: the target's logits at output position 3 + j
    history = [5, 1, 2]  # outputs before this step
    sampler = Sampler()
    plain: list[int] = []
    for j in range(k + 1):  # plain decoding, one token per step
        meta = SamplingMetadata.build([params], [[0]], [history + plain], frozenset(), VOCAB, "cpu")
        plain.append(int(sampler(logits[j: j + 1].clone(), meta).sampled_token_ids[0]))

    def verify(drafts: list[int]) -> list[int]:
        rows = [history + drafts[:j] for j in range(k + 1)]
        meta = SamplingMetadata.build([params] * (k + 1), [[0]] * (k + 1), rows, frozenset(), VOCAB, "cpu")
        tokens, _ = RejectionSampler(Sampler())(logits.clone(), meta, [VerifyRequest(0, drafts, greedy=False)])
        return tokens[0]

    assert verify(plain[:k]) == plain  # every draft accepted, the bonus token too
    for wrong_at in range(k):
        drafts = list(plain[:k])
        drafts[wrong_at] = (drafts[wrong_at] + 1) % VOCAB
        assert verify(drafts) == plain[: wrong_at + 1]
    # Another seed samples differently somewhere over many positions.
    other = SamplingParams(temperature=1.0, seed=1235)
    many = torch.randn(64, VOCAB)
    draws = {seed_params.seed: [int(sampler(many[j: j + 1].clone(), SamplingMetadata.build(
        [seed_params], [[0]], [[0] * j], frozenset(), VOCAB, "cpu")).sampled_token_ids[0]) for j in range(64)]
        for seed_params in (params, other)}
    assert draws[1234] != draws[1235]
