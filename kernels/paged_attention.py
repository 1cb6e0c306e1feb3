"""Varlen attention over the paged KV cache (torch reference).

One call covers a whole step: every request contributes `query_len` new tokens whose keys and
values are already stored in the cache (store_kv runs first), and attends causally to its
`seq_len` cached tokens, the last `query_len` of which are its own new tokens. Prefill, chunked
prefill over a cached prefix, decode and speculative verification are all this one case.

The reference is also the CPU path, so it is written for speed there:
- requests with one query token (decode) go through one segmented computation over exactly their
  blocks, no padding: scores per (block, kv head) as one batched matmul, a softmax whose max and
  sum are reduced per request, then one batched matmul with the values. GQA query heads are
  grouped under their kv head, never by repeating keys.
- requests with several query tokens run one SDPA call each with a bottom-right causal mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def paged_attention_ref(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    block_table: torch.Tensor,  # [num_reqs, max_blocks_per_req] int32
    query_start_loc: list[int],  # num_reqs + 1 offsets into query (host ints)
    seq_lens: list[int],  # num_reqs context lengths after this step (host ints)
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    num_reqs = len(seq_lens)
    out = torch.empty_like(query)
    decode_rows = [i for i in range(num_reqs) if query_start_loc[i + 1] - query_start_loc[i] == 1]
    if decode_rows:
        _decode(query, k_cache, v_cache, block_table, query_start_loc, seq_lens, decode_rows, scale,
                sliding_window, out)
    if len(decode_rows) == num_reqs:
        return out
    block_size = k_cache.shape[2]
    num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[3]
    is_decode = set(decode_rows)
    for i in range(num_reqs):
        if i in is_decode:
            continue
        start, end = query_start_loc[i], query_start_loc[i + 1]
        query_len, seq_len = end - start, seq_lens[i]
        num_blocks = (seq_len + block_size - 1) // block_size
        blocks = block_table[i, :num_blocks].long()
        # [num_blocks, kv_heads, block_size, head_dim] -> [kv_heads, seq_len, head_dim]
        k = gather_blocks(k_cache, blocks).transpose(0, 1).reshape(num_kv_heads, -1, head_dim)[:, :seq_len]
        v = gather_blocks(v_cache, blocks).transpose(0, 1).reshape(num_kv_heads, -1, head_dim)[:, :seq_len]
        o = F.scaled_dot_product_attention(
            query[start:end].transpose(0, 1).unsqueeze(0),  # [1, num_heads, query_len, head_dim]
            k.unsqueeze(0).to(query.dtype),
            v.unsqueeze(0).to(query.dtype),
            attn_mask=_causal_mask(query_len, seq_len, sliding_window, query.device),
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


def _causal_mask(query_len: int, seq_len: int, sliding_window: int | None,
                 device: torch.device) -> torch.Tensor | None:  # [query_len, seq_len] bool
    """Bottom-right aligned causal mask: query i sits at position seq_len - query_len + i."""
    if query_len == 1 and (sliding_window is None or seq_len <= sliding_window):
        return None
    q_pos = torch.arange(seq_len - query_len, seq_len, device=device).unsqueeze(1)
    k_pos = torch.arange(seq_len, device=device).unsqueeze(0)
    mask = k_pos <= q_pos
    if sliding_window is not None:
        mask &= k_pos > q_pos - sliding_window
    return mask


def _decode(query, k_cache, v_cache, block_table, query_start_loc, seq_lens, rows, scale, sliding_window,
            out) -> None:
    """Single-token queries over exactly their own blocks (see the module docstring)."""
    num_kv_heads, block_size, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    group = query.shape[1] // num_kv_heads
    device = query.device
    lens = [seq_lens[i] for i in rows]
    first_pos = [0] * len(rows)
    if sliding_window is not None:
        first_pos = [max(0, n - sliding_window) for n in lens]
    # Each row's blocks from the first one its window reaches to the last, flattened.
    first_block = [p // block_size for p in first_pos]
    last_block = [(n + block_size - 1) // block_size for n in lens]
    counts = [b - a for a, b in zip(first_block, last_block)]
    table_rows = torch.tensor(rows, device=device)
    host_first = torch.tensor(first_block)
    host_counts = torch.tensor(counts)
    owner_host = torch.repeat_interleave(torch.arange(len(rows)), host_counts)  # [num_flat_blocks]
    flat_index_host = torch.arange(len(owner_host)) - torch.repeat_interleave(
        torch.cumsum(host_counts, 0) - host_counts, host_counts) + host_first[owner_host]  # block index in row
    owner = owner_host.to(device)
    flat_index = flat_index_host.to(device)
    block_ids = block_table.index_select(0, table_rows)[owner, flat_index].long()  # [num_flat_blocks]

    k = gather_blocks(k_cache, block_ids).to(query.dtype)  # [nfb, kv_heads, block_size, head_dim]
    v = gather_blocks(v_cache, block_ids).to(query.dtype)
    token_index = torch.tensor([query_start_loc[i] for i in rows], device=device)
    q = query.index_select(0, token_index).view(len(rows), num_kv_heads, group, head_dim)
    q = q.index_select(0, owner)  # [nfb, kv_heads, group, head_dim]
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [nfb, kv_heads, group, block_size]

    # Mask key slots past the end of the context (and before the window's start).
    key_pos = flat_index.unsqueeze(1) * block_size + torch.arange(block_size, device=device)  # [nfb, bs]
    len_t = torch.tensor(lens, device=device)[owner].unsqueeze(1)
    invalid = key_pos >= len_t
    if sliding_window is not None:
        invalid |= key_pos < torch.tensor(first_pos, device=device)[owner].unsqueeze(1)
    scores.masked_fill_(invalid[:, None, None, :], float("-inf"))

    # Softmax per row across its blocks: max and sum reduced by owner.
    block_max = scores.amax(-1)  # [nfb, kv_heads, group]
    row_max = torch.full((len(rows), num_kv_heads, group), float("-inf"), dtype=scores.dtype, device=device)
    row_max.scatter_reduce_(0, owner[:, None, None].expand_as(block_max), block_max, "amax")
    probs = torch.exp(scores - row_max.index_select(0, owner).unsqueeze(-1))
    denom = torch.zeros_like(row_max).index_add_(0, owner, probs.sum(-1))
    partial = torch.matmul(probs, v)  # [nfb, kv_heads, group, head_dim]
    numer = torch.zeros((len(rows), num_kv_heads, group, head_dim), dtype=scores.dtype, device=device)
    numer.index_add_(0, owner, partial)
    result = (numer / denom.unsqueeze(-1)).view(len(rows), num_kv_heads * group, head_dim)
    out.index_copy_(0, token_index, result.to(out.dtype))
