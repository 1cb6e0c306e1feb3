"""Logprobs come from the processed logits (bias, min_tokens, penalties), before temperature and
truncation; top lists are sorted and trimmed per request."""

from __future__ import annotations

import torch

from engine.sample.sampler import Sampler
from engine.sample.sampling_metadata import SamplingMetadata
from engine.sampling_params import SamplingParams

VOCAB = 300


def make_logits(num_rows: int) -> torch.Tensor:  # [num_rows, VOCAB]
    return torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(4)) * 3.0


def test_logprobs_are_log_softmax_of_processed_logits() -> None:
    params = [
        # Temperature and truncation must not change the reported logprobs.
        SamplingParams(temperature=0.3, top_k=2, top_p=0.5, logprobs=5, logit_bias={7: 4.0}),
        SamplingParams(temperature=0.0, logprobs=3, presence_penalty=1.5, frequency_penalty=0.5),
        SamplingParams(logprobs=0, min_tokens=1),  # min_tokens masks EOS (token 1)
        SamplingParams(min_p=0.3),  # asks for none
    ]
    prompts = [[5], [5], [5], [5]]
    outputs = [[9], [9, 9, 12], [], []]
    logits = make_logits(4)
    meta = SamplingMetadata.build(params, prompts, outputs, frozenset({1}), VOCAB, "cpu")
    torch.manual_seed(0)
    out = Sampler()(logits.clone(), meta)
    assert out.logprobs is not None

    processed = logits.clone()
    processed[0, 7] += 4.0
    processed[1, 9] -= 1.5 + 0.5 * 2
    processed[1, 12] -= 1.5 + 0.5
    processed[2, 1] = float("-inf")
    reference = torch.log_softmax(processed, dim=-1)

    sampled = out.sampled_token_ids
    assert sampled[1] == processed[1].argmax()
    assert not (sampled[2] == 1)
    torch.testing.assert_close(out.logprobs.sampled_logprobs, reference.gather(1, sampled.unsqueeze(1)).squeeze(1))
    ref_values, ref_ids = reference.topk(5, dim=-1)
    assert torch.equal(out.logprobs.top_token_ids, ref_ids)
    torch.testing.assert_close(out.logprobs.top_logprobs, ref_values)
    assert (out.logprobs.top_logprobs[:, :-1] >= out.logprobs.top_logprobs[:, 1:]).all()
    # The truncated row still reports finite logprobs outside its top-k (pre-truncation values).
    assert torch.isfinite(out.logprobs.top_logprobs[0]).all()


def test_tolists_trims_per_request() -> None:
    params = [SamplingParams(logprobs=2), SamplingParams(), SamplingParams(logprobs=0), SamplingParams(logprobs=4)]
    meta = SamplingMetadata.build(params, [[0]] * 4, [[]] * 4, frozenset(), VOCAB, "cpu")
    logits = make_logits(4)
    reference = torch.log_softmax(logits, dim=-1)
    torch.manual_seed(0)
    out = Sampler()(logits.clone(), meta)
    assert out.logprobs is not None
    rows = out.logprobs.tolists()
    assert rows[1] is None
    tokens = out.sampled_token_ids.tolist()
    for row, count in ((0, 2), (2, 0), (3, 4)):
        entry = rows[row]
        assert entry is not None
        token_id, logprob, top = entry
        assert token_id == tokens[row]
        assert logprob == float(reference[row, token_id])
        assert len(top) == count
        ids = reference[row].topk(4).indices.tolist()[:count]
        assert [t for t, _ in top] == ids
        assert [lp for _, lp in top] == [float(reference[row, t]) for t in ids]
        assert all(isinstance(t, int) and isinstance(lp, float) for t, lp in top)


def test_no_logprobs_requested_returns_none() -> None:
    meta = SamplingMetadata.build([SamplingParams()], [[0]], [[]], frozenset(), VOCAB, "cpu")
    assert Sampler()(make_logits(1), meta).logprobs is None
