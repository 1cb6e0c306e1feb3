"""Paged attention layer: stores this step's keys/values, then attends over the cache."""

from __future__ import annotations

import torch
from torch import nn

import kernels
from engine.model.attention_metadata import AttentionMetadata


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 sliding_window: int | None = None) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads ({num_kv_heads})")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.sliding_window = sliding_window

    @staticmethod
    def store(
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor | kernels.FP8KVCache,  # as forward's
        meta: AttentionMetadata,
    ) -> None:
        """Writes keys/values into their slots without attending (forward does both)."""
        k_cache, v_cache, k_scale, v_scale = _unwrap(kv_cache)
        kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        # [2, num_blocks, num_kv_heads, block_size, head_dim], or an FP8KVCache holding that in
        # float8 plus its [2, num_blocks, num_kv_heads, block_size] scales
        kv_cache: torch.Tensor | kernels.FP8KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        self.store(k, v, kv_cache, meta)
        k_cache, v_cache, k_scale, v_scale = _unwrap(kv_cache)
        plan = meta.plans.get(self.sliding_window)
        if plan is None:
            plan = meta.plans[self.sliding_window] = kernels.plan_attention(
                meta.block_table, meta.query_start_loc_cpu, meta.seq_lens_cpu, k_cache.shape[2], self.sliding_window,
                num_heads=self.num_heads, num_kv_heads=self.num_kv_heads)
        return kernels.paged_attention(q, k_cache, v_cache, meta.block_table, meta.query_start_loc_cpu,
                                       meta.seq_lens_cpu, self.scale, self.sliding_window, plan=plan,
                                       k_scale=k_scale, v_scale=v_scale)


def _unwrap(kv_cache: torch.Tensor | kernels.FP8KVCache,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(k cache, v cache, k scales or None, v scales or None) of a layer's cache."""
    if isinstance(kv_cache, kernels.FP8KVCache):
        return kv_cache.data[0], kv_cache.data[1], kv_cache.scales[0], kv_cache.scales[1]
    return kv_cache[0], kv_cache[1], None, None
