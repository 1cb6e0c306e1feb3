"""Copies checkpoint tensors, named as in Hugging Face checkpoints, into the model's parameters.

Both loaders speak Hugging Face names (the GGUF loader translates llama.cpp's names first), so
fusing q/k/v and gate/up, shape checks, dtype casts and the missing-tensor check live here once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model.layers.linear import Linear
from engine.model.llama import LlamaForCausalLM


@dataclass(frozen=True)
class _Target:
    param: torch.Tensor  # the whole parameter, or the rows one shard of a fused weight owns
    description: str  # our parameter name (and shard rows) for messages


class WeightPlacer:
    """Maps every checkpoint tensor name the model needs to the parameter (rows) it fills.

    place() checks the shape, casts to the parameter's dtype and copies onto its device;
    missing() lists the names never placed, so a truncated checkpoint fails loudly instead of
    running on uninitialized memory.
    """

    def __init__(self, model: LlamaForCausalLM) -> None:
        self._targets: dict[str, _Target] = {}
        self._placed: set[str] = set()
        arch = model.arch
        self._add("model.embed_tokens.weight", model.embed_tokens.weight, "embed_tokens.weight")
        self._add("model.norm.weight", model.norm.weight, "norm.weight")
        if not arch.tie_word_embeddings:
            self._add("lm_head.weight", model.lm_head.weight, "lm_head.weight")
        for i, layer in enumerate(model.layers):
            prefix = f"model.layers.{i}."
            ours = f"layers.{i}."
            self._add(prefix + "input_layernorm.weight", layer.input_layernorm.weight,
                      ours + "input_layernorm.weight")
            self._add(prefix + "post_attention_layernorm.weight", layer.post_attention_layernorm.weight,
                      ours + "post_attention_layernorm.weight")
            attn = layer.self_attn
            self._add_linear(prefix + "self_attn.", ["q_proj", "k_proj", "v_proj"], attn.qkv_proj,
                             ours + "self_attn.qkv_proj")
            self._add_linear(prefix + "self_attn.", ["o_proj"], attn.o_proj, ours + "self_attn.o_proj")
            if attn.q_norm is not None and attn.k_norm is not None:
                self._add(prefix + "self_attn.q_norm.weight", attn.q_norm.weight, ours + "self_attn.q_norm.weight")
                self._add(prefix + "self_attn.k_norm.weight", attn.k_norm.weight, ours + "self_attn.k_norm.weight")
            self._add_linear(prefix + "mlp.", ["gate_proj", "up_proj"], layer.mlp.gate_up_proj,
                             ours + "mlp.gate_up_proj")
            self._add_linear(prefix + "mlp.", ["down_proj"], layer.mlp.down_proj, ours + "mlp.down_proj")

    def _add(self, name: str, param: torch.Tensor, description: str) -> None:
        self._targets[name] = _Target(param, description)

    def _add_linear(self, prefix: str, shard_names: list[str], linear: Linear, ours: str) -> None:
        for shard, shard_name in enumerate(shard_names):
            rows = linear.shard_rows(shard)
            fused = len(shard_names) > 1
            where = f"{ours}.weight[{rows.start}:{rows.stop}]" if fused else f"{ours}.weight"
            self._add(f"{prefix}{shard_name}.weight", linear.weight[rows], where)
            if linear.bias is not None:
                where = f"{ours}.bias[{rows.start}:{rows.stop}]" if fused else f"{ours}.bias"
                self._add(f"{prefix}{shard_name}.bias", linear.bias[rows], where)

    @property
    def expected_names(self) -> list[str]:
        return list(self._targets)

    def expects(self, name: str) -> bool:
        return name in self._targets

    def expected_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._targets[name].param.shape)

    def check_shape(self, name: str, shape: tuple[int, ...], *, source: str) -> None:
        expected = self.expected_shape(name)
        if tuple(shape) != expected:
            raise ValueError(f"tensor {source} has shape {list(shape)}, expected {list(expected)} "
                             f"(for {self._targets[name].description}); the checkpoint does not match its config")

    def place(self, name: str, tensor: torch.Tensor, *, source: str) -> None:
        """tensor: the checkpoint tensor in any float dtype, on any device. source: how error
        messages name it (the checkpoint's own name and file)."""
        self.check_shape(name, tuple(tensor.shape), source=source)
        # copy_ casts and moves in one pass; the target may be a row slice of a fused weight.
        self._targets[name].param.copy_(tensor)
        self._placed.add(name)

    def adopt(self, name: str, tensor: torch.Tensor, *, source: str) -> None:
        """Makes the parameter share `tensor`'s storage instead of copying it (a draft model
        using its target's embedding). Same shape, dtype and device required."""
        self.check_shape(name, tuple(tensor.shape), source=source)
        param = self._targets[name].param
        if tensor.dtype != param.dtype or tensor.device != param.device:
            raise ValueError(f"{source} is {tensor.dtype} on {tensor.device}, the model is {param.dtype} on {param.device}")
        param.data = tensor
        self._placed.add(name)

    def missing(self) -> list[str]:
        return [name for name in self._targets if name not in self._placed]
