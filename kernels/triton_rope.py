"""Triton rotary embedding (neox / Hugging Face halves layout) for q and k in one launch: each
program rotates one token's heads, looking its cos/sin up in the table by position, so the
per-step cos/sin gather and the four elementwise passes of the torch version disappear.

Semantics: engine/model/layers/rotary.py's apply_rotary with cos/sin = table[positions] split in
halves, (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), computed in float32 and rounded once.
Reference: kernels.rope.rope_ref.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(
    x_ptr, out_ptr, positions_ptr, table_ptr, num_heads,
    stride_xt, stride_xh, stride_ot, stride_oh, stride_table,
    HALF: tl.constexpr, HALF_P: tl.constexpr, HEADS_P: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    heads = tl.arange(0, HEADS_P)
    dims = tl.arange(0, HALF_P)
    ok = (heads[:, None] < num_heads) & (dims[None, :] < HALF)
    cos = tl.load(table_ptr + pos * stride_table + dims, mask=dims < HALF, other=0.0)[None, :]
    sin = tl.load(table_ptr + pos * stride_table + HALF + dims, mask=dims < HALF, other=0.0)[None, :]
    src = x_ptr + token * stride_xt + heads[:, None] * stride_xh + dims[None, :]
    x1 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=ok, other=0.0).to(tl.float32)
    dst = out_ptr + token * stride_ot + heads[:, None] * stride_oh + dims[None, :]
    tl.store(dst, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=ok)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=ok)


def rope_triton(
    x: torch.Tensor,  # [num_tokens, num_heads, head_dim], head vectors contiguous
    positions: torch.Tensor,  # [num_tokens] int64
    cos_sin_table: torch.Tensor,  # [max_positions, head_dim] float32
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    num_tokens, num_heads, head_dim = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=x.dtype, device=x.device)
    if num_tokens:
        half = head_dim // 2
        _rope_kernel[(num_tokens,)](
            x, out, positions, cos_sin_table, num_heads,
            x.stride(0), x.stride(1), out.stride(0), out.stride(1), cos_sin_table.stride(0),
            HALF=half, HALF_P=triton.next_power_of_2(half), HEADS_P=triton.next_power_of_2(num_heads),
        )
    return out
