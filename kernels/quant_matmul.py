"""Weight-only quantized matmuls, dispatched on the device (formats in kernels/quant_ref.py).

- CUDA: the Triton kernels (kernels/triton_quant_matmul.py).
- CPU: torch's own packed-weight kernels, which vectorize with AVX-512/AMX:
  int8 -> aten._weight_int8pack_mm (the int8 weight as is, scales in the activation dtype);
  int4 -> aten._weight_int4pack_mm_for_cpu over aten._convert_weight_to_int4pack_for_cpu's
  layout, with scales and zeros interleaved as [K // group_size, N, 2].
  Both run in bfloat16: measured on this machine (torch 2.13, 2 threads), their float32
  activation path is 10-50x slower than bf16, so a float32 model's activations are rounded to
  bf16 around these calls (the output is returned in the input dtype).
  fp8 has no CPU kernel: the reference (dequantize, then F.linear).

A layer prepares its weight once for its device (`prepare_*`) and calls the matching `*_linear`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.quant_ref import fp8_linear_ref, int4_linear_ref, int8_linear_ref, unpack_int4

_CPU_COMPUTE_DTYPE = torch.bfloat16


# ---- int8 ---------------------------------------------------------------------------------------
@dataclass
class Int8Weight:
    q: torch.Tensor  # [N, K] int8
    scales: torch.Tensor  # [N]: float32 on CUDA, the CPU compute dtype on CPU


def prepare_int8(
    q: torch.Tensor,  # [N, K] int8
    scales: torch.Tensor,  # [N] float32
) -> Int8Weight:
    if q.device.type == "cpu":
        return Int8Weight(q.contiguous(), scales.to(_CPU_COMPUTE_DTYPE))
    return Int8Weight(q.contiguous(), scales.float().contiguous())


def int8_linear(
    x: torch.Tensor,  # [M, K]
    weight: Int8Weight,
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [M, N] in x.dtype
    if x.is_cuda:
        from kernels.triton_quant_matmul import int8_linear_triton

        return int8_linear_triton(x, weight.q, weight.scales, bias)
    if x.device.type == "cpu":
        y = torch.ops.aten._weight_int8pack_mm(x.to(_CPU_COMPUTE_DTYPE), weight.q, weight.scales)
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y.to(x.dtype)
    return int8_linear_ref(x, weight.q, weight.scales, bias)


# ---- int4 ---------------------------------------------------------------------------------------
@dataclass
class Int4Weight:
    """CUDA/other: the canonical packed layout. CPU: torch's tinygemm layout (packed is
    [N, K // 2] uint8 in its own nibble order, scale_zeros [K // group_size, N, 2])."""

    packed: torch.Tensor
    scales: torch.Tensor | None  # [N, G] (not on CPU)
    zeros: torch.Tensor | None  # [N, G] (not on CPU)
    scale_zeros: torch.Tensor | None  # [G, N, 2] (CPU only)
    group_size: int
    num_out: int


def prepare_int4(
    qweight: torch.Tensor,  # [N, K // 2] uint8, canonical nibble order
    scales: torch.Tensor,  # [N, G]
    zeros: torch.Tensor,  # [N, G]
    group_size: int,
) -> Int4Weight:
    num_out = qweight.shape[0]
    if qweight.device.type == "cpu":
        q = unpack_int4(qweight).to(torch.int32)  # [N, K] values 0..15
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        scale_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(_CPU_COMPUTE_DTYPE)
        return Int4Weight(packed, None, None, scale_zeros, group_size, num_out)
    return Int4Weight(qweight.contiguous(), scales.float().contiguous(), zeros.float().contiguous(), None,
                      group_size, num_out)


def int4_linear(
    x: torch.Tensor,  # [M, K]
    weight: Int4Weight,
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [M, N] in x.dtype
    if x.device.type == "cpu":
        assert weight.scale_zeros is not None
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(_CPU_COMPUTE_DTYPE).contiguous(), weight.packed,
                                                       weight.group_size, weight.scale_zeros)
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y.to(x.dtype)
    assert weight.scales is not None and weight.zeros is not None
    if x.is_cuda:
        from kernels.triton_quant_matmul import int4_linear_triton

        return int4_linear_triton(x, weight.packed, weight.scales, weight.zeros, weight.group_size, bias)
    return int4_linear_ref(x, weight.packed, weight.scales, weight.zeros, weight.group_size, bias)


# ---- fp8 ----------------------------------------------------------------------------------------
@dataclass
class Fp8Weight:
    q: torch.Tensor  # [N, K] float8_e4m3fn
    scales: torch.Tensor  # [N] float32


def prepare_fp8(
    q: torch.Tensor,  # [N, K] float8_e4m3fn
    scales: torch.Tensor,  # [N]
) -> Fp8Weight:
    return Fp8Weight(q.contiguous(), scales.float().contiguous())


def fp8_linear(
    x: torch.Tensor,  # [M, K]
    weight: Fp8Weight,
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [M, N] in x.dtype
    if x.is_cuda:
        from kernels.triton_quant_matmul import fp8_linear_triton

        return fp8_linear_triton(x, weight.q, weight.scales, bias)
    return fp8_linear_ref(x, weight.q, weight.scales, bias)
