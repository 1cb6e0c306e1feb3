"""The CPU dispatch of kernels/quant_matmul.py (torch's packed int8/int4 kernels, bf16 compute)
and the oneDNN-prepacked float32 and bf16 linears, against the references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.onednn_linear import onednn_available, onednn_bf16_available, onednn_linear, prepack
from kernels.quant_matmul import fp8_linear, int4_linear, int8_linear, prepare_fp8, prepare_int4, prepare_int8
from kernels.quant_ref import (
    fp8_linear_ref,
    int4_linear_ref,
    int8_linear_ref,
    quantize_fp8,
    quantize_int4,
    quantize_int8,
)


def _data(m: int, n: int = 96, k: int = 256, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=generator), torch.randn(m, k, generator=generator), torch.randn(n, generator=generator)


def _close_in_bf16(out: torch.Tensor, expected: torch.Tensor) -> None:
    # bf16 activations and weights' dequantized values: about 2^-8 relative per product.
    scale = expected.abs().max().item()
    torch.testing.assert_close(out.float(), expected.float(), atol=0.02 * scale, rtol=0.02)


@pytest.mark.parametrize("m", [1, 7, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_cpu(m: int, dtype: torch.dtype) -> None:
    weight, x, bias = _data(m)
    q, scales = quantize_int8(weight)
    out = int8_linear(x.to(dtype), prepare_int8(q, scales), bias)
    assert out.dtype == dtype and out.shape == (m, 96)
    _close_in_bf16(out, int8_linear_ref(x, q, scales, bias))


@pytest.mark.parametrize("m", [1, 7, 33])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_cpu(m: int, group_size: int) -> None:
    weight, x, bias = _data(m)
    qweight, scales, zeros = quantize_int4(weight, group_size)
    out = int4_linear(x.bfloat16(), prepare_int4(qweight, scales, zeros, group_size), bias)
    assert out.dtype == torch.bfloat16
    _close_in_bf16(out, int4_linear_ref(x, qweight, scales, zeros, group_size, bias))


def test_int4_cpu_float32_input_comes_back_float32() -> None:
    weight, x, _ = _data(3)
    qweight, scales, zeros = quantize_int4(weight, 64)
    out = int4_linear(x, prepare_int4(qweight, scales, zeros, 64))
    assert out.dtype == torch.float32
    _close_in_bf16(out, int4_linear_ref(x, qweight, scales, zeros, 64))


def test_fp8_cpu_is_the_reference() -> None:
    weight, x, bias = _data(4)
    q, scales = quantize_fp8(weight)
    torch.testing.assert_close(fp8_linear(x, prepare_fp8(q, scales), bias), fp8_linear_ref(x, q, scales, bias))


@pytest.mark.skipif(not onednn_bf16_available(), reason="needs oneDNN and a CPU with native bf16")
@pytest.mark.parametrize("m", [1, 5, 64])
def test_onednn_prepacked_bf16_equals_f_linear(m: int) -> None:
    weight, x, bias = _data(m)
    weight, x, bias = weight.bfloat16(), x.bfloat16(), bias.bfloat16()
    packed = prepack(weight)
    # Same products, same bf16 rounding of the fp32 accumulator: equal to F.linear's result
    # up to the summation order inside the kernel.
    torch.testing.assert_close(onednn_linear(x, packed, bias), F.linear(x, weight, bias), atol=2e-2, rtol=1e-2)


@pytest.mark.skipif(not onednn_available(), reason="needs oneDNN")
@pytest.mark.parametrize("m", [1, 2, 5, 9, 16, 33, 300])
def test_onednn_prepacked_float32_is_float32_exact(m: int) -> None:
    """Strict float32: each output is within float32 summation error of the float64 product
    (a kernel computing in bf16 or tf32 would miss by about 1e-3 relative), at the row counts of
    decoding, verification and prefill."""
    weight, x, bias = _data(m, n=200, k=576, seed=m)
    out = onednn_linear(x, prepack(weight), bias)
    assert out.dtype == torch.float32 and out.shape == (m, 200)
    exact = F.linear(x.double(), weight.double(), bias.double())
    # |error| <= k * eps * sum|x_i w_i| for any summation order; in practice far below.
    bound = 576 * 2.0**-24 * (x.double().abs() @ weight.double().abs().t() + bias.double().abs())
    assert ((out.double() - exact).abs() <= bound).all()
    # Against the output's scale: float32 misses by ~1e-6 here (0.4-0.9e-6 on an AVX2 EPYC, where
    # 300 rows summed to 1.1e-4 absolute on outputs up to 118), bf16 by ~3e-3, tf32 by ~5e-4.
    assert (out.double() - exact).abs().max().item() < 1e-5 * exact.abs().max().item()


@pytest.mark.skipif(not onednn_available(), reason="needs oneDNN")
def test_onednn_prepacked_rows_do_not_depend_on_the_batch() -> None:
    """A row's output does not change with the rows beside it beyond float32 rounding (the
    greedy-identity tests of speculative decoding rely on this at the token level)."""
    weight, x, _ = _data(16, n=300, k=576, seed=3)
    packed = prepack(weight)
    together = onednn_linear(x, packed)
    for row in (0, 7, 15):
        alone = onednn_linear(x[row : row + 1], packed)
        torch.testing.assert_close(alone[0], together[row], atol=1e-5, rtol=1e-5)


def test_prepack_refuses_other_dtypes() -> None:
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        prepack(torch.zeros(4, 4, dtype=torch.float16))
