"""Compute kernels, dispatched on the device of their tensors. Imports nothing of ours.

- CPU: the compiled C++ kernels of kernels/cpu when they built (paged attention reading the
  KV blocks in place with an online softmax, KV store, fused add + RMSNorm, SwiGLU's
  activation), else the torch references.
- CUDA: the Triton kernels (kernels/triton_*.py), imported on first use so that a machine
  without triton still runs everything else.
- Other devices: the torch references.
- fp8 KV caches (float8_e4m3fn with per-vector scales) take Triton on CUDA and the references
  elsewhere.

The torch references (`*_ref`) are the specification every other implementation is tested
against, and the fallback.
"""

from __future__ import annotations

import torch

from kernels.cpu import CpuAttentionPlan, cpu_kernels
from kernels.kv_store import FP8KVCache, store_kv_ref
from kernels.paged_attention import AttentionPlan, paged_attention_ref
from kernels.paged_attention import plan_attention as plan_attention_ref
from kernels.rms_norm import rms_norm_ref
from kernels.rope import rope_ref
from kernels.silu_mul import silu_and_mul_ref
from kernels.triton_attention_plan import TritonAttentionPlan, plan_attention_triton


def store_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64, every entry a valid slot
    k_scale: torch.Tensor | None = None,  # [num_blocks, num_kv_heads, block_size] fp32, fp8 caches only
    v_scale: torch.Tensor | None = None,  # [num_blocks, num_kv_heads, block_size] fp32, fp8 caches only
) -> None:
    if key.is_cuda:
        from kernels.triton_kv_store import store_kv_triton

        store_kv_triton(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        return
    compiled = cpu_kernels() if key.device.type == "cpu" and k_scale is None else None
    if compiled is not None and compiled.supports_store(key, value, k_cache, v_cache):
        compiled.store_kv(key, value, k_cache, v_cache, slot_mapping)
    else:
        store_kv_ref(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def plan_attention(
    block_table: torch.Tensor,  # [num_reqs, max_blocks_per_req] int32
    query_start_loc: list[int],
    seq_lens: list[int],
    block_size: int,
    sliding_window: int | None = None,
    *,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
) -> AttentionPlan | CpuAttentionPlan | TritonAttentionPlan:
    """Shape-only work shared by every layer of a step; pass the result to `paged_attention`.
    num_heads / num_kv_heads: the query and kv heads (the Triton plan tiles by GQA group)."""
    if block_table.is_cuda and num_heads is not None and num_kv_heads is not None:
        return plan_attention_triton(query_start_loc, seq_lens, num_heads, num_kv_heads, sliding_window,
                                     block_table.device)
    compiled = cpu_kernels() if block_table.device.type == "cpu" else None
    if compiled is not None:
        return compiled.plan(query_start_loc, seq_lens, sliding_window)
    return plan_attention_ref(block_table, query_start_loc, seq_lens, block_size, sliding_window)


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    block_table: torch.Tensor,  # [num_reqs, max_blocks_per_req] int32
    query_start_loc: list[int],  # num_reqs + 1 offsets into query (host ints)
    seq_lens: list[int],  # num_reqs context lengths after this step (host ints)
    scale: float,
    sliding_window: int | None = None,
    plan: AttentionPlan | CpuAttentionPlan | TritonAttentionPlan | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, num_kv_heads, block_size] fp32, fp8 caches only
    v_scale: torch.Tensor | None = None,  # [num_blocks, num_kv_heads, block_size] fp32, fp8 caches only
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """See kernels.paged_attention for the contract. A plan made for the other path is ignored."""
    if query.is_cuda:
        from kernels.triton_paged_attention import paged_attention_triton

        if not isinstance(plan, TritonAttentionPlan):
            plan = plan_attention_triton(query_start_loc, seq_lens, query.shape[1], k_cache.shape[1],
                                         sliding_window, query.device)
        return paged_attention_triton(query, k_cache, v_cache, block_table, scale, plan, k_scale, v_scale)
    if k_scale is not None:  # fp8 cache: only the reference dequantizes
        return paged_attention_ref(query, k_cache, v_cache, block_table, query_start_loc, seq_lens, scale,
                                   sliding_window, plan if isinstance(plan, AttentionPlan) else None,
                                   k_scale, v_scale)
    compiled = cpu_kernels() if query.device.type == "cpu" else None
    if compiled is not None and compiled.supports_attention(query, k_cache, v_cache):
        return compiled.paged_attention(query, k_cache, v_cache, block_table, query_start_loc, seq_lens, scale,
                                        sliding_window, plan if isinstance(plan, CpuAttentionPlan) else None)
    return paged_attention_ref(query, k_cache, v_cache, block_table, query_start_loc, seq_lens, scale,
                               sliding_window, plan if isinstance(plan, AttentionPlan) else None)


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [num_tokens, hidden]
) -> tuple[torch.Tensor, torch.Tensor | None]:  # (normed, x + residual or None)
    """RMSNorm with the residual add fused (kernels/rms_norm.py for the semantics)."""
    if x.is_cuda:
        from kernels.triton_rms_norm import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual)
    compiled = cpu_kernels() if x.device.type == "cpu" else None
    if compiled is not None and compiled.supports_rows(x, weight.view(1, -1), *(() if residual is None else (residual,))):
        return compiled.rms_norm(x, weight, eps, residual)
    return rms_norm_ref(x, weight, eps, residual)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * d] -> [num_tokens, d]
    """silu(gate) * up (kernels/silu_mul.py for the semantics)."""
    compiled = cpu_kernels() if gate_up.device.type == "cpu" else None
    if compiled is not None and compiled.supports_rows(gate_up):
        return compiled.silu_mul(gate_up)
    return silu_and_mul_ref(gate_up)


def rope(
    x: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens] int64
    cos_sin_table: torch.Tensor,  # [max_positions, head_dim] float32
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Rotary embedding by table lookup (kernels/rope.py for the semantics)."""
    if x.is_cuda:
        from kernels.triton_rope import rope_triton

        return rope_triton(x, positions, cos_sin_table)
    return rope_ref(x, positions, cos_sin_table)


__all__ = ["AttentionPlan", "CpuAttentionPlan", "FP8KVCache", "TritonAttentionPlan", "paged_attention",
           "paged_attention_ref", "plan_attention", "plan_attention_ref", "rms_norm", "rms_norm_ref", "rope",
           "rope_ref", "silu_and_mul", "silu_and_mul_ref", "store_kv", "store_kv_ref"]
