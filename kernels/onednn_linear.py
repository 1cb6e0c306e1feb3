"""Prepacked float32 and bf16 linears on CPU through oneDNN.

F.linear on a plain weight makes the BLAS (MKL for float32, oneDNN for bf16) reorder blocks of
the weight into its kernel's layout on every call; doing it once at load and calling the oneDNN
primitive on the packed weight is what torch.compile's mkldnn fusion pass does for frozen
linears.

bf16: only where the CPU runs bf16 natively (AMX or AVX512-BF16); elsewhere oneDNN emulates it.
Measured on an AMX machine (2 threads) at the embedded model's shapes: 1.2-2.8x faster than
F.linear for M = 1..64, about 2x for the 49152 x 576 lm_head.

float32: on every CPU oneDNN has JIT kernels (SSE4.1, AVX2, AVX512), chosen by the CPU's
instruction sets, not its vendor. MKL's sgemm, behind F.linear, is far slower on the AMD EPYCs
this project runs on, and its cost jumps with the row count where oneDNN's rises smoothly.
`python -m engine.benchmarks.cpu_linear` (docs/benchmarks.md; weights cycled from memory, 2
threads, an AMD EPYC with AVX512, 2026-12-02), F.linear / oneDNN prepacked, ms:

    rows                  1            2            8            32           512
    lm_head 49152 x 576   8.56 / 2.60  18.0 / 2.76  9.39 / 3.65  25.2 / 6.52  210 / 96.5
    gate_up 3072 x 576    0.52 / 0.25  0.98 / 0.33  0.62 / 0.30  1.02 / 0.48  10.8 / 4.50
    down 576 x 1536       0.25 / 0.13  0.35 / 0.15  0.45 / 0.20  0.86 / 0.45  8.43 / 4.31

With oneDNN and MKL both held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2, MKL_ENABLE_INSTRUCTIONS=AVX2) on
the same machine oneDNN stays ahead at every shape and row count (1.15-2.5x; the lm_head 7.39 /
3.50 ms at one row, 12.3 / 4.84 at 8, 21.5 / 9.85 at 32). End to end, float32 decoding ran
1.6x (one stream) to 2x (8 streams) faster (`python -m engine.benchmarks.quant`, its `float32
plain` row against `float32`).

oneDNN computes float32 in float32 (its fpmath mode is strict unless
torch.backends.mkldnn.matmul.fp32_precision is lowered); each output is the same dot product as
F.linear's, summed in another order, so values can differ in the last bits.
"""

from __future__ import annotations

import torch

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def onednn_available() -> bool:
    """oneDNN is built into torch (it runs float32 on any x86 CPU)."""
    return torch.backends.mkldnn.is_available()


def onednn_bf16_available() -> bool:
    """oneDNN is built in and the CPU runs bf16 natively (AMX or AVX512-BF16)."""
    if not onednn_available():
        return False
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    avx512_bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool((amx and amx()) or (avx512_bf16 and avx512_bf16()))


def prepack(
    weight: torch.Tensor,  # [N, K] float32 or bfloat16 on the CPU
) -> torch.Tensor:  # opaque oneDNN tensor with shape [N, K]
    if weight.dtype not in PACKABLE_DTYPES or weight.device.type != "cpu":
        raise ValueError(f"prepack needs a float32 or bfloat16 CPU weight, got {weight.dtype} on {weight.device}")
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())


def onednn_linear(
    x: torch.Tensor,  # [..., K], the packed weight's dtype
    packed: torch.Tensor,  # from prepack, [N, K]; or a plain [N, K] weight, reordered by oneDNN per call
    bias: torch.Tensor | None = None,  # [N], the same dtype
) -> torch.Tensor:  # [..., N], the same dtype
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
