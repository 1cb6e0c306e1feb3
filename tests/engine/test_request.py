from __future__ import annotations

import pytest

from engine.core.block_hash import hash_token_blocks, make_block_hasher
from engine.request import FINISH_REASONS, Request, RequestStatus
from engine.sampling_params import SamplingParams


def test_empty_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="prompt"):
        Request("r", [], SamplingParams())


def test_sizes_and_appends() -> None:
    request = Request("r", [5, 6, 7], SamplingParams(max_tokens=4))
    assert (request.num_tokens, request.num_prompt_tokens, request.num_output_tokens) == (3, 3, 0)
    request.append_output_token_ids(8)
    request.append_output_token_ids([9, 10])
    assert request.output_token_ids == [8, 9, 10]
    assert request.all_token_ids == [5, 6, 7, 8, 9, 10]
    assert request.prompt_token_ids == [5, 6, 7]
    request.spec_token_ids = [1, 2]
    assert (request.num_tokens, request.num_tokens_with_spec) == (6, 8)
    assert request.max_tokens == 4
    assert request.num_cached_tokens == -1 and request.num_computed_tokens == 0


def test_prompt_is_copied() -> None:
    prompt = [1, 2, 3]
    request = Request("r", prompt, SamplingParams())
    request.append_output_token_ids(4)
    assert prompt == [1, 2, 3]


def test_status_and_finish_reasons() -> None:
    request = Request("r", [1], SamplingParams())
    assert request.status == RequestStatus.WAITING and not request.is_finished
    assert request.finish_reason is None
    for status in (RequestStatus.RUNNING, RequestStatus.PREEMPTED):
        request.status = status
        assert not request.is_finished and request.finish_reason is None
    for status, reason in FINISH_REASONS.items():
        request.status = status
        assert request.is_finished and request.finish_reason == reason
    assert set(FINISH_REASONS) == {s for s in RequestStatus if RequestStatus.is_finished(s)}


def test_heap_order_is_priority_then_arrival_then_id() -> None:
    a = Request("a", [1], SamplingParams(), priority=1, arrival_time=1.0)
    b = Request("b", [1], SamplingParams(), priority=0, arrival_time=2.0)
    c = Request("c", [1], SamplingParams(), priority=0, arrival_time=3.0)
    d = Request("d", [1], SamplingParams(), priority=0, arrival_time=3.0)
    assert sorted([a, d, c, b]) == [b, c, d, a]


def test_block_hashes_follow_all_tokens() -> None:
    request = Request("r", list(range(7)), SamplingParams(), block_hasher=make_block_hasher(4, "seed"))
    assert request.block_hashes == hash_token_blocks(list(range(7)), 4, "seed")
    assert len(request.block_hashes) == 1
    request.append_output_token_ids(7)
    assert len(request.block_hashes) == 2
    assert request.block_hashes == hash_token_blocks(list(range(8)), 4, "seed")
    # Without a hasher there are no keys at all.
    assert Request("s", list(range(8)), SamplingParams()).block_hashes == []
