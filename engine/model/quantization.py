"""Quantize-at-load and execution-form swaps, gpt-fast style: load the model in full precision,
then replace each Linear (and the lm_head) by a module that holds the weight in its execution
form and computes the same product (engine/model/layers/quant_linear.py).

Methods (`--quantization`):
- None: no quantization. On a CPU a float32 model's linears, and a bf16 model's where the CPU
  runs bf16 natively (AMX / AVX512-BF16), are prepacked for oneDNN instead (the same products,
  summed in another order; for float32 on an AMD EPYC 1.5-6.5x faster than F.linear per linear,
  1.6-2x end to end: kernels/onednn_linear.py, docs/kernels.md).
- "int8": weight-only int8, per output channel; every linear and the lm_head.
- "int4": weight-only int4, group-wise: group 128 (or the largest of 64/32 dividing the input
  size) for full-precision checkpoints, group 32 for GGUF files. GGUF weights are already
  block-quantized 32 values at a time (Q4_0/Q4_1/Q8_0 blocks, K-quant sub-blocks), and
  requantizing them into wider groups compounds two rounding errors: on the embedded Q4_1 model,
  group 64 costs +32% perplexity, group 32 reproduces its blocks almost exactly (+0.4%).
  The lm_head, the layer whose error every token's distribution feels most, is int8 (llama.cpp's
  Q4 types likewise keep output.weight at 6-8 bits).
- "fp8": weight-only fp8 e4m3, per output channel.
- "gptq" / "awq": int4 checkpoints, recognised from config.json's quantization_config by the
  Hugging Face loader (engine/model/loader/gptq_awq.py), not quantized here.

The embedding stays in the model dtype: a lookup reads one row per token, so it costs no
bandwidth worth saving.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from engine.config import QUANTIZATION_METHODS
from engine.model.layers.linear import Linear
from engine.model.layers.quant_linear import (
    Bf16WeightLinear,
    Fp8Linear,
    Int4Linear,
    Int8Linear,
    Int8WeightLinear,
    PackedLinear,
)
from engine.model.llama import LlamaForCausalLM
from kernels.onednn_linear import onednn_available, onednn_bf16_available

logger = logging.getLogger(__name__)

QUANTIZE_AT_LOAD = ("int8", "int4", "fp8")
CHECKPOINT_QUANTIZATION = ("gptq", "awq")
assert set(QUANTIZE_AT_LOAD + CHECKPOINT_QUANTIZATION) == set(QUANTIZATION_METHODS)
INT4_GROUP_SIZE = 128
INT4_GROUP_SIZE_GGUF = 32
PREPACKED_FORMS = ("fp32-prepacked", "bf16-prepacked")  # oneDNN, unquantized (the model's own dtype)
BF16_WEIGHTS = "fp32-bf16-weights"  # float32 arithmetic, weights held in bf16 (drafts on AVX2 CPUs)
INT8_WEIGHTS = "fp32-int8-weights"  # float32 arithmetic, weights held in int8 with a scale per row (idem)
HELD_WEIGHT_FORMS = {"bf16": BF16_WEIGHTS, "int8": INT8_WEIGHTS}  # a draft's held weights -> execution form


def check_quantization(method: str | None) -> None:
    if method is not None and method not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_METHODS)} or None, got {method!r}")


def _build(method: str, weight: torch.Tensor, bias: torch.Tensor | None, output_sizes: list[int] | None,
           *, lm_head: bool, int4_group_size: int = INT4_GROUP_SIZE) -> nn.Module:
    if method == "int8" or (method == "int4" and lm_head):
        return Int8Linear(weight, bias, output_sizes, float_output=lm_head)
    if method == "int4":
        return Int4Linear(weight, bias, output_sizes, group_size=int4_group_size, float_output=lm_head)
    if method == "fp8":
        return Fp8Linear(weight, bias, output_sizes, float_output=lm_head)
    if method in PREPACKED_FORMS:
        return PackedLinear(weight, bias, output_sizes, float_output=lm_head, prepack_too=lm_head)
    if method == BF16_WEIGHTS:
        return Bf16WeightLinear(weight, bias, output_sizes, float_output=lm_head)
    if method == INT8_WEIGHTS:
        return Int8WeightLinear(weight, bias, output_sizes, float_output=lm_head)
    raise ValueError(f"unknown execution form {method!r}")


def _swap_linears(model: LlamaForCausalLM, method: str, int4_group_size: int) -> int:
    """Replaces every Linear under `model` in place; returns how many. Only parents are listed
    up front, so each full-precision weight is freed as soon as its replacement exists (peak
    memory: the model plus one layer's quantized weights, not two models)."""
    parents = [m for m in model.modules() if any(isinstance(c, Linear) for c in m.children())]
    swapped = 0
    for parent in parents:
        for name in [n for n, c in parent.named_children() if isinstance(c, Linear)]:
            child = getattr(parent, name)
            setattr(parent, name, _build(method, child.weight.data, child.bias, child.output_sizes, lm_head=False,
                                         int4_group_size=int4_group_size))
            del child
            swapped += 1
    return swapped


class _HeadWithWeight(nn.Module):
    """The lm_head in an execution form that still exposes `.weight` (the full-precision tensor
    callers such as draft models read rows of). Only used where keeping it costs nothing: a head
    tied to the embedding."""

    def __init__(self, inner: nn.Module, weight: torch.Tensor) -> None:  # weight: [vocab_size, hidden]
        super().__init__()
        self.inner = inner
        self.weight = weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [num_rows, hidden] -> [num_rows, vocab] fp32
        return self.inner(hidden)


def _swap_lm_head(model: LlamaForCausalLM, method: str) -> None:
    weight = model.lm_head.weight
    inner = _build(method, weight.data, None, None, lm_head=True)
    # Tied: .weight is the embedding's own tensor, kept anyway. Untied: the full-precision copy
    # stays only for prepacking (which saves no memory in any case); quantization drops it.
    keep = model.arch.tie_word_embeddings or method in PREPACKED_FORMS
    model.lm_head = _HeadWithWeight(inner, weight) if keep else inner


def prepare_draft_layers(model: LlamaForCausalLM, device: torch.device, *, held: str | None = None) -> bool:
    """The fastest unquantized execution form for a draft model's decoder linears only (its
    output head is computed by the proposer, over a reduced vocabulary); held "bf16" or "int8":
    float32 arithmetic over weights held so (Bf16WeightLinear, Int8WeightLinear) instead.
    Returns whether any form was applied."""
    method = HELD_WEIGHT_FORMS[held] if held is not None else prepacked_form(model.embed_tokens.weight.dtype, device)
    if method is None:
        return False
    with torch.no_grad():
        _swap_linears(model.layers, method, INT4_GROUP_SIZE)
    model.forget_fused_decoder()  # built (if at all) for the old forms
    return True


def prepacked_form(dtype: torch.dtype, device: torch.device) -> str | None:
    """The oneDNN-prepacked execution form for an unquantized model of this dtype on this
    device, or None where it is not faster (off the CPU; bf16 without native bf16)."""
    if device.type != "cpu" or not onednn_available():
        return None
    if dtype == torch.float32:
        return "fp32-prepacked"
    if dtype == torch.bfloat16 and onednn_bf16_available():
        return "bf16-prepacked"
    return None


def prepare_for_inference(model: LlamaForCausalLM, quantization: str | None, device: torch.device, *,
                          int4_group_size: int = INT4_GROUP_SIZE) -> str | None:
    """Applies `quantization` (a QUANTIZE_AT_LOAD method, or None) to a loaded model in place,
    else the fastest unquantized execution form for its device. Afterwards the model only runs
    forward passes: its linears no longer expose `.weight` parameters. Returns the form applied
    (None: the model is unchanged)."""
    check_quantization(quantization)
    if quantization in CHECKPOINT_QUANTIZATION:
        return quantization  # the loader built the quantized layers already
    method = quantization
    if method is None:
        method = prepacked_form(model.embed_tokens.weight.dtype, device)
        if method is None:
            return None
    with torch.no_grad():
        num_linears = _swap_linears(model, method, int4_group_size)
        _swap_lm_head(model, method)
    model.forget_fused_decoder()  # built (if at all) for the old forms
    logger.info("execution form %s for %d linear layers and the lm_head", method, num_linears)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return method
