"""Test helper: writes a Hugging Face model as a GGUF file the way llama.cpp's
convert_hf_to_gguf does (tensor names, Q/K row permutation for "llama", optional quantization).
Written independently of the loader's own name table and inverse permutation."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf_name: str) -> str:
    if hf_name in GLOBAL:
        return GLOBAL[hf_name]
    _, _, layer, *rest = hf_name.split(".")
    module, kind = ".".join(rest[:-1]), rest[-1]
    return f"blk.{layer}.{BLOCK[module]}.{kind}"


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf's permutation for ggml's interleaved rotary, written independently."""
    return (weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write_gguf(path, hf_model, gguf_arch: str, quant: GGMLQuantizationType, *,
               rope_freqs: np.ndarray | None = None, feed_forward_length: int | None = None) -> None:
    """Writes hf_model as llama.cpp would and replaces hf_model's weights with what the file
    holds after quantization, so both sides compute with identical numbers."""
    config = hf_model.config
    writer = GGUFWriter(str(path), gguf_arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(feed_forward_length or config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    with torch.no_grad():
        for name, param in hf_model.state_dict().items():
            if name == "lm_head.weight" and config.tie_word_embeddings:
                continue
            values = param.numpy().astype(np.float32)
            if gguf_arch == "llama" and name.endswith("q_proj.weight"):
                values = llama_cpp_permute(values, config.num_attention_heads)
            elif gguf_arch == "llama" and name.endswith("k_proj.weight"):
                values = llama_cpp_permute(values, config.num_key_value_heads)
            if values.ndim == 2 and quant != GGMLQuantizationType.F32:
                packed = quantize(values, quant)
                writer.add_tensor(gguf_name(name), packed, raw_dtype=quant)
                # Quantization works on blocks within a row, so the file's rows, un-permuted,
                # equal the original rows quantized and dequantized: what HF computes with.
                param.copy_(torch.from_numpy(dequantize(quantize(param.numpy().astype(np.float32), quant), quant)))
            else:
                writer.add_tensor(gguf_name(name), values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
