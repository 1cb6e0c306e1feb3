"""Triton weight-only matmuls: y = x @ dequant(W)^T with int8, int4 or fp8 weights, dequantized in
registers (formats in kernels/quant_ref.py). Built for the small M of decode and speculative
verification, where the cost is reading W once: each program owns a BLOCK_N slice of outputs and
a 1/SPLIT_K share of the input dimension, so even M = 1 launches enough programs to keep every
SM streaming weights; split partials are summed in float32 afterwards.

- int8 / fp8: the per-channel scale is applied once to the accumulator, after the dot.
- int4: the packed bytes hold columns 2j (low nibble) and 2j + 1 (high nibble); instead of
  interleaving the nibbles back, x is read as its even and odd columns and the tile is two dots.
  A K tile never straddles a group (BLOCK_K divides group_size), so its scale/zero is one vector.

References: kernels.quant_ref.int8_linear_ref / int4_linear_ref / fp8_linear_ref.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

INT8, INT4, FP8 = 0, 1, 2


@triton.jit
def _weight_only_matmul_kernel(
    x_ptr, w_ptr, scale_ptr, zero_ptr, out_ptr,
    M, N, K, K_PER_SPLIT,
    stride_xm, stride_wn, stride_sn, stride_om, stride_os,
    FORMAT: tl.constexpr, GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    compute_dtype = x_ptr.dtype.element_ty
    if DOT_FP32:
        compute_dtype = tl.float32
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    if FORMAT == 1:
        half = tl.arange(0, BLOCK_K // 2)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            even = k0 + 2 * half  # [BLOCK_K // 2] the columns held by low nibbles
            k_ok = even < k_hi
            x_even = tl.load(x_ptr + rows[:, None] * stride_xm + even[None, :],
                             mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            x_odd = tl.load(x_ptr + rows[:, None] * stride_xm + even[None, :] + 1,
                            mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            packed = tl.load(w_ptr + cols[None, :] * stride_wn + (k0 // 2 + half)[:, None],
                             mask=col_ok[None, :] & k_ok[:, None], other=0)  # [BLOCK_K // 2, BLOCK_N]
            group = k0 // GROUP_SIZE
            scale = tl.load(scale_ptr + cols * stride_sn + group, mask=col_ok, other=0.0).to(tl.float32)
            zero = tl.load(zero_ptr + cols * stride_sn + group, mask=col_ok, other=0.0).to(tl.float32)
            w_low = ((packed & 0xF).to(tl.float32) - 8.0) * scale[None, :] + zero[None, :]
            w_high = ((packed >> 4).to(tl.float32) - 8.0) * scale[None, :] + zero[None, :]
            acc += tl.dot(x_even.to(compute_dtype), w_low.to(compute_dtype))
            acc += tl.dot(x_odd.to(compute_dtype), w_high.to(compute_dtype))
    else:
        ks = tl.arange(0, BLOCK_K)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            k_idx = k0 + ks
            k_ok = k_idx < k_hi
            x = tl.load(x_ptr + rows[:, None] * stride_xm + k_idx[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptr + cols[None, :] * stride_wn + k_idx[:, None],
                        mask=col_ok[None, :] & k_ok[:, None])  # [BLOCK_K, BLOCK_N]
            # Through float32: exact for int8 and fp8, and the interpreter's direct int->bf16 is wrong.
            w = tl.where(col_ok[None, :] & k_ok[:, None], w.to(tl.float32), 0.0)
            acc += tl.dot(x.to(compute_dtype), w.to(compute_dtype))
        acc = acc * tl.load(scale_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + pid_k * stride_os + rows[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _launch(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
            bias: torch.Tensor | None, fmt: int, group_size: int, num_out: int, *,
            block_n: int | None = None, block_k: int | None = None, split_k: int | None = None) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(f"x must be [M, K], got shape {list(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    num_rows, input_size = x.shape
    block_m = 16 if num_rows <= 16 else 32 if num_rows <= 32 else 64
    block_n = block_n or 64
    block_k = block_k or (min(128, group_size) if fmt == INT4 else 128)
    if fmt == INT4 and group_size % block_k:
        raise ValueError(f"block_k {block_k} must divide group_size {group_size}")
    n_tiles = triton.cdiv(num_out, block_n) * triton.cdiv(num_rows, block_m)
    if split_k is None:
        # Enough programs to cover every SM about twice, but never a split shorter than 4 K tiles.
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
        split_k = max(1, min(triton.cdiv(2 * sms, n_tiles), input_size // (4 * block_k)))
    k_per_split = triton.cdiv(triton.cdiv(input_size, split_k), block_k) * block_k
    split_k = triton.cdiv(input_size, k_per_split)
    out_dtype = x.dtype if split_k == 1 else torch.float32
    out = torch.empty((split_k, num_rows, num_out), dtype=out_dtype, device=x.device)
    zero_arg = zeros if zeros is not None else scales
    grid = (triton.cdiv(num_out, block_n), triton.cdiv(num_rows, block_m), split_k)
    _weight_only_matmul_kernel[grid](
        x, w, scales, zero_arg, out,
        num_rows, num_out, input_size, k_per_split,
        x.stride(0), w.stride(0), scales.stride(0), out.stride(1), out.stride(0),
        FORMAT=fmt, GROUP_SIZE=group_size,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT_FP32=not x.is_cuda,
    )
    result = out[0] if split_k == 1 else out.sum(dim=0)
    if bias is not None:
        result = result + bias.to(result.dtype)
    return result.to(x.dtype)


def int8_linear_triton(
    x: torch.Tensor,  # [M, K]
    q: torch.Tensor,  # [N, K] int8
    scales: torch.Tensor,  # [N]
    bias: torch.Tensor | None = None,  # [N]
    **launch: int,
) -> torch.Tensor:  # [M, N] in x.dtype
    return _launch(x, q, scales, None, bias, INT8, 0, q.shape[0], **launch)


def int4_linear_triton(
    x: torch.Tensor,  # [M, K]
    qweight: torch.Tensor,  # [N, K // 2] uint8
    scales: torch.Tensor,  # [N, K // group_size]
    zeros: torch.Tensor,  # [N, K // group_size], same strides as scales
    group_size: int,
    bias: torch.Tensor | None = None,  # [N]
    **launch: int,
) -> torch.Tensor:  # [M, N] in x.dtype
    if scales.stride() != zeros.stride():
        zeros = zeros.contiguous()
        scales = scales.contiguous()
    return _launch(x, qweight, scales, zeros, bias, INT4, group_size, qweight.shape[0], **launch)


def fp8_linear_triton(
    x: torch.Tensor,  # [M, K]
    q: torch.Tensor,  # [N, K] float8_e4m3fn
    scales: torch.Tensor,  # [N]
    bias: torch.Tensor | None = None,  # [N]
    **launch: int,
) -> torch.Tensor:  # [M, N] in x.dtype
    return _launch(x, q, scales, None, bias, FP8, 0, q.shape[0], **launch)
