"""RMSNorm with float32 statistics, optionally fused with the residual add before it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import kernels


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)), the mean taken in float32.

    Like Hugging Face's LlamaRMSNorm the normalized value is cast back to the input dtype
    before the weight multiplies it, so bf16/fp16 models round where the reference rounds.
    Called with a residual, it first adds it (in the model dtype, as the reference does) and
    returns the sum as the new residual: one call per sub-layer boundary.
    """

    def __init__(self, hidden_size: int, eps: float, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        # Filled by the loader; torch.empty skips an init pass that would be overwritten anyway.
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=dtype, device=device),
                                   requires_grad=False)  # [hidden_size]

    def forward(
        self,
        x: torch.Tensor,  # [..., hidden_size]
        residual: torch.Tensor | None = None,  # [..., hidden_size]
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if x.device.type == "cpu" and x.dim() == 2 and not x.requires_grad:
            # One compiled pass (kernels/cpu/rms_norm.cpp) where it built: same rounding points.
            normed, new_residual = kernels.rms_norm(x, self.weight, self.eps, residual)
            return normed if residual is None else (normed, new_residual)
        if residual is not None:
            x = x + residual
            residual = x
        normed = self._norm(x)
        return normed if residual is None else (normed, residual)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., hidden_size]
        if x.dtype == torch.float32:
            # One fused op; the same math as the cast-free path below for float32 inputs.
            return F.rms_norm(x, (self.hidden_size,), self.weight, self.eps)
        normed = F.rms_norm(x.float(), (self.hidden_size,), None, self.eps)
        return self.weight * normed.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"
