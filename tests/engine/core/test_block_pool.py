from __future__ import annotations

import pytest

from engine.core.block_hash import make_block_hasher
from engine.core.block_pool import BlockPool, FreeBlockQueue, KVCacheBlock
from engine.request import Request
from engine.sampling_params import SamplingParams


def _free_ids(pool: BlockPool) -> list[int]:
    return [block.block_id for block in pool.free_block_queue]


def test_free_queue_popleft_append_and_remove_from_the_middle() -> None:
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    assert [b.block_id for b in queue] == [0, 1, 2, 3, 4] and len(queue) == 5
    queue.remove(blocks[2])
    queue.remove(blocks[0])
    queue.remove(blocks[4])
    assert [b.block_id for b in queue] == [1, 3] and len(queue) == 2
    queue.append(blocks[4])
    queue.append(blocks[0])
    assert queue.popleft() is blocks[1]
    assert [b.block_id for b in queue] == [3, 4, 0]
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(blocks[1])
    for _ in range(3):
        queue.popleft()
    with pytest.raises(ValueError, match="no free blocks"):
        queue.popleft()


def test_new_blocks_come_in_ascending_order_with_ref_one() -> None:
    pool = BlockPool(6)
    assert pool.num_free_blocks == 6 and pool.usage == 0.0
    first = pool.get_new_blocks(2)
    second = pool.get_new_blocks(3)
    assert [b.block_id for b in first] == [0, 1] and [b.block_id for b in second] == [2, 3, 4]
    assert all(b.ref_cnt == 1 for b in first + second)
    assert pool.num_free_blocks == 1 and pool.usage == pytest.approx(5 / 6)
    with pytest.raises(ValueError, match="only 1 are free"):
        pool.get_new_blocks(2)


def test_free_appends_in_the_given_order_and_touch_takes_back() -> None:
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(4)
    pool.touch([blocks[1]])  # shared by a second holder
    pool.free_blocks(reversed(blocks))
    assert blocks[1].ref_cnt == 1
    assert _free_ids(pool) == [3, 2, 0]
    pool.free_blocks([blocks[1]])
    assert _free_ids(pool) == [3, 2, 0, 1]
    pool.touch([blocks[2]])
    assert blocks[2].ref_cnt == 1 and _free_ids(pool) == [3, 0, 1]
    with pytest.raises(ValueError, match="freed more often"):
        pool.free_blocks([blocks[0]])


def _request(token_ids: list[int]) -> Request:
    return Request("r", token_ids, SamplingParams(), block_hasher=make_block_hasher(2, "m"))


def test_cached_block_survives_free_until_it_is_reused() -> None:
    pool = BlockPool(3)
    request = _request([1, 2, 3, 4, 5])
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(request, blocks, 0, 2)
    assert pool.get_cached_block(request.block_hashes[0]) is blocks[0]
    assert pool.get_cached_block(request.block_hashes[1]) is blocks[1]
    assert blocks[2].block_hash is None
    pool.free_blocks(reversed(blocks))
    assert _free_ids(pool) == [2, 1, 0]
    assert pool.get_cached_block(request.block_hashes[0]) is blocks[0]  # still findable while free
    reused = pool.get_new_blocks(2)  # pops 2 (no key) then 1 (evicted now)
    assert [b.block_id for b in reused] == [2, 1]
    assert pool.get_cached_block(request.block_hashes[1]) is None and blocks[1].block_hash is None
    assert pool.get_cached_block(request.block_hashes[0]) is blocks[0]


def test_one_key_never_points_at_two_blocks() -> None:
    pool = BlockPool(4)
    request = _request([1, 2, 3, 4])
    first, second = pool.get_new_blocks(2), pool.get_new_blocks(2)
    pool.cache_full_blocks(request, first, 0, 2)
    pool.cache_full_blocks(request, second, 0, 2)  # same contents computed twice
    assert [b.block_hash for b in second] == [None, None]
    assert pool.get_cached_block(request.block_hashes[1]) is first[1]
    with pytest.raises(ValueError, match="block hashes"):
        pool.cache_full_blocks(request, first, 0, 3)


def test_reset_prefix_cache_only_when_nothing_is_in_use() -> None:
    pool = BlockPool(2)
    request = _request([1, 2, 3, 4])
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(request, blocks, 0, 2)
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(request.block_hashes[0]) is blocks[0]
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(request.block_hashes[0]) is None
    assert all(b.block_hash is None for b in pool.blocks) and pool.cached_block_hash_to_block == {}


def test_disabled_caching_registers_and_finds_nothing() -> None:
    pool = BlockPool(2, enable_caching=False)
    request = _request([1, 2, 3, 4])
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(request, blocks, 0, 2)
    assert pool.get_cached_block(request.block_hashes[0]) is None
    assert pool.cached_block_hash_to_block == {}


def test_num_blocks_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)
