"""Weight loading: a resolved model (GGUF file or Hugging Face folder) -> a ready model."""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine.model.arch_config import ArchConfig
from engine.model.llama import LlamaForCausalLM
from engine.model.loader.gguf_loader import load_gguf_model
from engine.model.loader.hf_loader import load_hf_model
from engine.model.resolve import ResolvedModel

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)


class LoadedModel(NamedTuple):
    """A tuple, so `model, arch = load_model(...)` works."""

    model: LlamaForCausalLM
    arch: ArchConfig


def load_model(resolved: ResolvedModel, dtype: torch.dtype, device: torch.device | str, *,
               progress: bool = True) -> LoadedModel:
    """Builds the model in `dtype` on `device` and fills every parameter from the checkpoint.

    Raises FileNotFoundError naming a missing file (config.json, weights, a shard) and
    ValueError for an unsupported architecture or dtype, a tensor whose shape does not match
    the config (naming the tensor, both shapes) or a tensor the checkpoint lacks.
    """
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise ValueError(f"dtype must be one of {names}, got {dtype}")
    device = torch.device(device)
    if resolved.format == "gguf":
        model, arch = load_gguf_model(resolved.path, dtype, device, progress=progress)
    elif resolved.format == "hf":
        model, arch = load_hf_model(resolved.path, dtype, device, progress=progress)
    else:
        raise ValueError(f"model format must be 'gguf' or 'hf', got {resolved.format!r}")
    model.eval()
    return LoadedModel(model, arch)


__all__ = ["LoadedModel", "SUPPORTED_DTYPES", "load_model"]
