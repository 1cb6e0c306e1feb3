"""Weight-only quantization formats and their torch references.

Three formats, each quantized once at load time and dequantized inside the matmul:

- int8, per output channel, symmetric: w[n, k] ~= q[n, k] * scale[n], q in [-127, 127].
- int4, group-wise along the input dimension, asymmetric: for group g of row n,
  w[n, k] ~= (q[n, k] - 8) * scale[n, g] + zero[n, g], q in [0, 15]. The zero point is a float
  ("tinygemm" convention, what torch's CPU/CUDA int4 kernels take), so GPTQ/AWQ's integer zero
  points map onto it exactly: zero = (8 - z) * scale.
  Packed two per byte along k: byte j of row n holds column 2j in its low nibble and column
  2j + 1 in its high nibble, qweight [N, K // 2] uint8.
- fp8 (e4m3), per output channel: w[n, k] ~= float(q[n, k]) * scale[n].

The references dequantize the whole weight and call F.linear: exact definitions, used by the
tests and wherever no faster kernel applies.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

INT4_GROUP_SIZES: tuple[int, ...] = (128, 64, 32)
FP8_E4M3_MAX = 448.0


def int4_group_size_for(input_size: int, preferred: int = 128) -> int:
    """The largest supported group size <= preferred that divides input_size (SmolLM2's 576
    is not a multiple of 128, so its k-dims use 64)."""
    for group_size in INT4_GROUP_SIZES:
        if group_size <= preferred and input_size % group_size == 0:
            return group_size
    raise ValueError(f"input size {input_size} is not a multiple of any int4 group size {INT4_GROUP_SIZES}")


# ---- int8 ---------------------------------------------------------------------------------------
def quantize_int8(
    weight: torch.Tensor,  # [N, K] float
) -> tuple[torch.Tensor, torch.Tensor]:  # (q [N, K] int8, scales [N] float32)
    w = weight.float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def dequantize_int8(
    q: torch.Tensor,  # [N, K] int8
    scales: torch.Tensor,  # [N]
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # [N, K]
    return (q.float() * scales.float()[:, None]).to(dtype)


def int8_linear_ref(
    x: torch.Tensor,  # [M, K]
    q: torch.Tensor,  # [N, K] int8
    scales: torch.Tensor,  # [N]
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [M, N] in x.dtype
    return F.linear(x, dequantize_int8(q, scales, x.dtype), bias)


# ---- int4 ---------------------------------------------------------------------------------------
def quantize_int4(
    weight: torch.Tensor,  # [N, K] float
    group_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # (qweight [N, K//2] uint8, scales [N, G], zeros [N, G])
    """Asymmetric min/max quantization per group: the group's range split into 15 steps.
    (A per-group clipping search that minimizes squared error was tried and dropped: on the
    embedded model it raised perplexity, the outliers it clips matter.)"""
    num_rows, input_size = weight.shape
    if input_size % group_size:
        raise ValueError(f"input size {input_size} is not a multiple of group_size {group_size}")
    groups = weight.float().reshape(num_rows, input_size // group_size, group_size)
    low = groups.amin(dim=-1, keepdim=True)
    scale = ((groups.amax(dim=-1, keepdim=True) - low) / 15.0).clamp(min=1e-8)  # [N, G, 1]
    q = torch.round((groups - low) / scale).clamp_(0, 15).to(torch.uint8)
    zeros = low + 8.0 * scale
    return pack_int4(q.reshape(num_rows, input_size)), scale.squeeze(-1), zeros.squeeze(-1)


def pack_int4(q: torch.Tensor) -> torch.Tensor:  # [N, K] values 0..15 -> [N, K // 2] uint8
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:  # [N, K // 2] uint8 -> [N, K] uint8 0..15
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)


def dequantize_int4(
    qweight: torch.Tensor,  # [N, K // 2] uint8
    scales: torch.Tensor,  # [N, G]
    zeros: torch.Tensor,  # [N, G]
    group_size: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # [N, K]
    q = unpack_int4(qweight).float()
    num_rows, input_size = q.shape
    groups = q.reshape(num_rows, input_size // group_size, group_size)
    w = (groups - 8.0) * scales.float()[..., None] + zeros.float()[..., None]
    return w.reshape(num_rows, input_size).to(dtype)


def int4_linear_ref(
    x: torch.Tensor,  # [M, K]
    qweight: torch.Tensor,  # [N, K // 2] uint8
    scales: torch.Tensor,  # [N, G]
    zeros: torch.Tensor,  # [N, G]
    group_size: int,
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [M, N] in x.dtype
    return F.linear(x, dequantize_int4(qweight, scales, zeros, group_size, x.dtype), bias)


# ---- fp8 ----------------------------------------------------------------------------------------
def quantize_fp8(
    weight: torch.Tensor,  # [N, K] float
) -> tuple[torch.Tensor, torch.Tensor]:  # (q [N, K] float8_e4m3fn, scales [N] float32)
    w = weight.float()
    scales = (w.abs().amax(dim=1) / FP8_E4M3_MAX).clamp(min=1e-12)
    q = (w / scales[:, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scales


def dequantize_fp8(
    q: torch.Tensor,  # [N, K] float8_e4m3fn
    scales: torch.Tensor,  # [N]
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # [N, K]
    return (q.float() * scales.float()[:, None]).to(dtype)


def fp8_linear_ref(
    x: torch.Tensor,  # [M, K]
    q: torch.Tensor,  # [N, K] float8_e4m3fn
    scales: torch.Tensor,  # [N]
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [M, N] in x.dtype
    return F.linear(x, dequantize_fp8(q, scales, x.dtype), bias)
