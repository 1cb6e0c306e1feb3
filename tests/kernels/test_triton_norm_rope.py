"""The Triton RMSNorm (+ residual) and RoPE kernels against their torch references, which are
checked here against the model's own layers (the semantics they must keep)."""

from __future__ import annotations

import pytest
import torch
from triton_harness import DEVICE

from engine.model.layers.rms_norm import RMSNorm
from engine.model.layers.rotary import RotaryEmbedding, apply_rotary
from kernels.rms_norm import rms_norm_ref
from kernels.rope import rope_ref
from kernels.triton_rms_norm import rms_norm_triton
from kernels.triton_rope import rope_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype: torch.dtype, with_residual: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    hidden = 48  # not a power of two: masked tail
    x = torch.randn(7, hidden, generator=generator).to(dtype)
    residual = torch.randn(7, hidden, generator=generator).to(dtype) if with_residual else None
    layer = RMSNorm(hidden, 1e-5, dtype=dtype)
    layer.weight.data = (1 + 0.3 * torch.randn(hidden, generator=generator)).to(dtype)
    expected, expected_residual = rms_norm_ref(x, layer.weight, 1e-5, residual)
    from_layer = layer(x, residual) if with_residual else (layer(x), None)
    # bf16: a rounding flip of the normalized value (before the weight) moves the result a few ulps.
    tolerance = 1e-6 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(expected.float(), from_layer[0].float(), atol=tolerance, rtol=tolerance)
    out, new_residual = rms_norm_triton(x.to(DEVICE), layer.weight.to(DEVICE), 1e-5,
                                        None if residual is None else residual.to(DEVICE))
    torch.testing.assert_close(out.cpu().float(), expected.float(), atol=tolerance, rtol=tolerance)
    if with_residual:
        if DEVICE.type == "cuda" or dtype == torch.float32:
            assert torch.equal(new_residual.cpu(), expected_residual)
        else:  # the interpreter truncates float32 -> bf16 where GPUs round: one ulp apart at most
            torch.testing.assert_close(new_residual.float(), expected_residual.float(), atol=0, rtol=2**-7)
    else:
        assert new_residual is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    rotary = RotaryEmbedding(24, 10000.0, None, 64)
    positions = torch.tensor([0, 5, 63, 17, 2])
    x = torch.randn(5, 3, 24, generator=generator).to(dtype)
    expected = rope_ref(x, positions, rotary.cos_sin_table)
    cos, sin = rotary.cos_sin(positions, torch.float32)
    torch.testing.assert_close(expected.float(), apply_rotary(x.float(), cos, sin).to(dtype).float(),
                               atol=1e-6, rtol=1e-6)
    out = rope_triton(x.to(DEVICE), positions.to(DEVICE), rotary.cos_sin_table.to(DEVICE))
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.cpu().float(), expected.float(), atol=tolerance, rtol=tolerance)
