from __future__ import annotations

import pytest
import torch

from engine.model.layers.rms_norm import RMSNorm

pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402


def _pair(hidden: int, dtype: torch.dtype, seed: int = 0) -> tuple[RMSNorm, LlamaRMSNorm]:
    generator = torch.Generator().manual_seed(seed)
    weight = 1 + 0.3 * torch.randn(hidden, generator=generator)
    ours = RMSNorm(hidden, 1e-5, dtype=dtype)
    ours.weight.copy_(weight)
    reference = LlamaRMSNorm(hidden, eps=1e-5).to(dtype)
    with torch.no_grad():
        reference.weight.copy_(weight)
    return ours, reference


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
def test_matches_transformers(dtype, atol) -> None:
    ours, reference = _pair(96, dtype)
    x = (3 * torch.randn(5, 96, generator=torch.Generator().manual_seed(1))).to(dtype)
    with torch.no_grad():
        expected = reference(x)
    out = ours(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected.float(), atol=atol, rtol=0)


def test_fused_residual_add() -> None:
    ours, reference = _pair(64, torch.float32, seed=2)
    generator = torch.Generator().manual_seed(3)
    x, residual = torch.randn(4, 64, generator=generator), torch.randn(4, 64, generator=generator)
    normed, new_residual = ours(x, residual)
    torch.testing.assert_close(new_residual, x + residual, atol=0, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(normed, reference(x + residual), atol=1e-6, rtol=0)


def test_statistics_in_float32() -> None:
    """Large fp16 inputs whose squares overflow fp16 still normalize correctly."""
    ours, _ = _pair(32, torch.float16)
    ours.weight.fill_(1.0)
    x = torch.full((2, 32), 1000.0, dtype=torch.float16)  # 1000^2 overflows fp16 (max 65504)
    out = ours(x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), torch.ones(2, 32), atol=1e-3, rtol=0)
