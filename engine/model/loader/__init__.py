"""Weight loading: a resolved model (GGUF file or Hugging Face folder) -> a ready model."""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine.model.arch_config import ArchConfig
from engine.model.llama import LlamaForCausalLM
from engine.model.loader.gguf_loader import load_gguf_model
from engine.model.loader.gptq_awq import checkpoint_quantization
from engine.model.loader.hf_loader import load_hf_model
from engine.model.quantization import (
    CHECKPOINT_QUANTIZATION,
    INT4_GROUP_SIZE,
    INT4_GROUP_SIZE_GGUF,
    check_quantization,
    prepare_for_inference,
)
from engine.model.resolve import ResolvedModel

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)


class LoadedModel(NamedTuple):
    """A tuple, so `model, arch = load_model(...)` works."""

    model: LlamaForCausalLM
    arch: ArchConfig


def load_model(resolved: ResolvedModel, dtype: torch.dtype, device: torch.device | str, *,
               progress: bool = True, quantization: str | None = None,
               inference_only: bool = False) -> LoadedModel:
    """Builds the model in `dtype` on `device` and fills every parameter from the checkpoint.

    quantization: a method of engine.model.quantization (int8, int4, fp8 quantize at load;
    gptq/awq name what the checkpoint holds, which is detected anyway). inference_only: the
    caller only runs forward passes, so layers may be swapped for execution forms without
    `.weight` parameters (quantized ones, or prepacked bf16 on CPU); implied by quantization.

    Raises FileNotFoundError naming a missing file (config.json, weights, a shard) and
    ValueError for an unsupported architecture, dtype or quantization, a tensor whose shape does
    not match the config (naming the tensor, both shapes) or a tensor the checkpoint lacks.
    """
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise ValueError(f"dtype must be one of {names}, got {dtype}")
    check_quantization(quantization)
    stored = checkpoint_quantization(resolved.path) if resolved.format == "hf" else None
    if stored is not None and quantization not in (None, stored):
        raise ValueError(f"quantization {quantization!r} cannot apply: checkpoint {resolved.path!r} is already "
                         f"quantized ({stored})")
    if stored is None and quantization in CHECKPOINT_QUANTIZATION:
        raise ValueError(f"quantization {quantization!r} needs a {quantization} checkpoint (quantization_config "
                         f"in config.json); {resolved.path!r} has none")
    device = torch.device(device)
    if resolved.format == "gguf":
        model, arch = load_gguf_model(resolved.path, dtype, device, progress=progress)
    elif resolved.format == "hf":
        model, arch = load_hf_model(resolved.path, dtype, device, progress=progress)
    else:
        raise ValueError(f"model format must be 'gguf' or 'hf', got {resolved.format!r}")
    model.eval()
    if inference_only or quantization is not None:
        group_size = INT4_GROUP_SIZE_GGUF if resolved.format == "gguf" else INT4_GROUP_SIZE
        prepare_for_inference(model, quantization, device, int4_group_size=group_size)
    return LoadedModel(model, arch)


__all__ = ["LoadedModel", "SUPPORTED_DTYPES", "load_model"]
