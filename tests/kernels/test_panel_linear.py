"""The float32 linear over weights held in panels of 16 output channels (kernels/cpu/
panel_linear.cpp, kernels/panel_linear.py): the layout, the products, bit-identical rows whatever
the batch (prefill-sized ones too), the portable build equal to the native one bit for bit, the
checks, and PackedLinear and the compiled decoder holding their weights so."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model.layers.quant_linear import PackedLinear
from kernels import panel_linear, small_rows_linear
from kernels.cpu import CpuKernels
from kernels.cpu.library import PANEL_WIDTH
from tests.kernels.test_skinny_linear import assert_within_rounding


def test_panels_hold_sixteen_output_channels_per_k() -> None:
    weight = torch.arange(32 * 5, dtype=torch.float32).reshape(32, 5)  # W[n][k] = 5n + k
    panels = panel_linear.pack_panels(weight)
    assert panels.shape == (2, 5, PANEL_WIDTH) and panels.is_contiguous()
    for p in range(2):
        for k in range(5):
            for j in range(PANEL_WIDTH):
                assert panels[p, k, j].item() == weight[PANEL_WIDTH * p + j, k].item()
    assert torch.equal(panel_linear.unpack_panels(panels), weight)


def test_only_float32_weights_of_whole_panels_are_packed() -> None:
    assert panel_linear.can_pack(torch.zeros(48, 7))
    assert not panel_linear.can_pack(torch.zeros(40, 7))  # 40 is not a multiple of 16
    assert not panel_linear.can_pack(torch.zeros(48, 7, dtype=torch.bfloat16))
    assert not panel_linear.can_pack(torch.zeros(48))
    with pytest.raises(ValueError, match="multiple of 16"):
        panel_linear.pack_panels(torch.zeros(40, 7))


# Row counts around every grouping the kernel uses: one and two panels at a time (1-3, 7-8 rows),
# groups of up to 6 rows, several blocks of k (K > 128), prefill-sized batches.
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 40, 97])
@pytest.mark.parametrize("in_features", [1, 7, 128, 129, 576])
def test_products_are_dot_products_within_float32_rounding(compiled: CpuKernels, rows: int, in_features: int) -> None:
    generator = torch.Generator().manual_seed(rows * 1000 + in_features)
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(80, in_features, generator=generator)  # 5 panels: two pairs and one alone
    bias = torch.randn(80, generator=generator)
    panels = panel_linear.pack_panels(weight)
    for b in (None, bias):
        y = compiled.panel_linear(x, panels, b)
        assert y.shape == (rows, 80) and y.dtype == torch.float32 and y.is_contiguous()
        assert_within_rounding(y, x, weight, b)


def test_each_output_is_one_chain_of_fused_multiply_adds_then_the_bias(compiled: CpuKernels) -> None:
    """The documented order, checked exactly against the same chain computed step by step: a
    float32 product is exact in float64, so each step is the exact sum rounded to float32, as a
    fused multiply-add rounds it (bar a double rounding at odds of about 2**-29 a step)."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(3, 300, generator=generator)
    weight = torch.randn(16, 300, generator=generator)
    bias = torch.randn(16, generator=generator)
    y = compiled.panel_linear(x, panel_linear.pack_panels(weight), bias)
    for m in range(3):
        for n in (0, 7, 15):
            total = torch.zeros((), dtype=torch.float32)
            for k in range(300):
                exact = total.double() + x[m, k].double() * weight[n, k].double()
                total = exact.float()  # one rounding per step, as a fused multiply-add
            assert y[m, n].item() == (total + bias[n]).item()


def test_large_products_use_the_threads_and_strided_rows(compiled: CpuKernels) -> None:
    generator = torch.Generator().manual_seed(7)
    wide = torch.randn(6, 700, generator=generator)
    x = wide[:, 50:626]  # rows 700 apart
    weight = torch.randn(3072, 576, generator=generator)
    assert_within_rounding(compiled.panel_linear(x, panel_linear.pack_panels(weight)), x, weight, None)


@pytest.mark.parametrize("in_features", [577, 1536])
def test_a_row_is_bit_identical_alone_and_in_any_batch(compiled: CpuKernels, in_features: int) -> None:
    """The summation order of an output does not depend on the other rows, up to prefill-sized
    batches: decoding, verification and prefill compute a token's values alike."""
    generator = torch.Generator().manual_seed(in_features)
    x = torch.randn(70, in_features, generator=generator)
    panels = panel_linear.pack_panels(torch.randn(96, in_features, generator=generator))
    bias = torch.randn(96, generator=generator)
    alone = torch.cat([compiled.panel_linear(x[i:i + 1], panels, bias) for i in range(70)])
    for rows in [*range(2, 17), 23, 40, 41, 70]:
        assert torch.equal(compiled.panel_linear(x[:rows], panels, bias), alone[:rows]), rows
        assert torch.equal(compiled.panel_linear(x[70 - rows:], panels, bias), alone[70 - rows:]), rows


def test_bad_inputs_are_refused_with_a_clear_error(compiled: CpuKernels) -> None:
    panels = panel_linear.pack_panels(torch.randn(32, 8))
    with pytest.raises(ValueError, match="panel_linear"):
        compiled.panel_linear(torch.randn(2, 9), panels)  # K does not match
    with pytest.raises(ValueError, match="panel_linear"):
        compiled.panel_linear(torch.randn(2, 8).double(), panels)
    with pytest.raises(ValueError, match="panel_linear"):
        compiled.panel_linear(torch.randn(8, 2).t(), panels)  # columns not unit-stride
    with pytest.raises(ValueError, match="panel_linear"):
        compiled.panel_linear(torch.randn(2, 8), panels.transpose(0, 1))
    with pytest.raises(ValueError, match="bias"):
        compiled.panel_linear(torch.randn(2, 8), panels, torch.randn(31))
    assert compiled.panel_linear(torch.randn(0, 8), panels).shape == (0, 32)


def test_the_portable_build_is_bit_identical(compiled: CpuKernels, portable: CpuKernels) -> None:
    """Built with DRAFTGATE_PORTABLE (no intrinsics), the kernel sums in the same order as the
    native build, so the two agree bit for bit."""
    generator = torch.Generator().manual_seed(11)
    for rows, in_features in ((1, 576), (2, 43), (3, 130), (7, 576), (8, 300), (13, 1536), (40, 37)):
        x = torch.randn(rows, in_features, generator=generator)
        panels = panel_linear.pack_panels(torch.randn(112, in_features, generator=generator))
        bias = torch.randn(112, generator=generator)
        assert torch.equal(portable.panel_linear(x, panels, bias), compiled.panel_linear(x, panels, bias))


def test_panel_linear_takes_any_leading_shape_and_other_inputs() -> None:
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(48, 20, generator=generator)
    bias = torch.randn(48, generator=generator)
    panels = panel_linear.pack_panels(weight)
    x = torch.randn(2, 3, 20, generator=generator)
    y = panel_linear.panel_linear(x, panels, bias)
    assert y.shape == (2, 3, 48)
    torch.testing.assert_close(y, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    wide = panel_linear.panel_linear(x.double(), panels, bias.double())  # not the kernel's: F.linear
    torch.testing.assert_close(wide, F.linear(x.double(), weight.double(), bias.double()))


@pytest.mark.parametrize("prepack_too", [False, True])
def test_packed_linear_holds_a_float32_weight_once_in_panels(prepack_too: bool) -> None:
    """Where the compiled kernels take float32 products, a weight of whole panels is held in
    panels only (no plain or oneDNN copy, also for an lm_head) and every row count takes them."""
    if not small_rows_linear.skinny_enabled():
        pytest.skip("panels are for CPUs whose float32 products take the compiled kernels (AVX2)")
    generator = torch.Generator().manual_seed(9)
    weight = torch.randn(208, 96, generator=generator)
    bias = torch.randn(208, generator=generator)
    layer = PackedLinear(weight, bias, [128, 80], prepack_too=prepack_too)
    assert layer.panels is not None and layer.plain_weight is None and layer.packed is None
    assert layer.stored_bytes() == (208 * 96 + 208) * 4
    alone = None
    for rows in (1, 4, 16, 17, 64, 300):
        x = torch.randn(rows, 96, generator=generator)
        y = layer(x)
        torch.testing.assert_close(y, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
        if alone is None:
            first, alone = x[:1], y[:1]
        assert torch.equal(layer(torch.cat([first, x]))[:1], alone)
