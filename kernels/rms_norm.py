"""RMSNorm with an optional fused residual add (torch reference).

Hugging Face's LlamaRMSNorm semantics (engine/model/layers/rms_norm.py follows them too): the add
happens in the input dtype, the mean of squares in float32, and the normalized value is rounded to
the input dtype before the weight multiplies it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_ref(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [num_tokens, hidden]
) -> tuple[torch.Tensor, torch.Tensor | None]:  # (normed [num_tokens, hidden], new residual or None)
    if residual is not None:
        x = x + residual
        residual = x
    normed = F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)
    return weight * normed, residual
