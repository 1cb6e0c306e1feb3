"""Exact block ids on tiny pools, in the style of vLLM's test_prefix_caching.py."""

from __future__ import annotations

import pytest

from engine.core.block_hash import make_block_hasher
from engine.core.kv_cache_manager import KVCacheManager
from engine.request import Request
from engine.sampling_params import SamplingParams

BLOCK_SIZE = 4
HASHER = make_block_hasher(BLOCK_SIZE, "test-model")


def make_request(request_id: str, token_ids: list[int], cache_salt: str | None = None) -> Request:
    return Request(request_id, token_ids, SamplingParams(), cache_salt=cache_salt, block_hasher=HASHER)


def admit(manager: KVCacheManager, request: Request) -> list[int] | None:
    """Admission as the scheduler does it: prefix lookup, then allocate the rest."""
    blocks, num_hit_tokens = manager.get_computed_blocks(request)
    new_ids = manager.allocate_slots(request, request.num_tokens - num_hit_tokens, num_hit_tokens, blocks)
    if new_ids is not None:
        request.num_computed_tokens = num_hit_tokens
    return new_ids


def compute_all(request: Request) -> None:
    request.num_computed_tokens = request.num_tokens  # the step ran


def free_ids(manager: KVCacheManager) -> list[int]:
    return [block.block_id for block in manager.block_pool.free_block_queue]


def ref_counts(manager: KVCacheManager) -> list[int]:
    return [block.ref_cnt for block in manager.block_pool.blocks]


def test_prefix_hit_shares_full_blocks_but_not_the_partial_one() -> None:
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    common = list(range(100, 108))  # two full blocks
    a = make_request("a", common + [1, 2])
    assert manager.get_computed_blocks(a) == ([], 0)
    assert admit(manager, a) == [0, 1, 2]
    assert len(manager.block_pool.cached_block_hash_to_block) == 2  # block 2 is partial
    compute_all(a)

    b = make_request("b", common + [7, 8, 9])
    blocks, num_hit_tokens = manager.get_computed_blocks(b)
    assert [block.block_id for block in blocks] == [0, 1] and num_hit_tokens == 8
    assert admit(manager, b) == [3]
    assert b.num_computed_tokens == 8
    assert manager.get_block_ids("a") == [0, 1, 2] and manager.get_block_ids("b") == [0, 1, 3]
    assert ref_counts(manager)[:4] == [2, 2, 1, 1]
    assert (manager.prefix_cache_queries, manager.prefix_cache_hits) == (10 + 11, 8)


def test_eviction_is_lru_with_a_freed_requests_tail_first() -> None:
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    common = list(range(100, 108))
    a, b = make_request("a", common + [1, 2]), make_request("b", common + [7, 8, 9])
    admit(manager, a)
    compute_all(a)
    admit(manager, b)
    compute_all(b)
    manager.free(a)
    assert free_ids(manager) == [4, 5, 6, 7, 8, 9, 2]  # 0 and 1 are still held by b
    manager.free(b)
    assert free_ids(manager) == [4, 5, 6, 7, 8, 9, 2, 3, 1, 0]
    assert manager.num_free_blocks == 10 and manager.usage == 0.0

    # A request with new contents takes never-used blocks, then the freed tails.
    c = make_request("c", list(range(500, 528)))  # 7 blocks
    assert admit(manager, c) == [4, 5, 6, 7, 8, 9, 2]
    compute_all(c)
    # The shared prefix is still cached: a hit takes blocks 0 and 1 out of the free queue.
    d = make_request("d", common + [1])
    assert admit(manager, d) == [3]
    assert manager.get_block_ids("d") == [0, 1, 3]
    assert free_ids(manager) == []


def test_freed_hash_survives_until_its_block_is_reused() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    a = make_request("a", list(range(8)) + [50])
    assert admit(manager, a) == [0, 1, 2]
    compute_all(a)
    manager.free(a)
    pool = manager.block_pool
    assert free_ids(manager) == [3, 2, 1, 0]
    assert pool.get_cached_block(a.block_hashes[1]).block_id == 1
    other = make_request("o", list(range(900, 908)))  # takes 3 and 2
    assert admit(manager, other) == [3, 2]
    assert pool.get_cached_block(a.block_hashes[1]).block_id == 1
    more = make_request("m", list(range(700, 704)))  # takes 1: a's second block is evicted now
    assert admit(manager, more) == [1]
    assert pool.get_cached_block(a.block_hashes[1]) is None
    assert pool.get_cached_block(a.block_hashes[0]).block_id == 0
    again = make_request("again", list(range(8)) + [50])
    blocks, num_hit_tokens = manager.get_computed_blocks(again)
    assert [block.block_id for block in blocks] == [0] and num_hit_tokens == 4


def test_cache_salt_separates_prefixes() -> None:
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE)
    tokens = list(range(9))
    salted = make_request("salted", tokens, cache_salt="tenant-a")
    admit(manager, salted)
    compute_all(salted)
    assert manager.get_computed_blocks(make_request("plain", tokens))[1] == 0
    assert manager.get_computed_blocks(make_request("b", tokens, cache_salt="tenant-b"))[1] == 0
    blocks, num_hit_tokens = manager.get_computed_blocks(make_request("same", tokens, cache_salt="tenant-a"))
    assert [block.block_id for block in blocks] == [0, 1] and num_hit_tokens == 8


def test_full_prompt_hit_recomputes_the_last_block() -> None:
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE)
    a = make_request("a", list(range(8)))
    assert admit(manager, a) == [0, 1]
    compute_all(a)
    b = make_request("b", list(range(8)))
    blocks, num_hit_tokens = manager.get_computed_blocks(b)
    # At least one token must be computed for logits: the last full block is dropped.
    assert [block.block_id for block in blocks] == [0] and num_hit_tokens == 4
    assert admit(manager, b) == [2]
    assert manager.get_block_ids("b") == [0, 2]
    # Block 2 holds the same contents as block 1, but the key stays with block 1.
    assert manager.block_pool.blocks[2].block_hash is None
    assert manager.block_pool.get_cached_block(b.block_hashes[1]).block_id == 1


def test_decode_registers_blocks_as_they_fill_but_never_draft_tokens() -> None:
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE)
    request = make_request("r", [1, 2, 3, 4, 5, 6])
    assert admit(manager, request) == [0, 1]
    pool = manager.block_pool
    assert len(pool.cached_block_hash_to_block) == 1
    compute_all(request)
    request.append_output_token_ids(7)
    request.spec_token_ids = [8, 9]  # drafts fill block 1 and spill into block 2
    assert manager.allocate_slots(request, 3) == [2]
    assert pool.blocks[1].block_hash is None  # full only with a draft token: not registered
    request.num_computed_tokens = 7  # both drafts rejected
    request.spec_token_ids = []
    request.append_output_token_ids(10)
    assert manager.allocate_slots(request, 1) == []
    assert pool.blocks[1].block_hash == request.block_hashes[1]  # now full of real tokens


def verifying_three_drafts() -> tuple[KVCacheManager, Request]:
    """A request of 6 prompt tokens and one output, scheduled with drafts 8, 9, 10 (they fill
    block 1 and spill into block 2)."""
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE)
    request = make_request("r", [1, 2, 3, 4, 5, 6])
    assert admit(manager, request) == [0, 1]
    compute_all(request)
    request.append_output_token_ids(7)
    request.spec_token_ids = [8, 9, 10]
    assert manager.allocate_slots(request, 4) == [2]
    return manager, request


def test_blocks_filled_by_drafts_accepted_in_the_last_step_are_registered_when_freed() -> None:
    manager, request = verifying_three_drafts()
    pool = manager.block_pool
    assert pool.blocks[1].block_hash is None
    # The step accepted all three drafts and sampled a bonus token that hit max_tokens: the
    # request finishes with no later allocation to register block 1.
    request.num_computed_tokens = 10
    request.spec_token_ids = []
    for token_id in (8, 9, 10, 11):
        request.append_output_token_ids(token_id)
    manager.free(request)
    assert pool.get_cached_block(request.block_hashes[1]).block_id == 1
    assert len(request.block_hashes) == 2  # block 2 holds 3 tokens: not full, not registered
    follow_up = make_request("next", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13])
    assert manager.get_computed_blocks(follow_up)[1] == 8


def test_tokens_computed_after_a_stop_are_not_registered() -> None:
    manager, request = verifying_three_drafts()
    # All drafts accepted, but the first accepted one was a stop token: 8 tokens are the
    # request's, 10 were computed. Block 1 is full of the request's tokens; nothing further is.
    request.num_computed_tokens = 10
    request.spec_token_ids = []
    request.append_output_token_ids(8)
    manager.free(request)
    pool = manager.block_pool
    assert pool.get_cached_block(request.block_hashes[1]).block_id == 1
    assert sum(block.block_hash is not None for block in pool.blocks) == 2


def test_lookahead_slots_are_allocated() -> None:
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE)
    request = make_request("r", [1, 2, 3])
    assert manager.allocate_slots(request, 3, num_lookahead_tokens=6) == [0, 1, 2]


def test_allocation_counts_evictable_hit_blocks_as_not_free() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    a = make_request("a", list(range(8)))
    admit(manager, a)
    compute_all(a)
    manager.free(a)
    other = make_request("o", [900])
    assert admit(manager, other) == [2]
    assert free_ids(manager) == [3, 1, 0]
    # b hits block 0 (free, cached) and needs 3 more: 4 blocks out of 3 free ones.
    b = make_request("b", list(range(4)) + list(range(300, 309)))
    assert manager.get_computed_blocks(b)[1] == 4
    before = (free_ids(manager), ref_counts(manager), manager.prefix_cache_queries)
    assert admit(manager, b) is None
    assert (free_ids(manager), ref_counts(manager), manager.prefix_cache_queries) == before
    assert "b" not in manager.req_to_blocks
    # One token less fits: hit block 0 plus two new ones.
    c = make_request("c", list(range(4)) + list(range(300, 308)))
    assert admit(manager, c) == [3, 1]
    assert manager.get_block_ids("c") == [0, 3, 1]


def test_freeing_uncomputed_blocks_drops_their_keys() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    a = make_request("a", list(range(10)))
    assert admit(manager, a) == [0, 1, 2]
    a.num_computed_tokens = 4  # only the first block was computed when it was freed
    manager.free(a)
    pool = manager.block_pool
    assert pool.get_cached_block(a.block_hashes[0]).block_id == 0
    assert pool.get_cached_block(a.block_hashes[1]) is None
    assert manager.get_computed_blocks(make_request("b", list(range(10))))[1] == 4


def test_free_of_an_unknown_request_is_a_no_op_and_zero_tokens_is_refused() -> None:
    manager = KVCacheManager(num_blocks=2, block_size=BLOCK_SIZE)
    request = make_request("r", [1, 2])
    manager.free(request)
    assert manager.num_free_blocks == 2
    with pytest.raises(ValueError, match="num_new_tokens"):
        manager.allocate_slots(request, 0)


def test_reset_prefix_cache_and_disabled_caching() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    a = make_request("a", list(range(8)))
    admit(manager, a)
    compute_all(a)
    assert manager.reset_prefix_cache() is False
    manager.free(a)
    assert manager.reset_prefix_cache() is True
    assert manager.get_computed_blocks(make_request("b", list(range(8))))[1] == 0

    disabled = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE, enable_caching=False)
    a = make_request("a", list(range(8)))
    admit(disabled, a)
    compute_all(a)
    assert disabled.get_computed_blocks(make_request("b", list(range(8)))) == ([], 0)
    assert (disabled.prefix_cache_queries, disabled.prefix_cache_hits) == (0, 0)
