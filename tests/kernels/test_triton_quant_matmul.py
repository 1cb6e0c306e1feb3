"""The Triton weight-only matmuls (int8, int4, fp8) against the torch references over ragged
shapes: M from 1 (decode) to past one row tile, N not a multiple of the tile, several K splits,
every int4 group size, bias, bf16 activations. Interpreter mode without a GPU."""

from __future__ import annotations

import pytest
import torch
from triton_harness import DEVICE

from kernels.quant_ref import (
    fp8_linear_ref,
    int4_linear_ref,
    int8_linear_ref,
    quantize_fp8,
    quantize_int4,
    quantize_int8,
)
from kernels.triton_quant_matmul import fp8_linear_triton, int4_linear_triton, int8_linear_triton

SHAPES = [(1, 48, 256), (5, 40, 128), (17, 64, 512), (16, 33, 384)]  # (M, N, K)


def _data(m: int, n: int, k: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=generator), torch.randn(m, k, generator=generator),
            torch.randn(n, generator=generator))


def _on(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(DEVICE) for t in tensors]


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("split_k", [1, None])
def test_int8(m: int, n: int, k: int, split_k: int | None) -> None:
    weight, x, bias = _data(m, n, k)
    q, scales = quantize_int8(weight)
    out = int8_linear_triton(*_on(x, q, scales, bias), split_k=split_k, block_k=64)
    torch.testing.assert_close(out.cpu(), int8_linear_ref(x, q, scales, bias), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4(m: int, n: int, k: int, group_size: int) -> None:
    weight, x, bias = _data(m, n, k)
    qweight, scales, zeros = quantize_int4(weight, group_size)
    out = int4_linear_triton(*_on(x, qweight, scales, zeros), group_size, bias.to(DEVICE), split_k=2)
    torch.testing.assert_close(out.cpu(), int4_linear_ref(x, qweight, scales, zeros, group_size, bias),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("m,n,k", SHAPES[:2])
def test_fp8(m: int, n: int, k: int) -> None:
    weight, x, _ = _data(m, n, k)
    q, scales = quantize_fp8(weight)
    out = fp8_linear_triton(*_on(x, q, scales))
    torch.testing.assert_close(out.cpu(), fp8_linear_ref(x, q, scales), atol=1e-4, rtol=1e-4)


def test_bf16_activations() -> None:
    weight, x, bias = _data(3, 40, 256)
    xb = x.bfloat16()
    qweight, scales, zeros = quantize_int4(weight, 64)
    out = int4_linear_triton(*_on(xb, qweight, scales, zeros), 64, bias.to(DEVICE))
    assert out.dtype == torch.bfloat16
    expected = int4_linear_ref(xb.float(), qweight, scales, zeros, 64, bias)
    # bf16 operands (8-bit mantissa) and a bf16 result: about 2^-8 of the output's scale.
    torch.testing.assert_close(out.cpu().float(), expected, atol=0.05 * expected.abs().max().item(), rtol=0.02)


def test_block_k_must_divide_the_group() -> None:
    weight, x, _ = _data(1, 16, 128)
    qweight, scales, zeros = quantize_int4(weight, 32)
    with pytest.raises(ValueError, match="group_size"):
        int4_linear_triton(*_on(x, qweight, scales, zeros), 32, block_k=64)
