"""Gated MLP (SwiGLU): down(silu(gate(x)) * up(x)), gate and up fused into one matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import kernels

from engine.model.layers.linear import Linear


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * d] -> [num_tokens, d]
    if gate_up.device.type == "cpu" and gate_up.dim() == 2 and not gate_up.requires_grad:
        return kernels.silu_and_mul(gate_up)  # one compiled pass where it built (kernels/cpu/silu_mul.cpp)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, *, bias: bool,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        # Shard 0 is gate_proj, shard 1 is up_proj.
        self.gate_up_proj = Linear(hidden_size, [intermediate_size, intermediate_size], bias=bias,
                                   dtype=dtype, device=device)
        self.down_proj = Linear(intermediate_size, [hidden_size], bias=bias, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, hidden] -> [num_tokens, hidden]
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))
