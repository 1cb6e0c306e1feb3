"""Varlen attention over the paged KV cache (torch reference).

One call covers a whole step: every request contributes `query_len` new tokens whose keys and
values are already stored in the cache (store_kv runs first), and attends causally to its
`seq_len` cached tokens, the last `query_len` of which are its own new tokens. Prefill, chunked
prefill over a cached prefix, decode and speculative verification are all this one case.

The reference is also the CPU path, so it is written for speed there: requests with a single
query token (decode) are batched into one masked SDPA call; the rest run one SDPA each.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def paged_attention_ref(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_table: torch.Tensor,  # [num_reqs, max_blocks_per_req] int32
    query_start_loc: list[int],  # num_reqs + 1 offsets into query (host ints)
    seq_lens: list[int],  # num_reqs context lengths after this step (host ints)
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    num_reqs = len(seq_lens)
    block_size = k_cache.shape[1]
    out = torch.empty_like(query)
    decode_rows = [i for i in range(num_reqs) if query_start_loc[i + 1] - query_start_loc[i] == 1]
    if len(decode_rows) > 1:
        _decode_batch(query, k_cache, v_cache, block_table, query_start_loc, seq_lens, decode_rows,
                      scale, sliding_window, out)
        done = set(decode_rows)
    else:
        done = set()
    for i in range(num_reqs):
        if i in done:
            continue
        start, end = query_start_loc[i], query_start_loc[i + 1]
        query_len, seq_len = end - start, seq_lens[i]
        num_blocks = (seq_len + block_size - 1) // block_size
        blocks = block_table[i, :num_blocks].long()
        k = k_cache.index_select(0, blocks).flatten(0, 1)[:seq_len]  # [seq_len, num_kv_heads, head_dim]
        v = v_cache.index_select(0, blocks).flatten(0, 1)[:seq_len]
        mask = _causal_mask(query_len, seq_len, sliding_window, query.device)
        o = F.scaled_dot_product_attention(
            query[start:end].transpose(0, 1).unsqueeze(0),  # [1, num_heads, query_len, head_dim]
            k.transpose(0, 1).unsqueeze(0).to(query.dtype),
            v.transpose(0, 1).unsqueeze(0).to(query.dtype),
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,
        )
        out[start:end] = o[0].transpose(0, 1)
    return out


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


def _decode_batch(query, k_cache, v_cache, block_table, query_start_loc, seq_lens, rows,
                  scale, sliding_window, out) -> None:
    block_size = k_cache.shape[1]
    lens = [seq_lens[i] for i in rows]
    max_len = max(lens)
    max_blocks = (max_len + block_size - 1) // block_size
    device = query.device
    row_index = torch.tensor(rows, device=device)
    token_index = torch.tensor([query_start_loc[i] for i in rows], device=device)
    blocks = block_table.index_select(0, row_index)[:, :max_blocks].long()  # [n, max_blocks]
    # [n, max_blocks * block_size, num_kv_heads, head_dim] -> [n, num_kv_heads, keys, head_dim]
    k = k_cache[blocks].flatten(1, 2).transpose(1, 2).to(query.dtype)
    v = v_cache[blocks].flatten(1, 2).transpose(1, 2).to(query.dtype)
    key_pos = torch.arange(max_blocks * block_size, device=device)
    len_t = torch.tensor(lens, device=device).unsqueeze(1)
    mask = key_pos.unsqueeze(0) < len_t  # [n, keys]
    if sliding_window is not None:
        mask &= key_pos.unsqueeze(0) > (len_t - 1 - sliding_window)
    q = query.index_select(0, token_index).unsqueeze(2)  # [n, num_heads, 1, head_dim]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :], scale=scale, enable_gqa=True)
    out.index_copy_(0, token_index, o.squeeze(2))
