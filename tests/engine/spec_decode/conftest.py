"""A cheap draft for the embedded model, in the shipped draft folder format: two of the target's
own layers (the first and the last), the target's embedding borrowed (shared_embedding) and a
reduced output vocabulary. Good enough to be accepted sometimes, cheap enough for fast tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.model.loader import load_model
from engine.model.resolve import resolve_model

DRAFT_LAYERS = (0, 29)
DRAFT_VOCAB = 8192


@pytest.fixture(scope="session")
def small_draft(tmp_path_factory: pytest.TempPathFactory) -> str:
    target, arch = load_model(resolve_model(None), dtype=torch.float32, device="cpu", progress=False)
    folder = tmp_path_factory.mktemp("draft")
    tensors: dict[str, torch.Tensor] = {"model.norm.weight": target.norm.weight.detach().clone()}
    q_size = arch.num_attention_heads * arch.head_dim
    kv_size = arch.num_key_value_heads * arch.head_dim
    for new_index, layer_index in enumerate(DRAFT_LAYERS):
        layer = target.layers[layer_index]
        prefix = f"model.layers.{new_index}."
        qkv = layer.self_attn.qkv_proj.weight.detach()
        tensors[prefix + "self_attn.q_proj.weight"] = qkv[:q_size].clone()
        tensors[prefix + "self_attn.k_proj.weight"] = qkv[q_size : q_size + kv_size].clone()
        tensors[prefix + "self_attn.v_proj.weight"] = qkv[q_size + kv_size :].clone()
        tensors[prefix + "self_attn.o_proj.weight"] = layer.self_attn.o_proj.weight.detach().clone()
        gate_up = layer.mlp.gate_up_proj.weight.detach()
        tensors[prefix + "mlp.gate_proj.weight"] = gate_up[: arch.intermediate_size].clone()
        tensors[prefix + "mlp.up_proj.weight"] = gate_up[arch.intermediate_size :].clone()
        tensors[prefix + "mlp.down_proj.weight"] = layer.mlp.down_proj.weight.detach().clone()
        tensors[prefix + "input_layernorm.weight"] = layer.input_layernorm.weight.detach().clone()
        tensors[prefix + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight.detach().clone()
    save_file(tensors, str(folder / "model.safetensors"))
    save_file({"draft_vocab_ids": torch.arange(DRAFT_VOCAB, dtype=torch.int64)}, str(folder / "draft_vocab.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": arch.hidden_size, "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": len(DRAFT_LAYERS), "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads, "vocab_size": arch.vocab_size,
        "rms_norm_eps": arch.rms_norm_eps, "rope_theta": arch.rope_theta,
        "max_position_embeddings": arch.max_position_embeddings, "tie_word_embeddings": True,
        "hidden_act": "silu",
        "draftgate": {"target": "SmolLM2-135M-Instruct", "shared_embedding": True, "draft_vocab_size": DRAFT_VOCAB},
    }
    (folder / "config.json").write_text(json.dumps(config))
    return str(Path(folder))


@pytest.fixture(scope="session")
def eagle_head(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An untrained EAGLE head for the embedded model, written by the drafts pipeline's own
    init and export (its layer the target's last, fc = [I I], the first DRAFT_VOCAB tokens)."""
    from drafts.eagle import init_eagle
    from drafts.export import export_draft
    from drafts.target import load_target

    target = load_target(None, device=torch.device("cpu"), dtype=torch.float32, progress=False)
    head = init_eagle(target, target.arch.num_hidden_layers - 1, torch.arange(DRAFT_VOCAB, dtype=torch.int64))
    folder = tmp_path_factory.mktemp("eagle")
    export_draft(head, str(folder), target_name=target.name, shared_embedding=True, dtype=torch.float32)
    return str(Path(folder))


@pytest.fixture(scope="session")
def perturbed_eagle_head():
    """make(target, seed, vocab=4096): an EAGLE head for the embedded model (drafts.target's
    `target`), its layer initialised from the target's layer 29, the first `vocab` tokens, every
    trainable weight moved by 2% noise (not the identity init: every weight matters)."""
    from drafts.eagle import init_eagle

    def make(target, seed: int, vocab: int = 4096):
        torch.manual_seed(seed)
        head = init_eagle(target, 29, torch.arange(vocab, dtype=torch.int64))
        with torch.no_grad():
            for param in head.parameters():
                if param.requires_grad:
                    param.add_(0.02 * torch.randn_like(param))
        return head

    return make
