"""The compiled few-row float32 linear (kernels/cpu/skinny_linear.cpp): the products it computes,
bit-identical rows whatever the batch, the portable build equal to the native one bit for bit,
and the dispatch (kernels/small_rows_linear.py, PackedLinear) that sends few rows to it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model.layers.quant_linear import Bf16WeightLinear, Int8WeightLinear, PackedLinear
from kernels import small_rows_linear
from kernels.cpu import CpuKernels
from kernels.onednn_linear import onednn_available

FLOAT32_EPS = 2.0 ** -24  # unit roundoff


def assert_within_rounding(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """|y - exact| <= K * u * sum_k |x_k w_k| (+ |b|) per output (plus slack): the bound any float32
    summation order meets (Higham's, first order), so a wrong index or a dropped term fails."""
    exact = x.double() @ weight.double().t()
    magnitude = x.double().abs() @ weight.double().abs().t()
    if bias is not None:
        exact = exact + bias.double()
        magnitude = magnitude + bias.double().abs()
    bound = (x.shape[1] + 2) * FLOAT32_EPS * magnitude + 1e-30
    assert bool(((y.double() - exact).abs() <= bound).all()), float(((y.double() - exact).abs() / bound).max())


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 9, 12, 16, 17, 25, 40])
@pytest.mark.parametrize("in_features", [1, 7, 8, 37, 576])
def test_products_are_dot_products_within_float32_rounding(compiled: CpuKernels, rows: int, in_features: int) -> None:
    generator = torch.Generator().manual_seed(rows * 1000 + in_features)
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(131, in_features, generator=generator)
    bias = torch.randn(131, generator=generator)
    for b in (None, bias):
        y = compiled.skinny_linear(x, weight, b)
        assert y.shape == (rows, 131) and y.dtype == torch.float32 and y.is_contiguous()
        assert_within_rounding(y, x, weight, b)


def test_large_products_use_the_threads_and_strided_rows(compiled: CpuKernels) -> None:
    generator = torch.Generator().manual_seed(7)
    wide = torch.randn(6, 700, generator=generator)
    x = wide[:, 50:626]  # rows 700 apart
    weight = torch.randn(3072, 576, generator=generator)
    assert_within_rounding(compiled.skinny_linear(x, weight), x, weight, None)


@pytest.mark.parametrize("in_features", [577, 1536])
def test_a_row_is_bit_identical_alone_and_in_any_batch(compiled: CpuKernels, in_features: int) -> None:
    """The summation order of an output does not depend on the other rows: what makes greedy
    decoding independent of which requests share a step, up to SKINNY_MAX_ROWS rows. The first
    pass takes up to 10 rows at in_features 577 (a K % 8 tail too) and up to 8 at 1536, the
    rest 2 x 4 tiles: every split of both."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(small_rows_linear.SKINNY_MAX_ROWS, in_features, generator=generator)
    weight = torch.randn(301, in_features, generator=generator)  # 301: blocks of 32 weight rows and an odd one
    bias = torch.randn(301, generator=generator)
    alone = torch.cat([compiled.skinny_linear(x[r : r + 1], weight, bias) for r in range(x.shape[0])])
    for rows in range(2, small_rows_linear.SKINNY_MAX_ROWS + 1):
        assert torch.equal(compiled.skinny_linear(x[:rows], weight, bias), alone[:rows]), rows
    assert torch.equal(compiled.skinny_linear(x[3:14], weight, bias), alone[3:14])


@pytest.mark.parametrize("rows", [1, 5, 8, 13, 40])
def test_a_bf16_weight_is_the_widened_float32_weight_bit_for_bit(compiled: CpuKernels, rows: int) -> None:
    """bf16 weights are widened exactly as they are read, so the product is the float32 one over
    the widened weight, bit for bit: what lets a draft hold its weights in half the bytes."""
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 579, generator=generator)  # a K % 8 tail too
    weight = torch.randn(67, 579, generator=generator).bfloat16()
    bias = torch.randn(67, generator=generator)
    assert torch.equal(compiled.skinny_linear(x, weight, bias), compiled.skinny_linear(x, weight.float(), bias))
    assert_within_rounding(compiled.skinny_linear(x, weight), x, weight.float(), None)


@pytest.mark.parametrize("rows", [1, 5, 8, 13, 40])
def test_an_int8_weight_is_its_integers_widened_then_scaled_per_row(compiled: CpuKernels, rows: int) -> None:
    """int8 weights: each output is the float32 dot product over the integers widened exactly,
    times its row's scale once, then the bias. So it equals the float32 kernel over the integers
    (as floats) scaled afterwards, bit for bit, and the dequantized product within rounding."""
    generator = torch.Generator().manual_seed(100 + rows)
    x = torch.randn(rows, 579, generator=generator)  # a K % 8 tail too
    q = torch.randint(-127, 128, (67, 579), generator=generator, dtype=torch.int8)
    scales = torch.rand(67, generator=generator) * 0.02 + 1e-3
    bias = torch.randn(67, generator=generator)
    y = compiled.skinny_linear_int8(x, q, scales, bias)
    assert torch.equal(y, compiled.skinny_linear(x, q.float()) * scales + bias)
    assert_within_rounding(compiled.skinny_linear_int8(x, q, scales), x, q.float() * scales[:, None], None)
    assert torch.equal(compiled.try_skinny_linear(x, q, bias, scales), y)
    # A row alone and in a batch: the same bits.
    alone = torch.cat([compiled.skinny_linear_int8(x[r : r + 1], q, scales, bias) for r in range(rows)])
    assert torch.equal(alone, y)


def test_int8_weights_need_their_scales(compiled: CpuKernels) -> None:
    x, q = torch.randn(2, 8), torch.ones(4, 8, dtype=torch.int8)
    assert compiled.try_skinny_linear(x, q) is None  # no scales
    assert compiled.try_skinny_linear(x, q.float(), scales=torch.ones(4)) is None  # scales for a float weight
    assert compiled.try_skinny_linear(x, q, scales=torch.ones(5)) is None  # one per row
    assert compiled.try_skinny_linear(x, q, scales=torch.ones(4).double()) is None
    with pytest.raises(ValueError, match="int8 takes skinny_linear_int8"):
        compiled.skinny_linear(x, q)
    with pytest.raises(ValueError, match="float32 \\[N\\]"):
        compiled.skinny_linear_int8(x, q, torch.ones(3))


def test_bad_shapes_raise(compiled: CpuKernels) -> None:
    with pytest.raises(ValueError, match="do not match"):
        compiled.skinny_linear(torch.randn(2, 8), torch.randn(4, 9))
    with pytest.raises(ValueError, match="do not match"):
        compiled.skinny_linear(torch.randn(2, 8), torch.randn(4, 8), torch.randn(5))
    assert not compiled.supports_skinny_linear(torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(4, 8))
    assert not compiled.supports_skinny_linear(torch.randn(2, 8), torch.randn(4, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        compiled.skinny_linear(torch.randn(2, 8), torch.randn(4, 8, dtype=torch.float16))
    assert not compiled.supports_skinny_linear(torch.randn(2, 8), torch.randn(8, 4).t())  # not contiguous
    assert not compiled.supports_skinny_linear(torch.randn(8, 2).t(), torch.randn(4, 8))  # column stride 8
    # The dispatcher's one-pass check turns down what supports_skinny_linear does, and still raises
    # on shapes that do not match.
    assert compiled.try_skinny_linear(torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(4, 8)) is None
    assert compiled.try_skinny_linear(torch.randn(2, 8), torch.randn(4, 8, dtype=torch.float16)) is None
    assert compiled.try_skinny_linear(torch.randn(2, 8), torch.randn(8, 4).t()) is None
    assert compiled.try_skinny_linear(torch.randn(8, 2).t(), torch.randn(4, 8)) is None
    assert compiled.try_skinny_linear(torch.randn(2, 8), torch.randn(4, 8), torch.randn(4).double()) is None
    with pytest.raises(ValueError, match="do not match"):
        compiled.try_skinny_linear(torch.randn(2, 8), torch.randn(4, 9))
    x, weight = torch.randn(3, 8), torch.randn(4, 8)
    assert torch.equal(compiled.try_skinny_linear(x, weight), compiled.skinny_linear(x, weight))


def test_the_portable_build_is_bit_identical(compiled: CpuKernels, portable: CpuKernels) -> None:
    """Built with DRAFTGATE_PORTABLE (no intrinsics), the kernel sums in the same order as the
    native build, so the two agree bit for bit."""
    generator = torch.Generator().manual_seed(11)
    for rows, in_features in ((1, 576), (6, 43), (10, 576), (13, 576), (13, 1536), (40, 37)):
        x = torch.randn(rows, in_features, generator=generator)
        weight = torch.randn(257, in_features, generator=generator)
        bias = torch.randn(257, generator=generator)
        assert torch.equal(portable.skinny_linear(x, weight, bias), compiled.skinny_linear(x, weight, bias))
        half = weight.bfloat16()
        assert torch.equal(portable.skinny_linear(x, half, bias), compiled.skinny_linear(x, half, bias))
        q = torch.randint(-127, 128, weight.shape, generator=generator, dtype=torch.int8)
        scales = torch.rand(257, generator=generator)
        assert torch.equal(portable.skinny_linear_int8(x, q, scales, bias), compiled.skinny_linear_int8(x, q, scales, bias))


def test_dispatch_takes_few_float32_rows_only(compiled: CpuKernels) -> None:
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(64, 32, generator=generator)
    few = torch.randn(small_rows_linear.SKINNY_MAX_ROWS, 32, generator=generator)
    many = torch.randn(small_rows_linear.SKINNY_MAX_ROWS + 1, 32, generator=generator)
    assert small_rows_linear.compiled_linear(many, weight) is None
    assert small_rows_linear.compiled_linear(few.bfloat16(), weight.bfloat16()) is None
    assert small_rows_linear.compiled_linear(few[:0], weight) is None
    taken = small_rows_linear.compiled_linear(few, weight)
    if small_rows_linear.skinny_enabled():  # AVX2 CPUs: the kernel's own result, bit for bit
        assert taken is not None and torch.equal(taken, compiled.skinny_linear(few, weight))
        assert torch.equal(small_rows_linear.linear(few, weight), taken)
    else:
        assert taken is None
    # Held bf16 weights under float32 rows (a draft's): on AVX2 CPUs and wider ones alike.
    held = small_rows_linear.compiled_linear(few, weight.bfloat16())
    if small_rows_linear.held_weights_enabled():
        assert held is not None and torch.equal(held, compiled.skinny_linear(few, weight.bfloat16()))
        assert small_rows_linear.compiled_linear(many, weight.bfloat16()) is None
    else:
        assert held is None


@pytest.mark.skipif(not onednn_available(), reason="needs oneDNN")
@pytest.mark.parametrize("prepack_too", [False, True])
def test_packed_linear_keeps_one_weight_and_computes_every_row_count(prepack_too: bool) -> None:
    generator = torch.Generator().manual_seed(9)
    weight = torch.randn(200, 96, generator=generator)
    bias = torch.randn(200, generator=generator)
    layer = PackedLinear(weight, bias, [120, 80], prepack_too=prepack_too)
    if small_rows_linear.skinny_enabled():
        assert layer.plain_weight is not None and (layer.packed is not None) == prepack_too
    else:
        assert layer.plain_weight is None and layer.packed is not None
    assert layer.stored_bytes() == (200 * 96 + 200) * 4
    for rows in (1, 4, 16, 17, 64):
        x = torch.randn(rows, 96, generator=generator)
        torch.testing.assert_close(layer(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_bf16_weight_linear_holds_half_the_bytes_and_computes_every_row_count() -> None:
    """Bf16WeightLinear: float32 arithmetic over the weight rounded to bf16, through the kernel for
    few rows and a widened weight for more (where the kernel is not built: widened always)."""
    generator = torch.Generator().manual_seed(13)
    weight = torch.randn(200, 96, generator=generator)
    bias = torch.randn(200, generator=generator)
    layer = Bf16WeightLinear(weight, bias, [120, 80])
    assert layer.weight_bf16.dtype == torch.bfloat16 and layer.stored_bytes() == 200 * 96 * 2 + 200 * 4
    widened = weight.bfloat16().float()
    for rows in (1, 4, 16, 40, 41, 64):
        x = torch.randn(rows, 96, generator=generator)
        y = layer(x)
        assert y.dtype == torch.float32 and y.shape == (rows, 200)
        torch.testing.assert_close(y, F.linear(x, widened, bias), rtol=1e-5, atol=1e-5)


def test_int8_weight_linear_holds_a_quarter_of_the_bytes_and_computes_every_row_count() -> None:
    """Int8WeightLinear: float32 arithmetic over the weight rounded to int8 with a scale per row,
    through the kernel for few rows and a dequantized weight for more."""
    generator = torch.Generator().manual_seed(17)
    weight = torch.randn(200, 96, generator=generator)
    bias = torch.randn(200, generator=generator)
    layer = Int8WeightLinear(weight, bias, [120, 80])
    assert layer.weight_int8.dtype == torch.int8 and layer.stored_bytes() == 200 * 96 + 200 * 4 + 200 * 4
    dequantized = layer.weight_int8.float() * layer.scales[:, None]
    assert ((dequantized - weight).abs() <= layer.scales[:, None] / 2 + 1e-7).all()  # rounded to the nearest step
    for rows in (1, 4, 16, 40, 41, 64):
        x = torch.randn(rows, 96, generator=generator)
        y = layer(x)
        assert y.dtype == torch.float32 and y.shape == (rows, 200)
        torch.testing.assert_close(y, F.linear(x, dequantized, bias), rtol=1e-5, atol=1e-5)
