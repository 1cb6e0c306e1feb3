"""SwiGLU's activation: silu(gate) * up over the fused gate_up projection (torch reference)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * d] -> [num_tokens, d]
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
