"""Triton KV store: one program per (token, kv head) writes its key and value vectors into
their slot of the paged cache (layout in kernels/kv_store.py), quantizing to fp8 e4m3 with a
per-vector scale when the cache is fp8. A negative slot means "do not store" (padding rows).

Reference: kernels.kv_store.store_kv_ref.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.kv_store import FP8_E4M3_MAX


@triton.jit
def _round_to_e4m3(x):
    """x (float32, |x| <= 448) rounded to the nearest e4m3 value, ties to even, in float32.
    Only for Triton's interpreter, whose float32 -> fp8 cast is wrong for values between grid
    points (it casts grid values exactly); GPUs convert natively."""
    mag = tl.abs(x)
    exponent = tl.maximum(tl.floor(tl.log2(tl.maximum(mag, 1e-30))), -6.0)  # subnormals share 2^-6's step
    step = tl.exp2(exponent - 3.0)
    units = mag / step
    low = tl.floor(units)
    frac = units - low
    odd = (low - 2.0 * tl.floor(low * 0.5)) == 1.0
    rounded = low + tl.where((frac > 0.5) | ((frac == 0.5) & odd), 1.0, 0.0)
    return tl.where(x < 0, -rounded * step, rounded * step)


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,  # key/value: [num_tokens, num_kv_heads, head_dim]
    stride_cb, stride_ch, stride_cs,  # caches: [num_blocks, num_kv_heads, block_size, head_dim]
    stride_sb, stride_sh,  # scales: [num_blocks, num_kv_heads, block_size]
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    FP8: tl.constexpr, FP8_MAX: tl.constexpr, ROUND_IN_FP32: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        dims = tl.arange(0, HEAD_DIM_P)
        in_dim = dims < HEAD_DIM
        k = tl.load(key_ptr + token * stride_kt + head * stride_kh + dims, mask=in_dim, other=0.0).to(tl.float32)
        v = tl.load(value_ptr + token * stride_vt + head * stride_vh + dims, mask=in_dim, other=0.0).to(tl.float32)
        dst = block * stride_cb + head * stride_ch + offset * stride_cs + dims
        if FP8:
            k_scale = tl.maximum(tl.max(tl.abs(k), axis=0) / FP8_MAX, 1e-12)
            v_scale = tl.maximum(tl.max(tl.abs(v), axis=0) / FP8_MAX, 1e-12)
            k = tl.clamp(k / k_scale, -FP8_MAX, FP8_MAX)
            v = tl.clamp(v / v_scale, -FP8_MAX, FP8_MAX)
            if ROUND_IN_FP32:
                k = _round_to_e4m3(k)
                v = _round_to_e4m3(v)
            scale_at = block * stride_sb + head * stride_sh + offset
            tl.store(k_scale_ptr + scale_at, k_scale)
            tl.store(v_scale_ptr + scale_at, v_scale)
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=in_dim)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=in_dim)


def store_kv_triton(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim], contiguous
    v_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim], contiguous
    slot_mapping: torch.Tensor,  # [num_tokens] int64 (negative: skip)
    k_scale: torch.Tensor | None = None,  # [num_blocks, num_kv_heads, block_size] fp32, fp8 caches only
    v_scale: torch.Tensor | None = None,  # [num_blocks, num_kv_heads, block_size] fp32, fp8 caches only
) -> None:
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        key, value = key.contiguous(), value.contiguous()
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8 and (k_scale is None or v_scale is None):
        raise ValueError("an fp8 KV cache needs k_scale and v_scale")
    if not fp8:
        k_scale = v_scale = k_cache  # unused by the kernel; any pointer will do
    assert k_scale is not None and v_scale is not None
    _store_kv_kernel[(num_tokens, num_kv_heads)](
        key, value, k_cache, v_cache, k_scale, v_scale, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_scale.stride(0) if fp8 else 0, k_scale.stride(1) if fp8 else 0,
        HEAD_DIM=head_dim, HEAD_DIM_P=triton.next_power_of_2(head_dim), BLOCK_SIZE=k_cache.shape[2],
        FP8=fp8, FP8_MAX=FP8_E4M3_MAX, ROUND_IN_FP32=not key.is_cuda,
    )
