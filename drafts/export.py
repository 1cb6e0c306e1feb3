"""Draft folder format: write a trained draft as a Hugging Face Llama folder, and read one back.

A draft folder holds:
- config.json: the usual Hugging Face fields of the draft's architecture plus
  "draftgate": {"target": <target name>, "shared_embedding": bool, "draft_vocab_size": Vd | null};
- model.safetensors: Hugging Face tensor names (model.layers.N.self_attn.q_proj.weight, ...,
  model.norm.weight); model.embed_tokens.weight and lm_head.weight only when the embedding is
  not shared (lm_head omitted when tied);
- draft_vocab.safetensors (reduced vocabulary only): "draft_vocab_ids" int64 [Vd], sorted target
  token ids; the draft's logits are over those tokens only.

With a shared embedding the engine takes the target's embedding for the input and the
target's output head for the output (all rows, or the draft_vocab_ids rows). A draft that does
not share writes its own embedding and a full-vocabulary lm_head; with a reduced vocabulary
the rows outside it are zero, so the file loads as a plain checkpoint and the draft_vocab_ids
rows are the trained ones.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from engine.model.arch_config import ArchConfig
from engine.model.loader.hf_loader import read_hf_config

from drafts.checkpoint import DraftMeta
from drafts.model import TrainableLlama
from drafts.target import Target, set_parameter

WEIGHTS_FILE = "model.safetensors"
DRAFT_VOCAB_FILE = "draft_vocab.safetensors"
DRAFT_VOCAB_TENSOR = "draft_vocab_ids"
_MODEL_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                "Qwen3ForCausalLM": "qwen3"}
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def hf_config(arch: ArchConfig, dtype: torch.dtype) -> dict[str, Any]:
    """config.json fields for `arch` that ArchConfig.from_hf_config reads back to the same arch."""
    config: dict[str, Any] = {
        "architectures": [arch.architecture],
        "model_type": _MODEL_TYPES[arch.architecture],
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": arch.num_hidden_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim,
        "hidden_act": arch.hidden_act,
        "rms_norm_eps": arch.rms_norm_eps,
        "rope_theta": arch.rope_theta,
        "rope_scaling": arch.rope_scaling,
        "max_position_embeddings": arch.max_position_embeddings,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "attention_bias": arch.attention_bias and arch.attention_output_bias,
        "mlp_bias": arch.mlp_bias,
        "bos_token_id": arch.bos_token_id,
        "eos_token_id": list(arch.eos_token_ids) if len(arch.eos_token_ids) != 1 else arch.eos_token_ids[0],
        "torch_dtype": _DTYPE_NAMES[dtype],
    }
    if arch.rope_scaling is not None and arch.rope_scaling.get("rope_type") == "freq_factors":
        raise ValueError("a draft of a GGUF target with rope_freqs factors cannot be written as a Hugging Face "
                         "config (no rope_scaling type expresses them)")
    if arch.sliding_window is not None:
        config["sliding_window"] = arch.sliding_window
        if arch.architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
            config["use_sliding_window"] = True
            config["layer_types"] = list(arch.layer_types) if arch.layer_types else None
    return config


def hf_state_dict(draft: TrainableLlama, *, include_embedding: bool, include_head: bool,
                  dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Hugging Face names and unfused q/k/v and gate/up tensors, cast to dtype. The head is
    written over the full vocabulary (rows outside a reduced vocabulary are zero)."""
    arch = draft.arch
    out: dict[str, torch.Tensor] = {}

    def put(name: str, tensor: torch.Tensor) -> None:
        out[name] = tensor.detach().to(device="cpu", dtype=dtype).contiguous()

    for i, layer in enumerate(draft.layers):
        prefix = f"model.layers.{i}."
        put(prefix + "input_layernorm.weight", layer.input_layernorm.weight)
        put(prefix + "post_attention_layernorm.weight", layer.post_attention_layernorm.weight)
        attn = layer.self_attn
        for shard, name in enumerate(("q_proj", "k_proj", "v_proj")):
            rows = attn.qkv_proj.shard_rows(shard)
            put(f"{prefix}self_attn.{name}.weight", attn.qkv_proj.weight[rows])
            if attn.qkv_proj.bias is not None:
                put(f"{prefix}self_attn.{name}.bias", attn.qkv_proj.bias[rows])
        put(prefix + "self_attn.o_proj.weight", attn.o_proj.weight)
        if attn.o_proj.bias is not None:
            put(prefix + "self_attn.o_proj.bias", attn.o_proj.bias)
        if attn.q_norm is not None and attn.k_norm is not None:
            put(prefix + "self_attn.q_norm.weight", attn.q_norm.weight)
            put(prefix + "self_attn.k_norm.weight", attn.k_norm.weight)
        mlp = layer.mlp
        for shard, name in enumerate(("gate_proj", "up_proj")):
            rows = mlp.gate_up_proj.shard_rows(shard)
            put(f"{prefix}mlp.{name}.weight", mlp.gate_up_proj.weight[rows])
            if mlp.gate_up_proj.bias is not None:
                put(f"{prefix}mlp.{name}.bias", mlp.gate_up_proj.bias[rows])
        put(prefix + "mlp.down_proj.weight", mlp.down_proj.weight)
        if mlp.down_proj.bias is not None:
            put(prefix + "mlp.down_proj.bias", mlp.down_proj.bias)
    put("model.norm.weight", draft.norm.weight)
    if include_embedding:
        put("model.embed_tokens.weight", draft.embed_tokens.weight)
    if include_head:
        head = draft.lm_head.weight.detach()
        if draft.vocab_ids is not None:
            full = torch.zeros(arch.vocab_size, head.shape[1], dtype=head.dtype, device=head.device)
            head = full.index_copy(0, draft.vocab_ids.to(head.device), head)
        put("lm_head.weight", head)
    return out


def export_draft(draft: TrainableLlama, folder: str, *, target_name: str, shared_embedding: bool,
                 dtype: torch.dtype = torch.bfloat16) -> None:
    """Writes the draft folder. shared_embedding False with a draft that borrows the target's
    embedding writes a standalone copy (its own embedding and head)."""
    arch = draft.arch
    include_head = False
    if not shared_embedding:
        # A tied head cannot keep its own reduced rows: such a draft is written untied.
        include_head = not arch.tie_word_embeddings or draft.vocab_ids is not None
        arch = replace(arch, tie_word_embeddings=not include_head)
    os.makedirs(folder, exist_ok=True)
    tensors = hf_state_dict(draft, include_embedding=not shared_embedding, include_head=include_head, dtype=dtype)
    config = hf_config(arch, dtype)
    config["draftgate"] = {
        "target": target_name,
        "shared_embedding": shared_embedding,
        "draft_vocab_size": None if draft.vocab_ids is None else int(draft.vocab_ids.numel()),
    }
    fc = getattr(draft, "fc", None)
    if fc is not None:  # an EAGLE head (drafts/eagle.py): its input projection, and its kind
        tensors["fc.weight"] = fc.weight.detach().to(device="cpu", dtype=dtype).contiguous()
        config["draftgate"]["kind"] = "eagle"
    save_file(tensors, os.path.join(folder, WEIGHTS_FILE), metadata={"format": "pt"})
    vocab_path = os.path.join(folder, DRAFT_VOCAB_FILE)
    if draft.vocab_ids is not None:
        save_file({DRAFT_VOCAB_TENSOR: draft.vocab_ids.detach().cpu().to(torch.int64).contiguous()}, vocab_path)
    elif os.path.exists(vocab_path):
        os.remove(vocab_path)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def read_draft_folder(folder: str) -> tuple[ArchConfig, dict[str, Any], dict[str, torch.Tensor], torch.Tensor | None]:
    """(arch, draftgate block, HF-named tensors, draft vocab ids or None). Raises
    FileNotFoundError / ValueError naming the file."""
    config = read_hf_config(folder)
    block = config.get("draftgate")
    if not isinstance(block, dict) or "shared_embedding" not in block:
        raise ValueError(f"{os.path.join(folder, 'config.json')} has no \"draftgate\" block: not a draft folder")
    weights = os.path.join(folder, WEIGHTS_FILE)
    if not os.path.isfile(weights):
        raise FileNotFoundError(f"draft folder {folder!r} has no {WEIGHTS_FILE}")
    vocab_ids = None
    vocab_path = os.path.join(folder, DRAFT_VOCAB_FILE)
    if os.path.isfile(vocab_path):
        vocab_ids = load_file(vocab_path)[DRAFT_VOCAB_TENSOR].to(torch.int64)
    if (vocab_ids is None) != (block.get("draft_vocab_size") is None):
        raise ValueError(f"{folder!r}: draft_vocab_size in config.json and {DRAFT_VOCAB_FILE} disagree")
    return ArchConfig.from_hf_config(config), block, load_file(weights), vocab_ids


def load_draft(folder: str, target: Target) -> tuple[TrainableLlama, DraftMeta]:
    """A draft folder as a TrainableLlama on the target's device in float32 (for evaluation or
    further training), with the target's embedding and head rows when it shares them."""
    arch, block, tensors, vocab_ids = read_draft_folder(folder)
    if arch.vocab_size != target.arch.vocab_size:
        raise ValueError(f"draft {folder!r} has a vocabulary of {arch.vocab_size}, its target {target.arch.vocab_size}")
    device = target.device
    shared = bool(block["shared_embedding"])
    draft = TrainableLlama(arch, vocab_ids=vocab_ids, dtype=torch.float32, device=device)
    params = dict(draft.named_parameters())
    with torch.no_grad():
        for i, layer in enumerate(draft.layers):
            prefix = f"model.layers.{i}."
            attn, mlp = layer.self_attn, layer.mlp
            _fill_fused(attn.qkv_proj, tensors, prefix + "self_attn.", ("q_proj", "k_proj", "v_proj"))
            _fill_fused(attn.o_proj, tensors, prefix + "self_attn.", ("o_proj",))
            _fill_fused(mlp.gate_up_proj, tensors, prefix + "mlp.", ("gate_proj", "up_proj"))
            _fill_fused(mlp.down_proj, tensors, prefix + "mlp.", ("down_proj",))
            layer.input_layernorm.weight.copy_(_need(tensors, prefix + "input_layernorm.weight"))
            layer.post_attention_layernorm.weight.copy_(_need(tensors, prefix + "post_attention_layernorm.weight"))
            if attn.q_norm is not None and attn.k_norm is not None:
                attn.q_norm.weight.copy_(_need(tensors, prefix + "self_attn.q_norm.weight"))
                attn.k_norm.weight.copy_(_need(tensors, prefix + "self_attn.k_norm.weight"))
        draft.norm.weight.copy_(_need(tensors, "model.norm.weight"))
        if shared:
            set_parameter(draft, "embed_tokens.weight", target.engine_model.embed_tokens.weight)
            head = target.engine_model.lm_head.weight
            rows = head if vocab_ids is None else head.index_select(0, vocab_ids.to(head.device))
            set_parameter(draft, "lm_head.weight", rows)
        else:
            params["embed_tokens.weight"].copy_(_need(tensors, "model.embed_tokens.weight"))
            head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])
            rows = head if vocab_ids is None else head.index_select(0, vocab_ids)
            draft.lm_head.weight.copy_(rows)
    meta = DraftMeta(target=str(block.get("target")), arch=arch, shared_embedding=shared,
                     layer_ids=list(range(arch.num_hidden_layers)), vocab_ids=vocab_ids, init_source=folder)
    return draft.eval(), meta


def _need(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in tensors:
        raise ValueError(f"draft weights lack tensor {name!r}")
    return tensors[name]


def _fill_fused(linear: torch.nn.Module, tensors: dict[str, torch.Tensor], prefix: str, names: tuple[str, ...]) -> None:
    for shard, name in enumerate(names):
        rows = linear.shard_rows(shard)
        linear.weight[rows].copy_(_need(tensors, f"{prefix}{name}.weight"))
        if linear.bias is not None:
            linear.bias[rows].copy_(_need(tensors, f"{prefix}{name}.bias"))
