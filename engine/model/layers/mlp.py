"""Gated MLP (SwiGLU): down(silu(gate(x)) * up(x)), gate and up fused into one matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.layers.linear import Linear


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * d] -> [num_tokens, d]
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
