"""Triton paged attention: one kernel for decode, prefill over a cached prefix and speculative
verification (the contract of kernels.paged_attention.paged_attention_ref).

Work decomposition. A *tile* is up to BLOCK_Q consecutive query tokens of one request; one
program computes a tile for one kv head, so its rows are (token, query head of that kv head's
GQA group) pairs, BLOCK_M = BLOCK_Q * group rows in all. Every key/value vector a program loads
serves all the query heads that read it (GQA without repeating keys), and a decode row's
`group` heads fill the rows a tensor-core dot needs (16) instead of padding one token to 16.

Keys are visited BLOCK_N at a time in position order; each key's page comes from the block
table, so BLOCK_N is independent of the cache's block size. Scores use an online softmax (running
max and sum in float32). Causality: row token t of request i sits at position
seq_len - query_len + t and sees keys at positions <= its own (and, with a sliding window, more
recent than position - window).

Split-K (flash-decoding): when there are too few tiles to fill the GPU (decode of a small batch
over a long context), the key range of each tile is cut into `num_splits` chunks computed by
separate programs; each writes its unnormalized output with its running max and sum, and a
second kernel merges the chunks. Prefill steps have enough tiles and use one split.

FP8 caches: keys/values are float8_e4m3fn with a float32 scale per (slot, kv head)
(kernels/kv_store.py); a key's scale multiplies its score column, a value's scale multiplies the
probability column before the second dot, so no dequantized copy is materialized.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_attention_plan import TritonAttentionPlan, plan_attention_triton

__all__ = ["TritonAttentionPlan", "paged_attention_triton", "plan_attention_triton"]

@triton.jit
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, block_table_ptr,
    query_start_ptr, seq_lens_ptr, tile_req_ptr, tile_q_start_ptr,
    out_ptr, part_out_ptr, part_ml_ptr,
    sm_scale, sliding_window, num_tokens, num_heads,
    stride_qt, stride_qh,  # query: [num_tokens, num_heads, head_dim]
    stride_ot, stride_oh,  # out: [num_tokens, num_heads, head_dim]
    stride_cb, stride_ch, stride_cs,  # caches: [num_blocks, num_kv_heads, block_size, head_dim]
    stride_sb, stride_sh,  # scales: [num_blocks, num_kv_heads, block_size]
    stride_bt,  # block table: [num_reqs, max_blocks]
    GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, FP8: tl.constexpr, USE_WINDOW: tl.constexpr, DOT_FP32: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    req = tl.load(tile_req_ptr + tile)
    q_first = tl.load(tile_q_start_ptr + tile)
    q_start = tl.load(query_start_ptr + req)
    query_len = tl.load(query_start_ptr + req + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + req)

    rows = tl.arange(0, BLOCK_M)
    t = q_first + rows // GROUP  # token index within the request
    head = kv_head * GROUP + rows % GROUP
    row_valid = (rows // GROUP < BLOCK_Q) & (t < query_len)
    pos = seq_len - query_len + t  # [BLOCK_M] position of each row's token
    token = q_start + t
    dims = tl.arange(0, HEAD_DIM_P)
    in_dim = dims < HEAD_DIM
    q = tl.load(q_ptr + token[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh + dims[None, :],
                mask=row_valid[:, None] & in_dim[None, :], other=0.0)
    compute_dtype = q.dtype
    if DOT_FP32:
        q = q.to(tl.float32)

    # Key range of this tile: up to its last token's position; with a window, from its first
    # token's oldest visible key. Then this split's share of it, in whole BLOCK_N steps.
    last_t = tl.minimum(q_first + BLOCK_Q, query_len) - 1
    kv_end = seq_len - query_len + last_t + 1
    kv_begin = 0
    if USE_WINDOW:
        kv_begin = tl.maximum(seq_len - query_len + q_first - sliding_window + 1, 0)
    chunk = tl.cdiv(tl.cdiv(kv_end - kv_begin, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = kv_begin + split * chunk
    hi = tl.minimum(lo + chunk, kv_end)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], tl.float32)
    cols = tl.arange(0, BLOCK_N)
    for n0 in range(lo, hi, BLOCK_N):
        key_pos = n0 + cols
        key_valid = key_pos < hi
        block = tl.load(block_table_ptr + req * stride_bt + key_pos // BLOCK_SIZE, mask=key_valid, other=0)
        slot_at = block.to(tl.int64) * stride_cb + kv_head * stride_ch + (key_pos % BLOCK_SIZE) * stride_cs
        kv_mask = key_valid[:, None] & in_dim[None, :]
        k = tl.load(k_cache_ptr + slot_at[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + slot_at[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        if FP8:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        if DOT_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        else:
            k = k.to(compute_dtype)
            v = v.to(compute_dtype)
        scores = tl.dot(q, tl.trans(k)) * sm_scale  # [BLOCK_M, BLOCK_N] fp32
        if FP8:
            scale_at = block.to(tl.int64) * stride_sb + kv_head * stride_sh + key_pos % BLOCK_SIZE
            scores = scores * tl.load(k_scale_ptr + scale_at, mask=key_valid, other=0.0)[None, :]
        visible = key_valid[None, :] & (key_pos[None, :] <= pos[:, None])
        if USE_WINDOW:
            visible = visible & (key_pos[None, :] > pos[:, None] - sliding_window)
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        # Rows that have seen no visible key yet keep m = -inf; shift them by 0 instead (no NaN).
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if FP8:
            p = p * tl.load(v_scale_ptr + scale_at, mask=key_valid, other=0.0)[None, :]
        if DOT_FP32:
            acc = acc * alpha[:, None] + tl.dot(p, v)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(compute_dtype), v)
        m_i = m_new

    if NUM_SPLITS == 1:
        result = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + token[:, None].to(tl.int64) * stride_ot + head[:, None] * stride_oh + dims[None, :],
                 result.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & in_dim[None, :])
    else:
        # Partials: [NUM_SPLITS, num_tokens, num_heads, HEAD_DIM_P] and [NUM_SPLITS, num_tokens, num_heads, 2].
        row_at = (split * num_tokens + token.to(tl.int64)) * num_heads + head
        tl.store(part_out_ptr + row_at[:, None] * HEAD_DIM_P + dims[None, :], acc, mask=row_valid[:, None])
        tl.store(part_ml_ptr + row_at * 2, m_i, mask=row_valid)
        tl.store(part_ml_ptr + row_at * 2 + 1, l_i, mask=row_valid)


@triton.jit
def _merge_splits_kernel(
    part_out_ptr, part_ml_ptr, out_ptr, num_rows, num_heads, stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr,
):
    """One program per (token, head) row: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s."""
    row = tl.program_id(0).to(tl.int64)
    splits = tl.arange(0, NUM_SPLITS)
    dims = tl.arange(0, HEAD_DIM_P)
    m = tl.load(part_ml_ptr + (splits * num_rows + row) * 2)  # [NUM_SPLITS]
    l = tl.load(part_ml_ptr + (splits * num_rows + row) * 2 + 1)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    weight = tl.exp(m - m_max)  # splits that saw no key have m = -inf: weight 0
    acc = tl.load(part_out_ptr + (splits[:, None] * num_rows + row) * HEAD_DIM_P + dims[None, :])
    numer = tl.sum(acc * weight[:, None], axis=0)
    denom = tl.sum(l * weight, axis=0)
    result = numer / tl.where(denom > 0, denom, 1.0)
    token = row // num_heads
    head = row % num_heads
    tl.store(out_ptr + token * stride_ot + head * stride_oh + dims, result.to(out_ptr.dtype.element_ty),
             mask=dims < HEAD_DIM)


def paged_attention_triton(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    block_table: torch.Tensor,  # [num_reqs, max_blocks_per_req] int32
    scale: float,
    plan: TritonAttentionPlan,
    k_scale: torch.Tensor | None = None,  # [num_blocks, num_kv_heads, block_size] fp32, fp8 caches only
    v_scale: torch.Tensor | None = None,  # [num_blocks, num_kv_heads, block_size] fp32, fp8 caches only
    *,
    block_n: int = 64,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    num_tiles = plan.tile_req.numel()
    if num_tokens == 0 or num_tiles == 0:
        return out
    if query.stride(-1) != 1:
        query = query.contiguous()
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must share one layout with contiguous head vectors")
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8 and (k_scale is None or v_scale is None):
        raise ValueError("an fp8 KV cache needs k_scale and v_scale")
    head_dim_p = triton.next_power_of_2(head_dim)
    num_splits = plan.num_splits
    part_out = part_ml = out  # unused pointers when not splitting
    if num_splits > 1:
        part_out = torch.empty((num_splits, num_tokens, num_heads, head_dim_p), dtype=torch.float32,
                               device=query.device)
        part_ml = torch.empty((num_splits, num_tokens, num_heads, 2), dtype=torch.float32, device=query.device)
    scales_k = k_scale if fp8 else k_cache
    scales_v = v_scale if fp8 else v_cache
    block_m = plan.block_q * group
    block_m = max(16, triton.next_power_of_2(block_m))
    _paged_attention_kernel[(num_tiles, num_kv_heads, num_splits)](
        query, k_cache, v_cache, scales_k, scales_v, block_table,
        plan.query_start_loc, plan.seq_lens, plan.tile_req, plan.tile_q_start,
        out, part_out, part_ml,
        scale, plan.sliding_window or 0, num_tokens, num_heads,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        scales_k.stride(0) if fp8 else 0, scales_k.stride(1) if fp8 else 0,
        block_table.stride(0),
        GROUP=group, BLOCK_Q=plan.block_q, BLOCK_M=block_m, BLOCK_N=block_n,
        HEAD_DIM=head_dim, HEAD_DIM_P=head_dim_p, BLOCK_SIZE=block_size,
        NUM_SPLITS=num_splits, FP8=fp8, USE_WINDOW=plan.sliding_window is not None,
        DOT_FP32=query.device.type != "cuda",  # the interpreter's bf16 dot is wrong; fp32 is exact
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_tokens * num_heads,)](
            part_out, part_ml, out, num_tokens * num_heads, num_heads, out.stride(0), out.stride(1),
            NUM_SPLITS=num_splits, HEAD_DIM=head_dim, HEAD_DIM_P=head_dim_p,
        )
    return out
