"""GPTQ and AWQ int4 checkpoints (Hugging Face folders whose config.json has a
quantization_config): their packed tensors are converted once into kernels.quant_ref's int4
format and the model is built with Int4Linear layers, never materializing full-precision weights.

Published layouts (4 bits, 8 values per int32, value j at bits 4j..4j+3):
- GPTQ (AutoGPTQ / optimum, checkpoint_format "gptq"): qweight [K // 8, N] packs along K;
  qzeros [G, N // 8] packs along N and stores zero - 1 (AutoGPTQ's historical offset;
  "gptq_v2" stores the zero itself); scales [G, N]; g_idx [K] the group of each input channel.
  w[n, k] = (q - zero) * scale. Act-order checkpoints (desc_act, a g_idx that is not
  k // group_size) are refused: their groups are not contiguous runs of k.
- AWQ (AutoAWQ, version "gemm"): qweight [K, N // 8] and qzeros [G, N // 8] pack along N in the
  interleaved order 0, 2, 4, 6, 1, 3, 5, 7 (value j of a word is column 8c + order[j]);
  scales [G, N]; w[n, k] = (q - zero) * scale.
An integer zero z becomes the float zero (8 - z) * scale of our (q - 8) * scale + zero form.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch
from safetensors import safe_open
from tqdm import tqdm

from engine.model.arch_config import ArchConfig
from engine.model.layers.linear import Linear
from engine.model.layers.quant_linear import Int4Linear
from engine.model.layers.rotary import RotaryEmbedding
from engine.model.llama import LlamaForCausalLM
from kernels.quant_ref import INT4_GROUP_SIZES, pack_int4

logger = logging.getLogger(__name__)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # value j of a packed word holds column 8c + AWQ_ORDER[j]
_SHARDS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",),
           "gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


def checkpoint_quantization(folder: str) -> str | None:
    """"gptq" or "awq" for such a checkpoint folder, None for an unquantized one; ValueError for
    a quantization_config this loader cannot read (naming the field)."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return None  # the loader reports the missing config.json itself
    with open(path, encoding="utf-8") as f:
        try:
            config = json.load(f)
        except json.JSONDecodeError:
            return None
    qc = config.get("quantization_config")
    if not qc:
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method not in ("gptq", "awq"):
        raise ValueError(f"{path}: quantization_config.quant_method {method!r} is not supported (gptq, awq)")
    if qc.get("bits", 4) != 4:
        raise ValueError(f"{path}: quantization_config.bits must be 4, got {qc.get('bits')}")
    if method == "gptq" and qc.get("checkpoint_format", "gptq") not in ("gptq", "gptq_v2"):
        raise ValueError(f"{path}: quantization_config.checkpoint_format {qc.get('checkpoint_format')!r} "
                         "is not supported (gptq, gptq_v2)")
    if method == "awq" and str(qc.get("version", "gemm")).lower() != "gemm":
        raise ValueError(f"{path}: quantization_config.version {qc.get('version')!r} is not supported (gemm)")
    if method == "awq" and qc.get("zero_point", True) is False:
        raise ValueError(f"{path}: quantization_config.zero_point false (symmetric AWQ) is not supported")
    return method


def unpack_int32(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """int32 words of 8 nibbles (value j at bits 4j..4j+3) -> uint8 values, 8x longer along dim."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    values = (packed.unsqueeze(-1) >> shifts) & 0xF  # [..., 8]
    if dim == 0:
        values = values.permute(0, 2, 1) if packed.dim() == 2 else values
        return values.reshape(packed.shape[0] * 8, *packed.shape[1:]).to(torch.uint8)
    return values.reshape(*packed.shape[:-1], packed.shape[-1] * 8).to(torch.uint8)


def gptq_to_int4(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None,
                 group_size: int, *, zero_offset: int, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPTQ tensors -> (qweight [N, K // 2] uint8, scales [N, G], zeros [N, G]) of kernels.quant_ref."""
    q = unpack_int32(qweight, dim=0)  # [K, N]
    input_size, num_out = q.shape
    if g_idx is not None:
        contiguous = torch.arange(input_size, dtype=torch.int64) // group_size
        if not torch.equal(g_idx.to(torch.int64).cpu(), contiguous):
            raise ValueError(f"{name}.g_idx is not k // group_size: act-order (desc_act) GPTQ checkpoints are "
                             "not supported")
    zeros_int = unpack_int32(qzeros, dim=1)[:, :num_out].float() + zero_offset  # [G, N]
    return _to_canonical(q.t(), zeros_int, scales)


def awq_to_int4(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AWQ (gemm) tensors -> (qweight [N, K // 2] uint8, scales [N, G], zeros [N, G])."""
    q = _awq_columns(unpack_int32(qweight, dim=1))  # [K, N]
    zeros_int = _awq_columns(unpack_int32(qzeros, dim=1)).float()  # [G, N]
    return _to_canonical(q.t(), zeros_int, scales)


def _awq_columns(values: torch.Tensor) -> torch.Tensor:  # [R, N] in packed order -> [R, N] in column order
    rows, num_out = values.shape
    words = values.reshape(rows, num_out // 8, 8)
    # Nibble j holds column AWQ_ORDER[j]: scatter them back to their columns.
    inverse = [AWQ_ORDER.index(c) for c in range(8)]
    return words[:, :, inverse].reshape(rows, num_out)


def _to_canonical(q: torch.Tensor, zeros_int: torch.Tensor, scales: torch.Tensor):
    # q: [N, K] 0..15; zeros_int, scales: [G, N]
    s = scales.float().t().contiguous()  # [N, G]
    zeros = (8.0 - zeros_int.t()) * s
    return pack_int4(q.contiguous()), s, zeros.contiguous()


def regroup(scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
            input_size: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Groups wider than 128 (or per-channel, group_size -1 = K) repeated into the largest
    supported group size dividing them: the kernels' K tiles never straddle a group."""
    if group_size in INT4_GROUP_SIZES:
        return scales, zeros, group_size
    for size in INT4_GROUP_SIZES:
        if group_size % size == 0 and input_size % size == 0:
            repeat = group_size // size
            return scales.repeat_interleave(repeat, dim=1), zeros.repeat_interleave(repeat, dim=1), size
    raise ValueError(f"int4 group_size {group_size} is not a multiple of any supported group size {INT4_GROUP_SIZES}")


class _Checkpoint:
    """Tensor lookup across the safetensors shards of a folder."""

    def __init__(self, files: dict[str, list[str]]) -> None:
        self.where = {name: path for path, names in files.items() for name in names}
        self._open: dict[str, Any] = {}

    def has(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str) -> torch.Tensor:
        if name not in self.where:
            raise ValueError(f"quantized checkpoint is missing tensor {name!r}")
        path = self.where[name]
        if path not in self._open:
            self._open[path] = safe_open(path, framework="pt")
        return self._open[path].get_tensor(name)


def load_gptq_awq_model(folder: str, config: dict[str, Any], files: dict[str, list[str]], arch: ArchConfig,
                        dtype: torch.dtype, device: torch.device, *,
                        progress: bool = True) -> tuple[LlamaForCausalLM, ArchConfig]:
    """Builds the model on the meta device, swaps each Linear for an Int4Linear filled from the
    packed tensors, then materializes and fills the remaining (full-precision) parameters."""
    method = checkpoint_quantization(folder)
    qc = config["quantization_config"]
    ckpt = _Checkpoint(files)
    model = LlamaForCausalLM(arch, dtype=dtype, device="meta")
    linears = [(module, name, child) for module in model.modules() for name, child in module.named_children()
               if isinstance(child, Linear)]
    prefix_of = {id(child): qualified for qualified, child in model.named_modules()}
    for module, name, linear in tqdm(linears, desc=f"loading {os.path.basename(folder.rstrip('/'))} ({method})",
                                     unit="layer", disable=not progress):
        qualified = prefix_of[id(linear)]  # e.g. layers.3.self_attn.qkv_proj
        parent = "model." + qualified.rsplit(".", 1)[0]
        parts, biases = [], []
        for shard in _SHARDS[name]:
            base = f"{parent}.{shard}"
            parts.append(_read_int4(ckpt, base, method, qc, linear.input_size))
            if linear.bias is not None:
                biases.append(ckpt.get(f"{base}.bias"))
        group_size = parts[0][3]
        qweight = torch.cat([p[0] for p in parts]).to(device)
        scales = torch.cat([p[1] for p in parts]).to(device)
        zeros = torch.cat([p[2] for p in parts]).to(device)
        if qweight.shape[0] != linear.output_size:
            raise ValueError(f"{parent}.{_SHARDS[name][0]}: packed weights give {qweight.shape[0]} outputs, the "
                             f"config expects {linear.output_size}")
        scales, zeros, group_size = regroup(scales, zeros, group_size, linear.input_size)
        bias = torch.cat(biases).to(device=device, dtype=dtype) if biases else None
        setattr(module, name, Int4Linear(None, bias, linear.output_sizes, group_size=group_size,
                                         quantized=(qweight, scales, zeros),
                                         input_size=linear.input_size))
    _materialize(model, arch, dtype, device, ckpt)
    return model, arch


def _read_int4(ckpt: _Checkpoint, base: str, method: str | None, qc: dict[str, Any], input_size: int):
    group_size = int(qc.get("group_size", 128))
    if group_size == -1:
        group_size = input_size
    qweight, qzeros, scales = ckpt.get(f"{base}.qweight"), ckpt.get(f"{base}.qzeros"), ckpt.get(f"{base}.scales")
    if method == "gptq":
        g_idx = ckpt.get(f"{base}.g_idx") if ckpt.has(f"{base}.g_idx") else None
        offset = 1 if qc.get("checkpoint_format", "gptq") == "gptq" else 0
        q, s, z = gptq_to_int4(qweight, qzeros, scales, g_idx, group_size, zero_offset=offset, name=base)
    else:
        q, s, z = awq_to_int4(qweight, qzeros, scales)
    if q.shape[1] * 2 != input_size:
        raise ValueError(f"{base}.qweight holds {q.shape[1] * 2} input channels, the config expects {input_size}")
    return q, s, z, group_size


def _materialize(model: LlamaForCausalLM, arch: ArchConfig, dtype: torch.dtype, device: torch.device,
                 ckpt: _Checkpoint) -> None:
    """Every parameter still on the meta device (embedding, norms, lm_head) is allocated on
    `device` and read from the checkpoint; the RoPE table is rebuilt there."""
    for qualified, module in list(model.named_modules()):
        for pname, param in list(module.named_parameters(recurse=False)):
            if not param.is_meta:
                continue
            ours = f"{qualified}.{pname}" if qualified else pname
            name = ours if ours.startswith("lm_head.") else f"model.{ours}"
            if ours == "lm_head.weight" and arch.tie_word_embeddings:
                continue
            tensor = ckpt.get(name)
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(f"tensor {name!r} has shape {list(tensor.shape)}, expected {list(param.shape)}")
            setattr(module, pname, torch.nn.Parameter(tensor.to(device=device, dtype=dtype), requires_grad=False))
    if arch.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    rotary = model.rotary
    model.rotary = RotaryEmbedding(arch.head_dim, arch.rope_theta, arch.rope_scaling, arch.max_position_embeddings,
                                   max_positions=rotary.max_positions, device=device)
