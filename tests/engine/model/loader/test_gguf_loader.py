"""GGUF loading: tiny GGUF files written here the way llama.cpp's convert_hf_to_gguf writes them
(names, ne order, Q/K row permutation for llama, optional Q8_0 quantization), loaded by our
loader and compared with transformers on the same (dequantized) weights; plus the embedded model."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType

from engine.model.loader import load_model
from engine.model.loader.gguf_loader import unpermute_rotary_rows
from engine.model.resolve import ResolvedModel, embedded_gguf_path
from gguf_harness import llama_cpp_permute, write_gguf
from model_harness import PagedDriver, hf_logits, random_hf_model, random_prompts, tiny_hf_config

pytest.importorskip("transformers")

# case -> (tiny family, config overrides, general.architecture, type of the 2-D weights)
CASES = {
    "llama_f32_tied": ("llama_tied", {}, "llama", GGMLQuantizationType.F32),
    "llama_q8_0_untied": ("llama_tied", {"tie_word_embeddings": False}, "llama", GGMLQuantizationType.Q8_0),
    "qwen2_f32_bias": ("qwen2_bias", {}, "qwen2", GGMLQuantizationType.F32),
    "qwen3_q8_0_qk_norm": ("qwen3_qk_norm", {}, "qwen3", GGMLQuantizationType.Q8_0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gguf_logits_match_transformers(tmp_path, case) -> None:
    family, overrides, gguf_arch, quant = CASES[case]
    hf_model = random_hf_model(tiny_hf_config(family, **overrides), seed=11)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, hf_model, gguf_arch, quant)
    model, arch = load_model(ResolvedModel(str(path), "gguf", "tiny"), torch.float32, "cpu", progress=False)
    assert arch.tie_word_embeddings == hf_model.config.tie_word_embeddings
    assert arch.eos_token_ids == (2,) and arch.bos_token_id == 1
    prompts = random_prompts([9, 4], arch.vocab_size, seed=12)
    logits = PagedDriver(model, arch, block_size=4).step(dict(enumerate(prompts)))
    for i, prompt in enumerate(prompts):
        torch.testing.assert_close(logits[i], hf_logits(hf_model, prompt), atol=1e-4, rtol=0, msg=case)


def test_gguf_rope_freqs_tensor_reproduces_llama3_scaling(tmp_path) -> None:
    """llama.cpp stores Llama 3 rope scaling as per-frequency divisors (rope_freqs.weight)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_model = random_hf_model(tiny_hf_config("llama_rope_llama3"), seed=13)
    config = hf_model.config
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    head_dim = config.head_dim
    plain = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    path = tmp_path / "llama3.gguf"
    write_gguf(path, hf_model, "llama", GGMLQuantizationType.F32, rope_freqs=(plain / scaled).numpy())
    model, arch = load_model(ResolvedModel(str(path), "gguf", "tiny"), torch.float32, "cpu", progress=False)
    assert arch.rope_scaling is not None and arch.rope_scaling["rope_type"] == "freq_factors"
    prompt = random_prompts([40], arch.vocab_size, seed=14)[0]  # long enough for low frequencies to matter
    logits = PagedDriver(model, arch, block_size=8).step({0: prompt})[0]
    torch.testing.assert_close(logits, hf_logits(hf_model, prompt), atol=1e-4, rtol=0)


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    weight = torch.arange(3 * 8 * 5, dtype=torch.float32).reshape(3 * 8, 5)  # 3 heads of head_dim 8
    permuted = torch.from_numpy(llama_cpp_permute(weight.numpy(), 3))
    assert not torch.equal(permuted, weight)
    assert torch.equal(unpermute_rotary_rows(permuted, 3), weight)
    bias = torch.arange(16, dtype=torch.float32)
    assert torch.equal(unpermute_rotary_rows(torch.from_numpy(llama_cpp_permute(bias.numpy(), 2)), 2), bias)


def test_embedded_model_loads() -> None:
    model, arch = load_model(ResolvedModel(embedded_gguf_path(), "gguf", "embedded"), torch.float32, "cpu",
                             progress=False)
    assert (arch.architecture, arch.num_hidden_layers, arch.hidden_size, arch.vocab_size) == \
        ("LlamaForCausalLM", 30, 576, 49152)
    assert (arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim) == (9, 3, 64)
    assert arch.tie_word_embeddings and model.lm_head.weight is model.embed_tokens.weight
    assert arch.eos_token_ids == (2,) and arch.rope_theta == 100000.0
    assert all(torch.isfinite(p).all() for p in model.parameters())
    driver = PagedDriver(model, arch, block_size=16, num_blocks=4)
    prompt = [1, 504, 3458, 282, 4649, 314]
    logits = driver.step({0: prompt})[0]
    assert logits.shape == (len(prompt), 49152) and torch.isfinite(logits).all()
    decode = driver.step({0: [int(logits[-1].argmax())]})[0]
    assert decode.shape == (1, 49152) and torch.isfinite(decode).all()
