"""Rotary position embedding over a cos/sin table (torch reference).

Neox / Hugging Face halves layout: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), where the table
row of a position holds the cos halves then the sin halves (engine/model/layers/rotary.py builds
it), computed in float32 and rounded once to x's dtype.
"""

from __future__ import annotations

import torch


def rope_ref(
    x: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens] int64
    cos_sin_table: torch.Tensor,  # [max_positions, head_dim] float32: cos halves then sin halves
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    cos, sin = cos_sin_table.index_select(0, positions).unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
