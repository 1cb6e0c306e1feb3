"""The target model, loaded once through the engine's own loader, and its teacher view.

The target is whatever `--model` names for the engine: the embedded GGUF (None), a GGUF file or
a Hugging Face folder. Loading through engine.model.loader means the teacher's weights are the
weights the engine serves (for the embedded model: the Q4_1 GGUF dequantized), so the draft
learns the distribution it will be verified against.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.model.arch_config import ArchConfig
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import load_model
from engine.model.resolve import ResolvedModel, resolve_model
from engine.model.tokenizer import TokenizerBase, load_tokenizer

from drafts.model import TrainableLlama


@dataclass
class Target:
    resolved: ResolvedModel
    engine_model: LlamaForCausalLM  # frozen, in its load dtype on its device
    arch: ArchConfig
    tokenizer: TokenizerBase

    @property
    def name(self) -> str:
        return self.resolved.name

    @property
    def device(self) -> torch.device:
        return self.engine_model.embed_tokens.weight.device


def pick_device(device: str) -> torch.device:
    """"auto" -> cuda when available, else cpu; anything else as torch spells it."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    return torch.device(device)


def load_target(model: str | None, *, device: torch.device, dtype: torch.dtype = torch.float32,
                progress: bool = True) -> Target:
    """model: None for the embedded SmolLM2-135M-Instruct, else a GGUF file or HF folder."""
    resolved = resolve_model(model)
    engine_model, arch = load_model(resolved, dtype, device, progress=progress)
    for param in engine_model.parameters():
        param.requires_grad_(False)
    return Target(resolved, engine_model, arch, load_tokenizer(resolved))


def wrap_engine_model(engine_model: LlamaForCausalLM) -> TrainableLlama:
    """A TrainableLlama over the engine model's own tensors (no copy): the teacher.

    Built on the meta device, then every parameter is replaced by the engine's; the RoPE table
    is the engine's too. Everything stays frozen.
    """
    arch = engine_model.arch
    teacher = TrainableLlama(arch, dtype=engine_model.embed_tokens.weight.dtype, device="meta")
    engine_params = dict(engine_model.named_parameters(remove_duplicate=False))
    for name, _ in list(teacher.named_parameters(remove_duplicate=False)):
        source = engine_params.get(name)
        if source is None:
            raise ValueError(f"engine model has no parameter {name!r} to wrap")
        set_parameter(teacher, name, source)
    teacher.rotary = engine_model.rotary
    teacher.eval()
    return teacher


def draft_arch(target_arch: ArchConfig, num_layers: int, layer_ids: list[int] | None = None) -> ArchConfig:
    """The target's architecture cut to `num_layers` layers (per-layer window types follow
    the chosen target layers)."""
    layer_types = None
    if target_arch.layer_types is not None:
        ids = layer_ids if layer_ids is not None else list(range(num_layers))
        layer_types = tuple(target_arch.layer_types[i] for i in ids)
    return replace(target_arch, num_hidden_layers=num_layers, layer_types=layer_types)


def set_parameter(module: torch.nn.Module, dotted: str, value: torch.Tensor) -> None:
    """Replaces the parameter at a dotted path by `value` itself (shared storage, no copy);
    a plain tensor becomes a frozen Parameter."""
    *path, leaf = dotted.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part)
    if not isinstance(value, torch.nn.Parameter):
        value = torch.nn.Parameter(value, requires_grad=False)
    setattr(owner, leaf, value)
