"""The execution forms of a linear layer against F.linear: same shapes and attributes, outputs
equal to the dequantized (or unpacked) weight's product, float32 out for the lm_head."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model.layers.quant_linear import Fp8Linear, Int4Linear, Int8Linear, PackedLinear
from kernels.onednn_linear import onednn_bf16_available
from kernels.quant_ref import dequantize_fp8, dequantize_int4, dequantize_int8, quantize_fp8, quantize_int4, quantize_int8


def _data(m: int = 5, n: int = 96, k: int = 192, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=generator), torch.randn(m, k, generator=generator), torch.randn(n, generator=generator)


def _assert_bf16_close(out: torch.Tensor, expected: torch.Tensor) -> None:
    scale = expected.abs().max().item()
    torch.testing.assert_close(out.float(), expected.float(), atol=0.02 * scale, rtol=0.02)


def test_int8_linear() -> None:
    weight, x, bias = _data()
    layer = Int8Linear(weight, bias, [32, 64])
    assert (layer.input_size, layer.output_sizes, layer.output_size) == (192, [32, 64], 96)
    q, scales = quantize_int8(weight)
    _assert_bf16_close(layer(x), F.linear(x, dequantize_int8(q, scales), bias))
    assert layer(x).dtype == torch.float32


def test_int4_linear_picks_a_group_that_divides_the_input() -> None:
    weight, x, _ = _data(k=192)  # 192 = 3 * 64: group 128 does not divide it
    layer = Int4Linear(weight, None, group_size=128)
    assert layer.group_size == 64
    qweight, scales, zeros = quantize_int4(weight, 64)
    _assert_bf16_close(layer(x.bfloat16()), F.linear(x, dequantize_int4(qweight, scales, zeros, 64)))


def test_int4_linear_from_prequantized_tensors() -> None:
    weight, x, bias = _data()
    quantized = quantize_int4(weight, 32)
    layer = Int4Linear(None, bias, group_size=32, quantized=quantized, input_size=192)
    _assert_bf16_close(layer(x), F.linear(x, dequantize_int4(*quantized, 32), bias))


def test_fp8_linear_float_output() -> None:
    weight, x, _ = _data()
    layer = Fp8Linear(weight, None, float_output=True)
    out = layer(x.bfloat16())
    assert out.dtype == torch.float32
    q, scales = quantize_fp8(weight)
    _assert_bf16_close(out, F.linear(x, dequantize_fp8(q, scales)))


@pytest.mark.skipif(not onednn_bf16_available(), reason="needs oneDNN and a CPU with native bf16")
def test_packed_bf16_linear() -> None:
    weight, x, bias = _data()
    weight, x, bias = weight.bfloat16(), x.bfloat16(), bias.bfloat16()
    layer = PackedLinear(weight, bias, [96])
    torch.testing.assert_close(layer(x), F.linear(x, weight, bias), atol=2e-2, rtol=1e-2)
    assert not list(layer.parameters())  # the plain weight is gone
