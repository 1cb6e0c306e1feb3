"""Varlen attention over the paged KV cache (torch reference).

One call covers a whole step: every request contributes `query_len` new tokens whose keys and
values are already stored in the cache (store_kv runs first), and attends causally to its
`seq_len` cached tokens, the last `query_len` of which are its own new tokens. Prefill, chunked
prefill over a cached prefix, decode and speculative verification are all this one case.

The reference is also the CPU path, so it is written for speed there:
- everything that depends only on the batch's shape (which rows decode, which blocks they read,
  which key slots are masked) is an `AttentionPlan`, built once per step and reused by every
  layer (`plan_attention`);
- many single-token queries (decode) go through one segmented computation over exactly their
  blocks, no padding: scores per (block, kv head) as one batched matmul with the GQA query heads
  grouped under their kv head (keys are never repeated), a softmax whose max and sum are
  reduced per request, then one batched matmul with the values;
- a few decode rows, and every multi-token query, run one SDPA call each (bottom-right causal
  mask when needed), which costs fewer operations per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Below this many decode rows, one SDPA call per row beats the segmented path's fixed op count.
_MIN_SEGMENTED_DECODE_ROWS = 4


@dataclass
class DecodePlan:
    """Decode rows of one step, flattened to the blocks they read."""

    token_index: torch.Tensor  # [num_rows] int64: the rows' query tokens
    owner: torch.Tensor  # [num_flat_blocks] int64: which decode row reads each block
    block_ids: torch.Tensor  # [num_flat_blocks] int64
    invalid: torch.Tensor  # [num_flat_blocks, block_size] bool: slots past the end / before the window
    num_rows: int


@dataclass
class AttentionPlan:
    block_table: torch.Tensor  # [num_reqs, max_blocks_per_req] int32
    query_start_loc: list[int]  # num_reqs + 1
    seq_lens: list[int]  # num_reqs
    block_size: int
    sliding_window: int | None
    decode: DecodePlan | None  # the segmented decode rows, if any
    sdpa_rows: list[int]  # rows computed one SDPA call each
    sdpa_block_ids: list[torch.Tensor]  # per sdpa row: [num_blocks_read] int64


def plan_attention(
    block_table: torch.Tensor,  # [num_reqs, max_blocks_per_req] int32
    query_start_loc: list[int],
    seq_lens: list[int],
    block_size: int,
    sliding_window: int | None = None,
) -> AttentionPlan:
    num_reqs = len(seq_lens)
    device = block_table.device
    decode_rows = [i for i in range(num_reqs) if query_start_loc[i + 1] - query_start_loc[i] == 1]
    decode = None
    if len(decode_rows) >= _MIN_SEGMENTED_DECODE_ROWS:
        decode = _plan_decode(block_table, query_start_loc, seq_lens, decode_rows, block_size, sliding_window)
        segmented = set(decode_rows)
        sdpa_rows = [i for i in range(num_reqs) if i not in segmented]
    else:
        sdpa_rows = list(range(num_reqs))
    sdpa_block_ids = []
    for i in sdpa_rows:
        first = _first_key(seq_lens[i], query_start_loc[i + 1] - query_start_loc[i], sliding_window) // block_size
        last = (seq_lens[i] + block_size - 1) // block_size
        sdpa_block_ids.append(block_table[i, first:last].to(device=device, dtype=torch.int64))
    return AttentionPlan(block_table, query_start_loc, seq_lens, block_size, sliding_window, decode, sdpa_rows,
                         sdpa_block_ids)


def paged_attention_ref(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    block_table: torch.Tensor,  # [num_reqs, max_blocks_per_req] int32
    query_start_loc: list[int],  # num_reqs + 1 offsets into query (host ints)
    seq_lens: list[int],  # num_reqs context lengths after this step (host ints)
    scale: float,
    sliding_window: int | None = None,
    plan: AttentionPlan | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, num_kv_heads, block_size] fp32, fp8 caches only
    v_scale: torch.Tensor | None = None,  # [num_blocks, num_kv_heads, block_size] fp32, fp8 caches only
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    block_size = k_cache.shape[2]
    if plan is None:
        plan = plan_attention(block_table, query_start_loc, seq_lens, block_size, sliding_window)
    out = torch.empty_like(query)
    if plan.decode is not None:
        _decode(query, k_cache, v_cache, plan.decode, scale, out, k_scale, v_scale)
    num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[3]
    for i, block_ids in zip(plan.sdpa_rows, plan.sdpa_block_ids):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        query_len, seq_len = end - start, seq_lens[i]
        first_key = _first_key(seq_len, query_len, sliding_window) // block_size * block_size
        num_keys = seq_len - first_key
        # [blocks, kv_heads, block_size, head_dim] -> [kv_heads, keys, head_dim]
        k = gather_kv(k_cache, k_scale, block_ids, query.dtype)
        v = gather_kv(v_cache, v_scale, block_ids, query.dtype)
        k = k.transpose(0, 1).reshape(num_kv_heads, -1, head_dim)[:, :num_keys]
        v = v.transpose(0, 1).reshape(num_kv_heads, -1, head_dim)[:, :num_keys]
        o = F.scaled_dot_product_attention(
            query[start:end].transpose(0, 1).unsqueeze(0),  # [1, num_heads, query_len, head_dim]
            k.unsqueeze(0),
            v.unsqueeze(0),
            attn_mask=_causal_mask(query_len, seq_len, first_key, sliding_window, query.device),
            scale=scale,
            enable_gqa=True,
        )
        out[start:end] = o[0].transpose(0, 1)
    return out


def gather_blocks(
    cache: torch.Tensor,  # [num_blocks, kv_heads, block_size, head_dim]
    block_ids: torch.Tensor,  # [n] int64
) -> torch.Tensor:  # [n, kv_heads, block_size, head_dim]
    # One contiguous row per block: the copy is a plain row gather.
    return cache.view(cache.shape[0], -1).index_select(0, block_ids).view(-1, *cache.shape[1:])


def gather_kv(
    cache: torch.Tensor,  # [num_blocks, kv_heads, block_size, head_dim]
    scales: torch.Tensor | None,  # [num_blocks, kv_heads, block_size] fp32 for fp8 caches, else None
    block_ids: torch.Tensor,  # [n] int64
    dtype: torch.dtype,
) -> torch.Tensor:  # [n, kv_heads, block_size, head_dim] in dtype
    """Gathered blocks in the compute dtype; fp8 blocks are dequantized with their scales."""
    blocks = gather_blocks(cache, block_ids)
    if scales is None:
        return blocks.to(dtype)
    block_scales = scales.view(scales.shape[0], -1).index_select(0, block_ids).view(-1, *scales.shape[1:])
    return (blocks.float() * block_scales.unsqueeze(-1)).to(dtype)


def _first_key(seq_len: int, query_len: int, sliding_window: int | None) -> int:
    """The oldest position any of the row's queries may attend to."""
    if sliding_window is None:
        return 0
    return max(0, seq_len - query_len - sliding_window + 1)


def _causal_mask(query_len: int, seq_len: int, first_key: int, sliding_window: int | None,
                 device: torch.device) -> torch.Tensor | None:  # [query_len, seq_len - first_key] bool
    """Bottom-right aligned causal mask over keys first_key..seq_len-1: query i sits at
    position seq_len - query_len + i."""
    if query_len == 1 and (sliding_window is None or seq_len - first_key <= sliding_window):
        return None
    q_pos = torch.arange(seq_len - query_len, seq_len, device=device).unsqueeze(1)
    k_pos = torch.arange(first_key, seq_len, device=device).unsqueeze(0)
    mask = k_pos <= q_pos
    if sliding_window is not None:
        mask &= k_pos > q_pos - sliding_window
    return mask


def _plan_decode(block_table, query_start_loc, seq_lens, rows, block_size, sliding_window) -> DecodePlan:
    device = block_table.device
    lens = torch.tensor([seq_lens[i] for i in rows])
    first_pos = torch.zeros_like(lens)
    if sliding_window is not None:
        first_pos = (lens - sliding_window).clamp(min=0)
    # Each row's blocks from the first its window reaches to the last, flattened.
    first_block = first_pos // block_size
    counts = (lens + block_size - 1) // block_size - first_block
    owner = torch.repeat_interleave(torch.arange(len(rows)), counts)  # [num_flat_blocks]
    starts = torch.cumsum(counts, 0) - counts
    index_in_row = torch.arange(len(owner)) - starts[owner] + first_block[owner]
    table_rows = block_table.cpu().index_select(0, torch.tensor(rows))
    block_ids = table_rows[owner, index_in_row].long()
    key_pos = index_in_row.unsqueeze(1) * block_size + torch.arange(block_size)  # [num_flat_blocks, bs]
    invalid = (key_pos >= lens[owner].unsqueeze(1)) | (key_pos < first_pos[owner].unsqueeze(1))
    return DecodePlan(
        token_index=torch.tensor([query_start_loc[i] for i in rows], device=device),
        owner=owner.to(device),
        block_ids=block_ids.to(device),
        invalid=invalid.to(device),
        num_rows=len(rows),
    )


def _decode(query, k_cache, v_cache, plan: DecodePlan, scale: float, out: torch.Tensor,
            k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> None:
    """Single-token queries over exactly their own blocks (see the module docstring)."""
    num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[3]
    group = query.shape[1] // num_kv_heads
    n, owner = plan.num_rows, plan.owner
    k = gather_kv(k_cache, k_scale, plan.block_ids, query.dtype)  # [nfb, kv_heads, block_size, head_dim]
    v = gather_kv(v_cache, v_scale, plan.block_ids, query.dtype)
    q = query.index_select(0, plan.token_index).view(n, num_kv_heads, group, head_dim)
    q = q.index_select(0, owner)  # [nfb, kv_heads, group, head_dim]
    scores = torch.matmul(q, k.transpose(-1, -2)).float()  # [nfb, kv_heads, group, block_size]
    scores.mul_(scale).masked_fill_(plan.invalid[:, None, None, :], float("-inf"))
    # Softmax per row across its blocks: max and sum reduced by owner (fp32 throughout).
    block_max = scores.amax(-1)  # [nfb, kv_heads, group]
    row_max = torch.full((n, num_kv_heads, group), float("-inf"), device=query.device)
    row_max.scatter_reduce_(0, owner[:, None, None].expand_as(block_max), block_max, "amax")
    probs = torch.exp(scores - row_max.index_select(0, owner).unsqueeze(-1))
    denom = torch.zeros_like(row_max).index_add_(0, owner, probs.sum(-1))
    partial = torch.matmul(probs.to(v.dtype), v)  # [nfb, kv_heads, group, head_dim]
    numer = torch.zeros((n, num_kv_heads, group, head_dim), dtype=torch.float32, device=query.device)
    numer.index_add_(0, owner, partial.float())
    result = (numer / denom.unsqueeze(-1)).view(n, num_kv_heads * group, head_dim)
    out.index_copy_(0, plan.token_index, result.to(out.dtype))
