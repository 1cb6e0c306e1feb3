"""Store new keys and values into the paged KV cache (torch reference).

Cache layout, per layer and per K/V: [num_blocks, num_kv_heads, block_size, head_dim] ("head-major
blocks"): one head's keys of one block are a contiguous [block_size, head_dim] matrix, so the
attention can multiply gathered blocks without re-laying them out. Slot s lives in block
s // block_size at offset s % block_size.
"""

from __future__ import annotations

import torch


def store_kv_ref(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64, every entry a valid slot
) -> None:
    block_size = k_cache.shape[2]
    block_ids = slot_mapping // block_size
    offsets = slot_mapping % block_size
    # Advanced indices around a slice: the indexed view is [num_tokens, num_kv_heads, head_dim].
    k_cache[block_ids, :, offsets] = key.to(k_cache.dtype)
    v_cache[block_ids, :, offsets] = value.to(v_cache.dtype)
