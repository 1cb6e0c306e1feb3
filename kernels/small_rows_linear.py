"""float32 linear on the CPU for the few-row products of decoding and verification.

Where the compiled CPU kernels built and the CPU is an AVX2 one without AVX512, up to
SKINNY_MAX_ROWS rows take kernels/cpu/skinny_linear.cpp: it streams each weight row once while
every input row keeps its own accumulator, so 1 to 8 rows cost about what one row costs, which
neither MKL nor oneDNN manages there. Measured on an AMD EPYC with AVX2 only (Zen 2), 2 threads,
weights cycled from memory, medians in ms, oneDNN prepacked / this kernel (`python -m
engine.benchmarks.cpu_linear`, docs/benchmarks.md):

    rows                  1            8            16           24           32           40           48
    lm_head 49152 x 576   5.64 / 5.04  9.00 / 5.25  11.2 / 8.36  13.1 / 11.4  16.2 / 14.7  18.7 / 18.1  21.1 / 21.5
    gate_up 3072 x 576    0.47 / 0.36  0.70 / 0.40  0.89 / 0.67  1.04 / 0.87  1.23 / 1.09  1.53 / 1.30  1.63 / 1.49
    down 576 x 1536       0.25 / 0.18  0.38 / 0.23  0.49 / 0.36  0.57 / 0.48  0.65 / 0.59  0.78 / 0.73  1.13 / 0.86

Past its first pass (8 rows, 10 where K <= 614: docs/kernels.md) the kernel re-reads blocks of
weight rows from cache in 2 x 4 register tiles, bound by the multiply-adds; oneDNN's
register-blocked kernel catches up at the lm_head at about 44 rows (the decoder's linears stay
ahead to 64), so SKINNY_MAX_ROWS is 40: 8 streams verifying up to 4 drafts each. Each output of
the kernel is summed in an order that does not depend on the other rows: a row's values are
bit-identical alone and in any batch of up to SKINNY_MAX_ROWS.
On CPUs with AVX512 oneDNN's own kernels are already nearly flat in the row count (2.60 ms at
one row, 3.65 at 8 for the lm_head on an AVX512 EPYC) and this AVX2 kernel was never measured
against them there, so they keep oneDNN.

Without the compiled kernel (no compiler, DRAFTGATE_CPU_KERNELS=0, another ISA), and for weights
not prepacked for oneDNN (kernels/onednn_linear.py; torch builds without oneDNN, models loaded
for training), `linear` falls back to MKL. torch's F.linear computes x @ W^T with MKL's sgemm, which for a handful of rows is far slower than
for one: a row takes the matrix-vector path, which streams the weight once, while 2-32 rows take
a general product that packs blocks of the weight as it goes and, on a machine whose memory
bandwidth bounds decoding, pays for the weight traffic about twice. Asking for the same product
as W @ x^T (the weight as the left operand, x^T a transposed view that MKL reads in place) takes
a kernel that streams the weight once for all the rows. Measured on an AMD EPYC with AVX2 (no
AVX512), weights cycled so they come from memory, medians in ms, F.linear against W @ x^T:

    2 threads             1 row        2 rows       4 rows       8 rows       16 rows      32 rows
    lm_head 49152 x 576   17.6 / 14.1  37.4 / 10.6  33.7 / 10.4  31.8 / 16.9  36.6 / 24.6  49.1 / 37.4
    gate_up 3072 x 576    1.18 / 1.04  2.14 / 0.76  1.92 / 0.66  1.91 / 1.17  2.25 / 1.40  2.96 / 1.70
    down 576 x 1536       0.37 / 0.34  0.79 / 0.37  0.66 / 0.37  0.67 / 0.53  0.78 / 0.50  0.97 / 0.73
    1 thread
    lm_head               16.3 / 17.9  41.3 / 20.1  38.6 / 19.8  38.3 / 35.3  52.6 / 50.1  74.1 / 60.4
    gate_up               1.06 / 1.02  1.70 / 1.05  2.27 / 1.13  2.37 / 1.85  2.34 / 2.49  3.71 / 3.06

So 2 to MAX_ROWS rows (8 at one thread, where the two paths are even from about 12 rows on; 32
with more threads) take W @ x^T; one row keeps the matrix-vector path, and prefill chunks, where
the general product's packing pays for itself, keep F.linear. Before, the rows were padded to a
multiple of 4 (MKL's sgemm had been far slower for 7 rows than for 8 on an AVX512 EPYC), which left
2-4 rows at twice one row's time here: verifying a draft at one stream cost a step and a half, and
float32 speculation at one chat stream ran at 0.72-0.84x of plain decoding.

Each output element is still one float32 dot product of a weight row with an input row; the
kernels may sum in another order, so values can differ from F.linear's in the last bits.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from kernels.cpu import cpu_kernels
from kernels.onednn_linear import onednn_linear

MAX_ROWS_ONE_THREAD = 8
MAX_ROWS = 32
SKINNY_MAX_ROWS = 40


@functools.cache
def skinny_enabled() -> bool:
    """Whether few-row float32 products take the compiled kernel on this machine."""
    return torch.backends.cpu.get_cpu_capability() == "AVX2" and cpu_kernels() is not None


@functools.cache
def held_weights_enabled() -> bool:
    """Whether few-row float32 products over weights held in bf16 or int8 (a draft's:
    engine/worker/model_runner.py's draft_weight_format) take the compiled kernel: on every CPU
    with AVX2 or wider where the kernels built, AVX512 ones included. There oneDNN's products on
    one to a few rows are bound by their fixed costs, not by the bytes: on an AMX Xeon (2
    threads, weights cycled from memory) the EAGLE head's layer took 0.56 ms a row in bf16
    through oneDNN against 0.43 over bf16-held weights in this kernel, and in the engine a
    further head position 1.4 ms driven from Python against 0.5 through the compiled head
    (engine/spec_decode/eagle_compiled.py; docs/speculative.md). float32 weights there keep
    oneDNN (skinny_enabled)."""
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") and cpu_kernels() is not None


def compiled_linear(
    x: torch.Tensor,  # [num_rows, in_features] float32 on the CPU
    weight: torch.Tensor,  # [out_features, in_features] float32, bf16 (widened as read) or int8, contiguous
    bias: torch.Tensor | None = None,  # [out_features]
    scales: torch.Tensor | None = None,  # [out_features] float32: an int8 weight's, which needs them
) -> torch.Tensor | None:  # [num_rows, out_features], or None where the kernel does not take it
    """The compiled few-row product, when this machine uses it and it takes these tensors:
    every weight on AVX2 CPUs (skinny_enabled), held bf16 and int8 weights under float32 rows on
    wider ones too (held_weights_enabled)."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= SKINNY_MAX_ROWS:
        return None
    held = weight.dtype in (torch.bfloat16, torch.int8) and x.dtype == torch.float32
    if not (skinny_enabled() or (held and held_weights_enabled())):
        return None
    return cpu_kernels().try_skinny_linear(x, weight, bias, scales)  # (built: either check says so)


def linear(
    x: torch.Tensor,  # [num_rows, in_features]
    weight: torch.Tensor | None,  # [out_features, in_features]; None: onednn_weight only
    bias: torch.Tensor | None = None,  # [out_features]
    *,
    onednn_weight: torch.Tensor | None = None,  # [out_features, in_features], prepacked or plain
) -> torch.Tensor:  # [num_rows, out_features]
    """The compiled few-row product where it takes x, else oneDNN where a weight for it is given
    (kernels/onednn_linear.py), else MKL (mkl_linear). A bf16 weight with float32 x is float32
    arithmetic over the widened weight on every path."""
    if weight is not None:
        compiled = compiled_linear(x, weight, bias)
        if compiled is not None:
            return compiled
    if onednn_weight is not None:
        return onednn_linear(x, onednn_weight, bias)
    assert weight is not None, "a weight for MKL or one for oneDNN"
    if weight.dtype == torch.bfloat16 and x.dtype == torch.float32:
        weight = weight.float()  # a bf16-held weight past the kernel's rows: widened (exactly) for this call
    return mkl_linear(x, weight, bias)


def mkl_linear(
    x: torch.Tensor,  # [num_rows, in_features]
    weight: torch.Tensor,  # [out_features, in_features]
    bias: torch.Tensor | None = None,  # [out_features]
) -> torch.Tensor:  # [num_rows, out_features]
    """The fallback: W @ x^T for 2 to MAX_ROWS float32 rows, F.linear otherwise."""
    num_rows = x.shape[0] if x.dim() == 2 else 0
    if (num_rows <= 1 or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu"
            or num_rows > (MAX_ROWS_ONE_THREAD if torch.get_num_threads() == 1 else MAX_ROWS)):
        return F.linear(x, weight, bias)
    out = torch.mm(weight, x.t()).t().contiguous()  # [out_features, num_rows] -> [num_rows, out_features]
    return out if bias is None else out.add_(bias)


def linear_int8(
    x: torch.Tensor,  # [num_rows, in_features] float32
    weight: torch.Tensor,  # [out_features, in_features] int8, contiguous
    scales: torch.Tensor,  # [out_features] float32: each weight row's scale
    bias: torch.Tensor | None = None,  # [out_features] float32
) -> torch.Tensor:  # [num_rows, out_features] float32
    """float32 arithmetic over a weight held in int8 with one scale per row: y = (x q^T) * scales
    (+ b). Few rows take the compiled kernel, which widens the integers as it reads them (a
    quarter of float32's bytes); more rows, or no kernel, dequantize the weight for the call."""
    compiled = compiled_linear(x, weight, bias, scales)
    if compiled is not None:
        return compiled
    return mkl_linear(x, weight.float() * scales[:, None], bias)
