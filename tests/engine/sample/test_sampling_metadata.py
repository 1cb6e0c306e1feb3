from __future__ import annotations

import pytest
import torch

from engine.sample.sampling_metadata import SamplingMetadata, make_generator, position_seed
from engine.sampling_params import SamplingParams

VOCAB = 50


def build(
    params: list[SamplingParams],
    outputs: list[list[int]] | None = None,
    prompts: list[list[int]] | None = None,
    eos: frozenset[int] = frozenset({0}),
    vocab_size: int = VOCAB,
) -> SamplingMetadata:
    return SamplingMetadata.build(
        params=params,
        prompt_token_ids=prompts if prompts is not None else [[1, 2, 3]] * len(params),
        output_token_ids=outputs if outputs is not None else [[]] * len(params),
        eos_token_ids=eos,
        vocab_size=vocab_size,
        device="cpu",
    )


def test_plain_greedy_batch_builds_no_tensors() -> None:
    # Greedy rows that also carry top-k/top-p/min-p/seed (clients often send them) stay cheap.
    params = [SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2, seed=1), SamplingParams(temperature=0.0)]
    meta = build(params)
    assert meta.all_greedy and not meta.all_random
    assert meta.temperature is None and meta.is_greedy is None
    assert meta.top_k is None and meta.top_p is None and meta.min_p is None
    assert meta.penalties is None and meta.logit_bias is None and meta.min_tokens_mask is None
    assert meta.generators == {} and meta.max_num_logprobs is None


def test_mixed_batch_greedy_rows_are_neutral() -> None:
    params = [
        SamplingParams(temperature=0.0, top_k=2, top_p=0.1, min_p=0.9),
        SamplingParams(temperature=0.5, top_k=7, seed=5),
        SamplingParams(temperature=2.0, top_p=0.8, min_p=0.1),
    ]
    meta = build(params, outputs=[[], [4, 4, 4], []])
    assert not meta.all_greedy and not meta.all_random
    assert meta.is_greedy is not None and meta.is_greedy.tolist() == [True, False, False]
    assert meta.temperature is not None and meta.temperature.tolist() == [1.0, 0.5, 2.0]
    assert meta.top_k is not None and meta.top_k.tolist() == [VOCAB, 7, VOCAB]
    assert meta.max_top_k == 7
    assert meta.top_p is not None and meta.top_p.tolist() == pytest.approx([1.0, 1.0, 0.8])
    assert meta.min_p is not None and meta.min_p.tolist() == pytest.approx([0.0, 0.0, 0.1])
    # The seeded row's noise: seeded by its seed and the position it samples (its 4th output).
    assert list(meta.generators) == [1]
    expected = torch.rand(4, generator=make_generator(position_seed(5, 3), "cpu"))
    assert torch.equal(torch.rand(4, generator=meta.generators[1]), expected)


def test_top_k_disabled_values_and_clamping() -> None:
    params = [SamplingParams(top_k=0), SamplingParams(top_k=-1), SamplingParams(top_k=VOCAB + 10)]
    meta = build(params)
    assert meta.all_random and meta.top_k is None and meta.max_top_k == 0
    meta = build(params + [SamplingParams(top_k=3), SamplingParams(top_k=9)])
    assert meta.top_k is not None and meta.top_k.tolist() == [VOCAB, VOCAB, VOCAB, 3, 9]
    assert meta.max_top_k == 9


def test_seeded_rows_get_a_generator_per_position() -> None:
    # Two rows of one seeded request at consecutive positions (a verification step) draw
    # different noise; the same position draws the same noise in any row of any batch.
    params = [SamplingParams(seed=3), SamplingParams(seed=3), SamplingParams(), SamplingParams(seed=3)]
    meta = build(params, outputs=[[7, 7], [7, 7, 9], [1], [8, 8]])
    assert sorted(meta.generators) == [0, 1, 3]
    first, second, again = (torch.rand(8, generator=meta.generators[row]) for row in (0, 1, 3))
    assert not torch.equal(first, second) and torch.equal(first, again)
    assert len({position_seed(3, n) for n in range(1000)} | {position_seed(4, n) for n in range(1000)}) == 2000
    # A seeded greedy row never draws noise, so it gets no generator.
    meta = build([SamplingParams(temperature=0.0, seed=3)])
    assert meta.generators == {}


def test_rejects_mismatched_lengths_and_out_of_vocab_ids() -> None:
    with pytest.raises(ValueError, match="output_token_ids"):
        SamplingMetadata.build([SamplingParams()], [[1]], [], frozenset(), VOCAB, "cpu")
    with pytest.raises(ValueError, match="logit_bias"):
        build([SamplingParams(logit_bias={VOCAB: 1.0})])
    with pytest.raises(ValueError, match="stop_token_ids"):
        build([SamplingParams(stop_token_ids=[VOCAB + 1])])
    with pytest.raises(ValueError, match="eos_token_ids"):
        build([SamplingParams(min_tokens=2)], eos=frozenset({VOCAB}))
    with pytest.raises(ValueError, match="vocab_size"):
        build([SamplingParams()], vocab_size=0)


def test_min_tokens_mask_covers_eos_and_stop_ids_until_reached() -> None:
    params = [
        SamplingParams(min_tokens=3, stop_token_ids=[7, 0]),  # 2 outputs: still masked
        SamplingParams(min_tokens=2, stop_token_ids=[9]),  # 2 outputs: reached
        SamplingParams(min_tokens=1, ignore_eos=True),  # ignore_eos does not lift the mask
        SamplingParams(stop_token_ids=[4]),  # no min_tokens
    ]
    meta = build(params, outputs=[[5, 6], [5, 6], [], []], eos=frozenset({0, 2}))
    mask = meta.min_tokens_mask
    assert mask is not None
    pairs = sorted(zip(mask.row_ids.tolist(), mask.token_ids.tolist()))
    assert pairs == [(0, 0), (0, 2), (0, 7), (2, 0), (2, 2)]
    assert torch.isneginf(mask.values).all()


def test_logit_bias_is_sparse() -> None:
    meta = build([SamplingParams(), SamplingParams(logit_bias={3: 2.5, 8: -100.0})])
    bias = meta.logit_bias
    assert bias is not None
    assert list(zip(bias.row_ids.tolist(), bias.token_ids.tolist(), bias.values.tolist())) == [
        (1, 3, 2.5), (1, 8, -100.0)]


def test_penalty_tensors_copy_only_needed_rows() -> None:
    params = [
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(frequency_penalty=0.5),
        SamplingParams(),
    ]
    meta = build(params, prompts=[[1, 2, 3], [4, 5], [6]], outputs=[[7], [8, 9], [10, 11, 12]])
    pen = meta.penalties
    assert pen is not None and pen.repetition_penalties is not None and pen.prompt_token_ids is not None
    assert pen.repetition_penalties.tolist() == pytest.approx([1.3, 1.0, 1.0])
    # Only the repetition row needs its prompt; rows are padded with vocab_size.
    assert pen.prompt_token_ids.tolist() == [[1, 2, 3], [VOCAB] * 3, [VOCAB] * 3]
    # The penalty-free row's outputs are not copied.
    assert pen.output_token_ids.tolist() == [[7, VOCAB], [8, 9], [VOCAB, VOCAB]]
    assert pen.frequency_penalties is not None and pen.frequency_penalties.tolist() == [0.0, 0.5, 0.0]
    # Without repetition penalties no prompt tensor is built.
    meta = build([SamplingParams(presence_penalty=1.0)])
    assert meta.penalties is not None and meta.penalties.prompt_token_ids is None
    assert meta.penalties.repetition_penalties is None


def test_logprob_counts() -> None:
    meta = build([SamplingParams(logprobs=0), SamplingParams(), SamplingParams(logprobs=5)])
    assert meta.max_num_logprobs == 5
    assert meta.num_logprobs == [0, None, 5]
    assert build([SamplingParams(logprobs=0)]).max_num_logprobs == 0


def test_empty_batch() -> None:
    meta = build([])
    assert meta.num_reqs == 0 and meta.all_greedy and meta.temperature is None
