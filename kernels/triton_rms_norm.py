"""Triton RMSNorm fused with the residual add before it: one read of x (and residual), one write
of the normalized row (and of the new residual), instead of four elementwise passes.

Semantics are those of engine/model/layers/rms_norm.py (Hugging Face's LlamaRMSNorm): the add
happens in the input dtype, the mean of squares in float32, the normalized value is rounded to
the input dtype before the weight multiplies it. Reference: kernels.rms_norm.rms_norm_ref.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    hidden, eps, stride_x, stride_r, stride_o, stride_ro,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        # Rounded to the input dtype like the reference's `x + residual`.
        x = (x.to(tl.float32) + tl.load(residual_ptr + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32))
        x = x.to(x_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_ro + cols, x, mask=ok)
    xf = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    normed = (xf * inv_rms).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm_triton(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [num_tokens, hidden]
) -> tuple[torch.Tensor, torch.Tensor | None]:  # (normed [num_tokens, hidden], new residual or None)
    if x.stride(-1) != 1:
        x = x.contiguous()
    num_tokens, hidden = x.shape
    out = torch.empty_like(x)
    residual_out = None
    if residual is not None:
        if residual.stride(-1) != 1:
            residual = residual.contiguous()
        residual_out = torch.empty_like(x)
    if num_tokens:
        r = residual if residual is not None else x
        ro = residual_out if residual_out is not None else out
        _rms_norm_kernel[(num_tokens,)](
            x, r, weight, out, ro, hidden, eps, x.stride(0), r.stride(0), out.stride(0), ro.stride(0),
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(hidden),
        )
    return out, residual_out
