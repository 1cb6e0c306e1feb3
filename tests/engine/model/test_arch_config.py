"""ArchConfig from real-world-shaped config.json dicts (classic keys, as shipped on the Hub) and
from the embedded GGUF's metadata."""

from __future__ import annotations

import dataclasses

import pytest

from engine.model.arch_config import ArchConfig
from engine.model.loader.gguf_loader import open_gguf
from engine.model.resolve import embedded_gguf_path

LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
}
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
    "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "max_position_embeddings": 32768, "rope_scaling": None,
    "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28, "tie_word_embeddings": False,
    "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645,
}
QWEN3_32B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 5120,
    "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 128, "rms_norm_eps": 1e-06, "rope_theta": 1000000, "max_position_embeddings": 40960,
    "rope_scaling": None, "attention_bias": False, "sliding_window": None, "use_sliding_window": False,
    "max_window_layers": 64, "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 151643,
    "eos_token_id": 151645,
}
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "max_position_embeddings": 32768, "sliding_window": 4096,
    "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
}


def test_llama31() -> None:
    arch = ArchConfig.from_hf_config(LLAMA31_8B)
    assert (arch.head_dim, arch.num_key_value_heads, arch.rope_theta) == (128, 8, 500000.0)
    assert arch.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert arch.eos_token_ids == (128001, 128008, 128009) and arch.bos_token_id == 128000
    assert not (arch.attention_bias or arch.attention_output_bias or arch.mlp_bias or arch.qk_norm)
    assert arch.sliding_window is None and not arch.tie_word_embeddings


def test_qwen25_window_off_and_qkv_bias() -> None:
    arch = ArchConfig.from_hf_config(QWEN25_7B)
    assert arch.sliding_window is None  # use_sliding_window false beats sliding_window 131072
    assert arch.attention_bias and not arch.attention_output_bias and not arch.qk_norm
    assert arch.eos_token_ids == (151645,) and arch.head_dim == 128
    assert all(arch.sliding_window_for_layer(i) is None for i in range(arch.num_hidden_layers))


def test_qwen2_window_only_from_max_window_layers() -> None:
    arch = ArchConfig.from_hf_config({**QWEN25_7B, "use_sliding_window": True, "sliding_window": 4096,
                                      "max_window_layers": 20})
    assert [arch.sliding_window_for_layer(i) for i in (0, 19, 20, 27)] == [None, None, 4096, 4096]


def test_qwen3_explicit_head_dim_and_qk_norm() -> None:
    arch = ArchConfig.from_hf_config(QWEN3_32B)
    assert arch.head_dim == 128 and arch.hidden_size // arch.num_attention_heads == 80
    assert arch.qk_norm and not arch.attention_bias and arch.rope_theta == 1000000.0


def test_mistral_window_and_null_window() -> None:
    arch = ArchConfig.from_hf_config(MISTRAL_7B_V01)
    assert arch.sliding_window == 4096
    assert all(arch.sliding_window_for_layer(i) == 4096 for i in range(32))
    assert ArchConfig.from_hf_config({**MISTRAL_7B_V01, "sliding_window": None}).sliding_window is None


def test_classic_rope_scaling_type_key() -> None:
    arch = ArchConfig.from_hf_config({**LLAMA31_8B, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert arch.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    plain = ArchConfig.from_hf_config({**LLAMA31_8B, "rope_scaling": {"rope_type": "default"}})
    assert plain.rope_scaling is None


def test_transformers5_rope_parameters() -> None:
    config = {k: v for k, v in LLAMA31_8B.items() if k not in ("rope_theta", "rope_scaling")}
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 20000.0, "factor": 4.0}
    arch = ArchConfig.from_hf_config(config)
    assert arch.rope_theta == 20000.0
    assert arch.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 131072}


def test_model_type_when_architectures_absent() -> None:
    config = {k: v for k, v in MISTRAL_7B_V01.items() if k != "architectures"}
    assert ArchConfig.from_hf_config(config).architecture == "MistralForCausalLM"


def test_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="'GemmaForCausalLM'.*LlamaForCausalLM, MistralForCausalLM, "
                                         "Qwen2ForCausalLM, Qwen3ForCausalLM"):
        ArchConfig.from_hf_config({**LLAMA31_8B, "architectures": ["GemmaForCausalLM"]})
    with pytest.raises(ValueError, match="rope_scaling.type 'dynamic'"):
        ArchConfig.from_hf_config({**LLAMA31_8B, "rope_scaling": {"type": "dynamic", "factor": 2.0}})
    with pytest.raises(ValueError, match="num_key_value_heads"):
        ArchConfig.from_hf_config({**LLAMA31_8B, "num_key_value_heads": 5})
    with pytest.raises(ValueError, match="hidden_act"):
        ArchConfig.from_hf_config({**LLAMA31_8B, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="'intermediate_size'"):
        ArchConfig.from_hf_config({k: v for k, v in LLAMA31_8B.items() if k != "intermediate_size"})
    arch = ArchConfig.from_hf_config(LLAMA31_8B)
    with pytest.raises(ValueError, match="layer_types"):
        dataclasses.replace(arch, layer_types=("full_attention",))


def test_from_embedded_gguf() -> None:
    arch = ArchConfig.from_gguf(open_gguf(embedded_gguf_path()))
    assert arch == ArchConfig(
        architecture="LlamaForCausalLM", vocab_size=49152, hidden_size=576, intermediate_size=1536,
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
        rms_norm_eps=arch.rms_norm_eps, rope_theta=100000.0, rope_scaling=None, max_position_embeddings=8192,
        tie_word_embeddings=True, attention_bias=False, qk_norm=False, sliding_window=None, hidden_act="silu",
        bos_token_id=1, eos_token_ids=(2,),
    )
    assert abs(arch.rms_norm_eps - 1e-5) < 1e-9
