"""Loads a Hugging Face checkpoint folder: config.json plus safetensors (single or sharded)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import replace

import torch
from safetensors import safe_open
from tqdm import tqdm

from engine.model.arch_config import ArchConfig
from engine.model.llama import LlamaForCausalLM
from engine.model.loader.gptq_awq import load_gptq_awq_model
from engine.model.loader.weight_placer import WeightPlacer

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def read_hf_config(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model folder {folder!r} has no config.json")
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None


def safetensors_files(folder: str) -> dict[str, list[str]]:
    """{file path: tensor names in it}, from the shard index when there is one."""
    index_path = os.path.join(folder, INDEX_FILE)
    if os.path.isfile(index_path):
        with open(index_path, encoding="utf-8") as f:
            weight_map: dict[str, str] = json.load(f).get("weight_map", {})
        if not weight_map:
            raise ValueError(f"{index_path} has no weight_map")
        files: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            files.setdefault(os.path.join(folder, shard), []).append(name)
        for path in files:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"weights shard {os.path.basename(path)!r} listed in {INDEX_FILE} "
                                        f"is missing from {folder!r}")
        return files
    single = os.path.join(folder, SINGLE_FILE)
    if os.path.isfile(single):
        with safe_open(single, framework="pt") as f:
            return {single: list(f.keys())}
    raise FileNotFoundError(f"model folder {folder!r} has neither {SINGLE_FILE} nor {INDEX_FILE} "
                            "(only safetensors checkpoints are supported)")


def load_hf_model(folder: str, dtype: torch.dtype, device: torch.device, *,
                  progress: bool = True, provided: Mapping[str, torch.Tensor] | None = None,
                  ) -> tuple[LlamaForCausalLM, ArchConfig]:
    """provided: tensors by checkpoint name that the model shares instead of reading them (a
    draft model's embedding taken from its target)."""
    config = read_hf_config(folder)
    arch = ArchConfig.from_hf_config(config)
    files = safetensors_files(folder)
    has_lm_head = any("lm_head.weight" in names for names in files.values())
    if not arch.tie_word_embeddings and not has_lm_head:
        # Checkpoints of tied models often omit lm_head without saying so in config.json.
        arch = replace(arch, tie_word_embeddings=True)
    if config.get("quantization_config"):  # GPTQ / AWQ int4 checkpoints
        return load_gptq_awq_model(folder, config, files, arch, dtype, device, progress=progress)
    model = LlamaForCausalLM(arch, dtype=dtype, device=device)
    placer = WeightPlacer(model)
    for name, tensor in (provided or {}).items():
        placer.adopt(name, tensor, source=f"provided {name!r}")
    total = sum(len(names) for names in files.values())
    ignored: list[str] = []
    with tqdm(total=total, desc=f"loading {os.path.basename(folder.rstrip('/'))}", unit="tensor",
              disable=not progress) as bar:
        for path, names in files.items():
            with safe_open(path, framework="pt") as f:
                available = set(f.keys())
                for name in names:
                    bar.update(1)
                    if not placer.expects(name):
                        ignored.append(name)
                        continue
                    if name not in available:
                        raise ValueError(f"tensor {name!r} is listed in {INDEX_FILE} but missing from "
                                         f"{os.path.basename(path)!r}")
                    placer.place(name, f.get_tensor(name), source=f"{name!r} in {os.path.basename(path)!r}")
    missing = placer.missing()
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"checkpoint {folder!r} is missing tensor {missing[0]!r}{more}")
    if ignored:
        logger.info("ignored %d checkpoint tensors the model does not use, e.g. %s", len(ignored), ignored[0])
    return model, arch
