"""The torch reference for paged attention (and KV store) against a naive dense attention written
loop by loop: ragged batches, block boundaries, GQA ratios, prefix plus new tokens, windows."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import paged_attention_ref, store_kv_ref


def dense_attention(
    q: torch.Tensor,  # [query_len, num_heads, head_dim]
    k: torch.Tensor,  # [seq_len, num_kv_heads, head_dim]
    v: torch.Tensor,  # [seq_len, num_kv_heads, head_dim]
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:  # [query_len, num_heads, head_dim] float64
    """Query t sits at position seq_len - query_len + t and sees keys j <= that position
    (and j > position - sliding_window); query head h reads kv head h // (heads per kv head)."""
    query_len, num_heads, _ = q.shape
    seq_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float64)
    for t in range(query_len):
        position = seq_len - query_len + t
        visible = [j for j in range(seq_len)
                   if j <= position and (sliding_window is None or j > position - sliding_window)]
        for h in range(num_heads):
            keys = k[visible, h // group].double()  # [num_visible, head_dim]
            scores = keys @ q[t, h].double() * scale
            weights = torch.softmax(scores, dim=0)
            out[t, h] = weights @ v[visible, h // group].double()
    return out


def run_case(query_lens: list[int], prefix_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
             block_size: int, sliding_window: int | None, seed: int) -> None:
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    seq_lens = [p + q for p, q in zip(prefix_lens, query_lens)]
    blocks_needed = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = sum(blocks_needed) + 3
    free = list(range(num_blocks))
    rng.shuffle(free)
    # Garbage everywhere: an unmasked read of a slot nobody wrote shows up as a large error.
    k_cache = 100 * torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=generator)
    v_cache = 100 * torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=generator)
    max_blocks = max(blocks_needed)
    block_table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    queries, expected = [], []
    for i, (query_len, seq_len) in enumerate(zip(query_lens, seq_lens)):
        blocks = [free.pop() for _ in range(blocks_needed[i])]
        # Unused table entries point at random blocks (the runner leaves stale ids there too).
        padding = [rng.randrange(num_blocks) for _ in range(max_blocks - len(blocks))]
        block_table[i] = torch.tensor(blocks + padding, dtype=torch.int32)
        k = torch.randn(seq_len, num_kv_heads, head_dim, generator=generator)
        v = torch.randn(seq_len, num_kv_heads, head_dim, generator=generator)
        for pos in range(seq_len):  # written slot by slot, independently of store_kv
            k_cache[blocks[pos // block_size], :, pos % block_size] = k[pos]
            v_cache[blocks[pos // block_size], :, pos % block_size] = v[pos]
        q = torch.randn(query_len, num_heads, head_dim, generator=generator)
        queries.append(q)
        expected.append(dense_attention(q, k, v, head_dim ** -0.5, sliding_window))
    query_start_loc = [0]
    for query_len in query_lens:
        query_start_loc.append(query_start_loc[-1] + query_len)
    out = paged_attention_ref(torch.cat(queries), k_cache, v_cache, block_table, query_start_loc, seq_lens,
                              head_dim ** -0.5, sliding_window)
    assert out.shape == (sum(query_lens), num_heads, head_dim) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), torch.cat(expected), atol=1e-5, rtol=1e-5)


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 20)), min_size=1, max_size=5),
    kv_heads_and_group=st.sampled_from([(1, 1), (2, 1), (1, 4), (2, 2), (2, 3), (4, 2)]),
    head_dim=st.sampled_from([8, 16]),
    block_size=st.sampled_from([1, 2, 4, 8, 16]),
    sliding_window=st.one_of(st.none(), st.integers(1, 12)),
    seed=st.integers(0, 2**16),
)
def test_matches_dense_attention(requests, kv_heads_and_group, head_dim, block_size, sliding_window, seed) -> None:
    num_kv_heads, group = kv_heads_and_group
    run_case([q for q, _ in requests], [p for _, p in requests], num_kv_heads * group, num_kv_heads, head_dim,
             block_size, sliding_window, seed)


@pytest.mark.parametrize("sliding_window", [None, 1, 3, 8])
def test_batched_decode(sliding_window) -> None:
    """Several single-token queries take the batched decode path; lengths straddle block ends."""
    run_case([1] * 6, [0, 3, 4, 7, 15, 30], num_heads=4, num_kv_heads=2, head_dim=16, block_size=4,
             sliding_window=sliding_window, seed=1)


@pytest.mark.parametrize("sliding_window", [None, 5])
def test_decodes_mixed_with_prefill_and_chunk(sliding_window) -> None:
    run_case([1, 12, 1, 5, 1], [9, 0, 0, 11, 16], num_heads=6, num_kv_heads=2, head_dim=8, block_size=8,
             sliding_window=sliding_window, seed=2)


def test_single_decode_and_exact_block_multiple() -> None:
    run_case([1], [15], num_heads=2, num_kv_heads=2, head_dim=8, block_size=4, sliding_window=None, seed=3)
    run_case([8], [8], num_heads=2, num_kv_heads=1, head_dim=8, block_size=4, sliding_window=None, seed=4)


def test_store_kv_writes_each_slot() -> None:
    generator = torch.Generator().manual_seed(5)
    num_blocks, block_size, num_kv_heads, head_dim = 6, 4, 2, 8
    k_cache = torch.zeros(num_blocks, num_kv_heads, block_size, head_dim)
    v_cache = torch.zeros(num_blocks, num_kv_heads, block_size, head_dim)
    slots = torch.tensor([0, 5, 23, 9, 10])
    key = torch.randn(len(slots), num_kv_heads, head_dim, generator=generator)
    value = torch.randn(len(slots), num_kv_heads, head_dim, generator=generator)
    store_kv_ref(key, value, k_cache, v_cache, slots)
    for i, slot in enumerate(slots.tolist()):
        assert torch.equal(k_cache[slot // block_size, :, slot % block_size], key[i])
        assert torch.equal(v_cache[slot // block_size, :, slot % block_size], value[i])
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[slots] = True
    assert (k_cache.transpose(1, 2).reshape(-1, num_kv_heads, head_dim)[~written] == 0).all()
    # Casting on store: a bf16 cache receives rounded fp32 values.
    k_half = torch.zeros(num_blocks, num_kv_heads, block_size, head_dim, dtype=torch.bfloat16)
    v_half = torch.zeros_like(k_half)
    store_kv_ref(key, value, k_half, v_half, slots)
    assert torch.equal(k_half[0, :, 0], key[0].to(torch.bfloat16))


def test_segmented_decode_with_sliding_window() -> None:
    # Enough decode rows for the segmented path; windows that start mid-block and past block 0.
    run_case([1] * 6, [2, 5, 9, 14, 21, 33], num_heads=6, num_kv_heads=2, head_dim=8, block_size=4,
             sliding_window=6, seed=11)
    # The same rows through the one-SDPA-per-row path (too few rows to segment).
    run_case([1] * 2, [14, 33], num_heads=6, num_kv_heads=2, head_dim=8, block_size=4, sliding_window=6, seed=12)
