"""The Triton paged attention against the torch reference (itself checked against a dense float64
attention in test_paged_attention_ref.py): decode and GQA ratios, block boundaries, split-K
decodes, prefill over a cached prefix, speculative-verification rows, sliding windows, odd
head dims, fp8 caches with their scales, bf16. Runs in Triton's interpreter without a GPU."""

from __future__ import annotations

import math
import random

import pytest
import torch
from triton_harness import DEVICE

from kernels.paged_attention import paged_attention_ref
from kernels.triton_attention_plan import plan_attention_triton
from kernels.triton_paged_attention import paged_attention_triton


def run_case(query_lens: list[int], prefix_lens: list[int], *, num_heads: int, num_kv_heads: int, head_dim: int,
             block_size: int, sliding_window: int | None = None, fp8: bool = False,
             dtype: torch.dtype = torch.float32, force_splits: bool = False, seed: int = 0) -> int:
    """Returns the number of key splits the plan chose (so tests can insist on > 1)."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    seq_lens = [p + q for p, q in zip(prefix_lens, query_lens)]
    blocks_needed = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = sum(blocks_needed) + 3
    free = list(range(num_blocks))
    rng.shuffle(free)
    # Large garbage in every slot no request owns: an unmasked read of one shows as a large error.
    shape = (num_blocks, num_kv_heads, block_size, head_dim)
    k_cache = 100 * torch.randn(shape, generator=generator)
    v_cache = 100 * torch.randn(shape, generator=generator)
    max_blocks = max(blocks_needed)
    block_table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    for i, needed in enumerate(blocks_needed):
        blocks = [free.pop() for _ in range(needed)]
        padding = [rng.randrange(num_blocks) for _ in range(max_blocks - needed)]  # stale ids, like the runner's
        block_table[i] = torch.tensor(blocks + padding, dtype=torch.int32)
        for pos in range(seq_lens[i]):
            k_cache[blocks[pos // block_size], :, pos % block_size] = torch.randn(num_kv_heads, head_dim,
                                                                                  generator=generator)
            v_cache[blocks[pos // block_size], :, pos % block_size] = torch.randn(num_kv_heads, head_dim,
                                                                                  generator=generator)
    k_scale = v_scale = None
    if fp8:
        k_scale = torch.rand(shape[:3], generator=generator) + 0.5
        v_scale = torch.rand(shape[:3], generator=generator) + 0.5
        k_cache, v_cache = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
    else:
        k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    query_start_loc = [0]
    for query_len in query_lens:
        query_start_loc.append(query_start_loc[-1] + query_len)
    query = torch.randn(query_start_loc[-1], num_heads, head_dim, generator=generator).to(dtype)
    scale = head_dim ** -0.5
    expected = paged_attention_ref(query, k_cache, v_cache, block_table, query_start_loc, seq_lens, scale,
                                   sliding_window, k_scale=k_scale, v_scale=v_scale)
    plan = plan_attention_triton(query_start_loc, seq_lens, num_heads, num_kv_heads, sliding_window, DEVICE,
                                 num_programs_target=1024 if force_splits else None,
                                 min_keys_per_split=8 if force_splits else 256)
    move = (lambda t: t.to(DEVICE)) if DEVICE.type != "cpu" else (lambda t: t)
    out = paged_attention_triton(move(query), move(k_cache), move(v_cache), move(block_table), scale, plan,
                                 None if k_scale is None else move(k_scale), None if v_scale is None else move(v_scale),
                                 block_n=16)
    assert out.shape == query.shape and out.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.cpu().float(), expected.float(), atol=tolerance, rtol=tolerance)
    return plan.num_splits


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (4, 2), (6, 2), (8, 1), (9, 3)])
def test_decode_gqa_ratios(num_heads: int, num_kv_heads: int) -> None:
    run_case([1, 1, 1], [4, 15, 33], num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=16, block_size=4)


@pytest.mark.parametrize("seq_len", [1, 7, 8, 9, 16, 17])
def test_block_boundaries(seq_len: int) -> None:
    # Context ends just before, on and after a block (8) and a key tile (16) boundary.
    run_case([1, 3], [seq_len - 1, seq_len], num_heads=4, num_kv_heads=2, head_dim=16, block_size=8)


def test_split_k_decode_matches() -> None:
    splits = run_case([1, 1], [150, 70], num_heads=4, num_kv_heads=2, head_dim=16, block_size=8, force_splits=True)
    assert splits > 1


def test_split_k_with_an_empty_split() -> None:
    # The short request's range gives some splits no key at all: they must weigh zero.
    splits = run_case([1, 1], [200, 2], num_heads=2, num_kv_heads=1, head_dim=16, block_size=4, force_splits=True)
    assert splits > 1


def test_prefill_over_cached_prefix_and_fresh_prompts() -> None:
    run_case([37, 5, 20], [0, 29, 16], num_heads=4, num_kv_heads=2, head_dim=16, block_size=4)


def test_speculative_verification_rows_among_decodes() -> None:
    # A few query tokens (verifying drafts) on long prefixes, next to plain decodes.
    run_case([5, 1, 3, 1], [60, 12, 41, 7], num_heads=8, num_kv_heads=2, head_dim=32, block_size=16)


@pytest.mark.parametrize("force_splits", [False, True])
def test_sliding_window(force_splits: bool) -> None:
    run_case([1, 6, 1], [40, 30, 3], num_heads=4, num_kv_heads=2, head_dim=16, block_size=4, sliding_window=9,
             force_splits=force_splits)


def test_head_dim_not_a_power_of_two() -> None:
    run_case([2, 1], [13, 20], num_heads=3, num_kv_heads=1, head_dim=24, block_size=4)


@pytest.mark.parametrize("force_splits", [False, True])
def test_fp8_cache_with_scales(force_splits: bool) -> None:
    run_case([1, 4, 1], [90, 10, 33], num_heads=4, num_kv_heads=2, head_dim=16, block_size=8, fp8=True,
             force_splits=force_splits)


def test_bfloat16() -> None:
    run_case([1, 7], [20, 9], num_heads=4, num_kv_heads=2, head_dim=16, block_size=4, dtype=torch.bfloat16)


def test_plan_tiles_cover_every_query_token_once() -> None:
    query_start_loc, seq_lens = [0, 1, 40, 43], [10, 39, 50]
    plan = plan_attention_triton(query_start_loc, seq_lens, 8, 2, None, torch.device("cpu"))
    covered = []
    for req, start in zip(plan.tile_req.tolist(), plan.tile_q_start.tolist()):
        query_len = query_start_loc[req + 1] - query_start_loc[req]
        covered += [query_start_loc[req] + t for t in range(start, min(start + plan.block_q, query_len))]
    assert sorted(covered) == list(range(43))
    assert plan.seq_lens.tolist() == seq_lens and plan.query_start_loc.tolist() == query_start_loc


def test_plan_splits_only_long_small_batches() -> None:
    many = plan_attention_triton(list(range(65)), [5000] * 64, 8, 8, None, torch.device("cpu"),
                                 num_programs_target=264)
    assert many.num_splits == 1  # 64 requests x 8 kv heads already fill the device
    long_single = plan_attention_triton([0, 1], [8192], 64, 8, None, torch.device("cpu"), num_programs_target=264)
    assert long_single.num_splits == 32
    short_single = plan_attention_triton([0, 1], [300], 64, 8, None, torch.device("cpu"), num_programs_target=264)
    assert short_single.num_splits == 1
