"""Store new keys and values into the paged KV cache (torch reference).

Cache layout, per layer and per K/V: [num_blocks, num_kv_heads, block_size, head_dim] ("head-major
blocks"): one head's keys of one block are a contiguous [block_size, head_dim] matrix, so the
attention can multiply gathered blocks without re-laying them out. Slot s lives in block
s // block_size at offset s % block_size.

FP8 option: a float8_e4m3fn cache comes with scale tensors [num_blocks, num_kv_heads, block_size]
(float32), one per stored (token, kv head) vector: scale = amax(|x|) / 448, the cache holds
x / scale, and readers multiply back. A scale per vector keeps e4m3's full range for every head
without calibration (keys of some models run into the hundreds, values can be tiny), for 4
bytes per 64-256 stored ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_E4M3_MAX = 448.0
# Keeps an all-zero vector's scale positive, so dequantizing it gives zeros, not NaN.
_MIN_SCALE = 1e-12


@dataclass(frozen=True)
class FP8KVCache:
    """One layer's fp8 KV cache and its scales (index 0: keys, 1: values), where a plain cache
    is one [2, ...] tensor."""

    data: torch.Tensor  # [2, num_blocks, num_kv_heads, block_size, head_dim] float8_e4m3fn
    scales: torch.Tensor  # [2, num_blocks, num_kv_heads, block_size] float32


def fp8_quantize_vectors(
    x: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
) -> tuple[torch.Tensor, torch.Tensor]:  # ([num_tokens, num_kv_heads, head_dim] fp8, [num_tokens, num_kv_heads] fp32)
    x = x.float()
    scale = (x.abs().amax(dim=-1) / FP8_E4M3_MAX).clamp(min=_MIN_SCALE)
    q = (x / scale.unsqueeze(-1)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def store_kv_ref(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64, every entry a valid slot
    k_scale: torch.Tensor | None = None,  # [num_blocks, num_kv_heads, block_size] fp32, fp8 caches only
    v_scale: torch.Tensor | None = None,  # [num_blocks, num_kv_heads, block_size] fp32, fp8 caches only
) -> None:
    block_size = k_cache.shape[2]
    block_ids = slot_mapping // block_size
    offsets = slot_mapping % block_size
    if k_cache.dtype == torch.float8_e4m3fn:
        if k_scale is None or v_scale is None:
            raise ValueError("an fp8 KV cache needs k_scale and v_scale")
        key, key_scale = fp8_quantize_vectors(key)
        value, value_scale = fp8_quantize_vectors(value)
        # The indexed view of a scale tensor is [num_tokens, num_kv_heads].
        k_scale[block_ids, :, offsets] = key_scale
        v_scale[block_ids, :, offsets] = value_scale
    # Advanced indices around a slice: the indexed view is [num_tokens, num_kv_heads, head_dim].
    k_cache[block_ids, :, offsets] = key.to(k_cache.dtype)
    v_cache[block_ids, :, offsets] = value.to(v_cache.dtype)
