"""float32 linears over a weight held in panels of 16 output channels, on AVX2 CPUs.

The layout: W [N, K] as [N / 16, K, 16], panel p holding W[16p + j][k] at [p][k][j], so the 16
weights of one k lie in one 64-byte line and a panel is read front to back as one stream. The
compiled kernel (kernels/cpu/panel_linear.cpp) broadcasts each input row's x[m][k] against those
16 weights: one weight load serves up to 12 multiply-adds, where the row kernel over [N, K]
(kernels/cpu/skinny_linear.cpp) needs an x load beside every multiply-add and, from about 3 rows
on, costs more than reading the weight does.

Measured on an AVX2 EPYC (2 threads, the embedded model in float32, plain decoding at 1-8
streams, each step's forward and logits; both kernels in one process, their steps interleaved,
medians in ms; docs/kernels.md has a second run, on a slower hour, where they drew closer):

    rows           1      2      3      4      5      6      7      8
    row kernel     16.0   17.1   18.6   19.7   20.9   23.1   26.3   27.0
    panels         15.8   15.9   17.1   18.3   22.2   20.4   23.8   26.1

The same kernel takes prefill chunks, so the decoder's weights are held once, in panels: whole
prompts of 36-547 tokens prefilled 15% faster than through oneDNN over the plain weight, and at
512 rows, weights cycled from memory, it runs within 1% of oneDNN's prepacked product for the
decoder's shapes and 15% slower for the lm_head (docs/benchmarks.md). Each output is one chain
of fused multiply-adds over k in order, then the bias, whatever the row count: a row's values
are bit-identical alone, in a batch, or in a prefill chunk.

Used where the compiled kernels are (skinny_enabled: AVX2 CPUs without AVX512, the kernels
built) for float32 weights whose N is a multiple of 16 (every Llama-family shape); other weights
keep [N, K] (engine/model/layers/quant_linear.py's PackedLinear).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.cpu import cpu_kernels
from kernels.cpu.library import PANEL_WIDTH


def can_pack(weight: torch.Tensor) -> bool:
    """A float32 [N, K] CPU weight whose N is a multiple of the panel width."""
    return (weight.dtype == torch.float32 and weight.dim() == 2 and weight.is_cpu and weight.shape[0] > 0
            and weight.shape[0] % PANEL_WIDTH == 0 and weight.shape[1] > 0)


def pack_panels(
    weight: torch.Tensor,  # [N, K] float32, N a multiple of PANEL_WIDTH
) -> torch.Tensor:  # [N / PANEL_WIDTH, K, PANEL_WIDTH] float32, contiguous
    if not can_pack(weight):
        raise ValueError(f"pack_panels: a float32 CPU weight [N, K] with N a multiple of {PANEL_WIDTH}, "
                         f"got {weight.dtype} {tuple(weight.shape)} on {weight.device}")
    n, k = weight.shape
    return weight.detach().reshape(n // PANEL_WIDTH, PANEL_WIDTH, k).transpose(1, 2).contiguous()


def unpack_panels(
    panels: torch.Tensor,  # [N / PANEL_WIDTH, K, PANEL_WIDTH]
) -> torch.Tensor:  # [N, K], contiguous
    num_panels, k, width = panels.shape
    return panels.transpose(1, 2).reshape(num_panels * width, k).contiguous()


def panel_linear(
    x: torch.Tensor,  # [..., K] float32
    panels: torch.Tensor,  # [N / PANEL_WIDTH, K, PANEL_WIDTH] float32, from pack_panels
    bias: torch.Tensor | None = None,  # [N] float32
) -> torch.Tensor:  # [..., N] float32
    """y = x W^T (+ b) through the compiled kernel."""
    kernels = cpu_kernels()
    if kernels is None or x.dtype != torch.float32:
        # Not on the engine's path (panels exist only where the kernels are built, for float32
        # models); kept so a caller with other inputs gets the right values, slowly.
        return F.linear(x, unpack_panels(panels).to(x.dtype), bias)
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = kernels.panel_linear(rows, panels, bias)  # [rows, N]
    return out.reshape(*x.shape[:-1], out.shape[-1])
