"""RoPE tables and rotation against transformers' rotary embedding for every supported type."""

from __future__ import annotations

import pytest
import torch

from engine.model.arch_config import ArchConfig
from engine.model.layers.rotary import RotaryEmbedding, apply_rotary, compute_inv_freq

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb  # noqa: E402

HEAD_DIM = 32
MAX_POSITIONS = 256
ROPE_CASES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.5},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn_mscale": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 32,
                    "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2},
    "yarn_attention_factor": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                              "original_max_position_embeddings": 64, "attention_factor": 1.3, "truncate": False},
}


def _hf_config(rope_parameters: dict):
    return transformers.LlamaConfig(hidden_size=HEAD_DIM * 4, num_attention_heads=4, head_dim=HEAD_DIM,
                                    max_position_embeddings=MAX_POSITIONS, rope_parameters=dict(rope_parameters))


def _ours(rope_parameters: dict) -> RotaryEmbedding:
    """Through ArchConfig.from_hf_config, so the config parsing is part of what is checked."""
    config = _hf_config(rope_parameters).to_dict()
    config["architectures"] = ["LlamaForCausalLM"]
    arch = ArchConfig.from_hf_config(config)
    return RotaryEmbedding(arch.head_dim, arch.rope_theta, arch.rope_scaling, arch.max_position_embeddings)


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_cos_sin_match_transformers(case) -> None:
    hf_rotary = LlamaRotaryEmbedding(_hf_config(ROPE_CASES[case]))
    positions = torch.tensor([0, 1, 2, 17, 63, 64, 65, 200, 255])
    x = torch.zeros(1, len(positions), HEAD_DIM)
    hf_cos, hf_sin = hf_rotary(x, positions.unsqueeze(0))  # [1, T, head_dim], both halves equal
    cos, sin = _ours(ROPE_CASES[case]).cos_sin(positions, torch.float32)  # [T, 1, head_dim // 2]
    torch.testing.assert_close(cos[:, 0], hf_cos[0, :, : HEAD_DIM // 2], atol=1e-6, rtol=0)
    torch.testing.assert_close(sin[:, 0], hf_sin[0, :, : HEAD_DIM // 2], atol=1e-6, rtol=0)


def test_scaled_types_differ_from_default() -> None:
    """Guards the comparison above: each scaling type really changes the table."""
    default = _ours(ROPE_CASES["default"]).cos_sin_table
    for case in ("linear", "yarn", "yarn_mscale"):
        assert (_ours(ROPE_CASES[case]).cos_sin_table - default).abs().max() > 1e-2, case


def test_apply_rotary_matches_rotate_half() -> None:
    generator = torch.Generator().manual_seed(0)
    num_tokens, num_heads = 7, 3
    x = torch.randn(num_tokens, num_heads, HEAD_DIM, generator=generator)
    positions = torch.tensor([0, 3, 4, 9, 30, 31, 100])
    rotary = _ours(ROPE_CASES["default"])
    cos, sin = rotary.cos_sin(positions, torch.float32)
    full_cos, full_sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)  # [T, 1, head_dim]
    # transformers' layout: [batch, heads, T, head_dim] with cos [batch, T, head_dim].
    expected, _ = apply_rotary_pos_emb(x.transpose(0, 1)[None], x.transpose(0, 1)[None],
                                       full_cos[:, 0][None], full_sin[:, 0][None])
    torch.testing.assert_close(apply_rotary(x, cos, sin), expected[0].transpose(0, 1), atol=1e-6, rtol=0)
    # Rotation keeps the norm of each (x1[i], x2[i]) pair.
    torch.testing.assert_close(apply_rotary(x, cos, sin).norm(dim=-1), x.norm(dim=-1))


def test_freq_factors_divide_frequencies() -> None:
    plain, _ = compute_inv_freq(8, 10000.0, None, 128)
    factors = (1.0, 2.0, 4.0, 8.0)
    scaled, attention_factor = compute_inv_freq(8, 10000.0, {"rope_type": "freq_factors", "factors": factors}, 128)
    torch.testing.assert_close(scaled, plain / torch.tensor(factors))
    assert attention_factor == 1.0
    with pytest.raises(ValueError, match="rope_freqs"):
        compute_inv_freq(8, 10000.0, {"rope_type": "freq_factors", "factors": (1.0, 2.0)}, 128)


def test_unknown_rope_type_is_named() -> None:
    with pytest.raises(ValueError, match="rope_scaling.type 'dynamic'"):
        compute_inv_freq(16, 10000.0, {"rope_type": "dynamic", "factor": 2.0}, 128)
    with pytest.raises(ValueError, match="rope_scaling.factor"):
        compute_inv_freq(16, 10000.0, {"rope_type": "linear"}, 128)


def test_table_length_follows_max_positions() -> None:
    rotary = RotaryEmbedding(16, 10000.0, None, 4096, max_positions=100)
    assert rotary.max_positions == 100 and rotary.cos_sin_table.shape == (100, 16)
