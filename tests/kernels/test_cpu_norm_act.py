"""The compiled CPU row kernels (kernels/cpu/rms_norm.cpp, silu_mul.cpp) against their torch
references: fused residual add + RMSNorm and SwiGLU's activation, fp32 and bf16, odd widths,
strided rows, one row and many (the threaded path), and the model layers that dispatch to them."""

from __future__ import annotations

import pytest
import torch

import kernels
from engine.model.layers.mlp import silu_and_mul
from engine.model.layers.rms_norm import RMSNorm
from kernels import rms_norm_ref, silu_and_mul_ref
from kernels.cpu import CpuKernels

BF16_ULP = 2.0 ** -7  # relative spacing of bf16 values


def assert_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=2e-6, atol=1e-6)
        return
    # bf16: the same rounding points as the reference; only a float32 sum (or exp) that lands on
    # the other side of a rounding boundary may move an intermediate by one bf16 step, which the
    # second rounding (after the weight or up multiplies it) can carry to at most two.
    a, e = actual.float(), expected.float()
    step = e.abs().clamp_min(1e-30) * BF16_ULP
    assert bool(((a - e).abs() <= 2 * step * 1.01).all()), float(((a - e).abs() / step).max())
    assert (a == e).float().mean().item() >= 0.99


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,hidden", [(1, 576), (7, 33), (200, 576), (3, 1)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_the_reference(compiled: CpuKernels, dtype: torch.dtype, rows: int, hidden: int,
                                        with_residual: bool) -> None:
    generator = torch.Generator().manual_seed(rows * 1000 + hidden)
    x = (torch.randn(rows, hidden, generator=generator) * 3).to(dtype)
    weight = (torch.rand(hidden, generator=generator) + 0.5).to(dtype)
    residual = torch.randn(rows, hidden, generator=generator).to(dtype) if with_residual else None
    residual_before = None if residual is None else residual.clone()
    normed, new_residual = compiled.rms_norm(x, weight, 1e-5, residual)
    expected, expected_residual = rms_norm_ref(x, weight, 1e-5, residual)
    assert_matches(normed, expected)
    if with_residual:
        assert torch.equal(new_residual, expected_residual)  # the add rounds exactly as torch's
        assert torch.equal(residual, residual_before)  # inputs are left alone
    else:
        assert new_residual is None


def test_rms_norm_reads_strided_rows(compiled: CpuKernels) -> None:
    wide = torch.randn(5, 100)
    x = wide[:, 10:74]  # rows 100 apart
    weight = torch.rand(64) + 0.5
    assert_matches(compiled.rms_norm(x, weight, 1e-6)[0], rms_norm_ref(x, weight, 1e-6)[0])


def test_rms_norm_checks_shapes(compiled: CpuKernels) -> None:
    with pytest.raises(ValueError, match="rms_norm"):
        compiled.rms_norm(torch.randn(2, 8), torch.ones(9), 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,d", [(1, 1536), (9, 17), (64, 1536)])
def test_silu_mul_matches_the_reference(compiled: CpuKernels, dtype: torch.dtype, rows: int, d: int) -> None:
    generator = torch.Generator().manual_seed(rows + d)
    gate_up = (torch.randn(rows, 2 * d, generator=generator) * 4).to(dtype)
    gate_up[0, 0] = 100.0  # far tails: sigmoid saturates to 1 and to 0
    gate_up[0, 1] = -100.0
    assert_matches(compiled.silu_mul(gate_up), silu_and_mul_ref(gate_up))


def test_silu_mul_rejects_an_odd_width(compiled: CpuKernels) -> None:
    with pytest.raises(ValueError, match="odd width"):
        compiled.silu_mul(torch.randn(2, 7))


def test_the_model_layers_dispatch_to_the_compiled_kernels(compiled: CpuKernels, monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(compiled, "rms_norm", lambda *a: calls.append("rms_norm") or rms_norm_ref(*a))
    monkeypatch.setattr(compiled, "silu_mul", lambda g: calls.append("silu_mul") or silu_and_mul_ref(g))
    norm = RMSNorm(16, 1e-6)
    norm.weight.data.fill_(1.0)
    with torch.inference_mode():
        norm(torch.randn(3, 16), torch.randn(3, 16))
        silu_and_mul(torch.randn(3, 8))
        norm(torch.randn(2, 3, 16))  # 3-D (per-head q/k norms): the torch path
    assert calls == ["rms_norm", "silu_mul"]
    assert kernels.silu_and_mul(torch.randn(2, 4)).shape == (2, 2)
