"""Rotary position embedding (RoPE) in the neox / Hugging Face rotate_half layout.

Each head vector is split in two halves (x1, x2) that rotate as pairs (x1[i], x2[i]) by the
angle position * inv_freq[i]. cos and sin are precomputed in float32 for every position once,
and one forward indexes them once for all layers.

Scaled variants follow transformers' ROPE_INIT_FUNCTIONS: "linear" divides every frequency,
"llama3" divides only the low frequencies (smoothly between two wavelengths), "yarn" blends
interpolated and extrapolated frequencies along a ramp and scales cos/sin by an attention
factor. "freq_factors" is llama.cpp's form of llama3 (a GGUF rope_freqs tensor that divides
each frequency).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from engine.model.arch_config import SUPPORTED_ROPE_TYPES


def compute_inv_freq(
    head_dim: int,
    rope_theta: float,
    rope_scaling: dict[str, Any] | None,
    max_position_embeddings: int,
) -> tuple[torch.Tensor, float]:  # ([head_dim // 2] float32, attention factor for cos/sin)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope_theta ** exponents)  # [head_dim // 2]
    if rope_scaling is None:
        return inv_freq, 1.0
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / float(_param(rope_scaling, "factor")), 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(head_dim, rope_theta, rope_scaling, max_position_embeddings)
    if rope_type == "freq_factors":
        factors = torch.tensor(rope_scaling["factors"], dtype=torch.float32)
        if factors.shape != inv_freq.shape:
            raise ValueError(f"rope_freqs has {factors.numel()} factors, expected {inv_freq.numel()} (head_dim / 2)")
        return inv_freq / factors, 1.0
    raise ValueError(f"rope_scaling.type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")


def _param(rope_scaling: dict[str, Any], name: str) -> Any:
    if rope_scaling.get(name) is None:
        raise ValueError(f"rope_scaling.{name} is required for rope_scaling.type {rope_scaling.get('rope_type')!r}")
    return rope_scaling[name]


def _llama3_inv_freq(inv_freq: torch.Tensor, rope_scaling: dict[str, Any]) -> torch.Tensor:
    factor = float(_param(rope_scaling, "factor"))
    low_freq_factor = float(_param(rope_scaling, "low_freq_factor"))
    high_freq_factor = float(_param(rope_scaling, "high_freq_factor"))
    old_context_len = float(_param(rope_scaling, "original_max_position_embeddings"))
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (beyond the pretraining context) are interpolated by `factor`, short
    # ones are kept, and the band between blends the two linearly in 1 / wavelength.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, blended, scaled)


def _yarn_inv_freq(head_dim: int, rope_theta: float, rope_scaling: dict[str, Any],
                   max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    original = int(_param(rope_scaling, "original_max_position_embeddings"))
    factor = rope_scaling.get("factor")
    factor = float(factor) if factor is not None else max_position_embeddings / original

    def mscale_of(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = rope_scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = rope_scaling.get("mscale"), rope_scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = mscale_of(factor, mscale) / mscale_of(factor, mscale_all_dim)
        else:
            attention_factor = mscale_of(factor)
    beta_fast = rope_scaling.get("beta_fast") or 32
    beta_slow = rope_scaling.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        # The dimension whose wavelength fits num_rotations times into the original context.
        return head_dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(rope_theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope_scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # keeps the ramp finite
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    extrapolation = 1.0 / pos_freqs  # high frequencies: unchanged
    interpolation = 1.0 / (factor * pos_freqs)  # low frequencies: stretched by `factor`
    extrapolation_weight = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    return inv_freq, float(attention_factor)


class RotaryEmbedding(nn.Module):
    """Holds the cos/sin table; `cos_sin` looks up a step's positions once for all layers."""

    def __init__(self, head_dim: int, rope_theta: float, rope_scaling: dict[str, Any] | None,
                 max_position_embeddings: int, *, max_positions: int | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        inv_freq, attention_factor = compute_inv_freq(head_dim, rope_theta, rope_scaling,
                                                      max_position_embeddings)
        num_positions = max_positions or max_position_embeddings
        t = torch.arange(num_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [num_positions, head_dim // 2]
        # cos and sin side by side so one index_select fetches both.
        table = torch.cat([freqs.cos() * attention_factor, freqs.sin() * attention_factor], dim=-1)
        self.register_buffer("cos_sin_table", table.to(device), persistent=False)  # [num_positions, head_dim]

    @property
    def max_positions(self) -> int:
        return self.cos_sin_table.shape[0]

    def cos_sin(
        self,
        positions: torch.Tensor,  # [num_tokens] int64
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # 2 x [num_tokens, 1, head_dim // 2]
        table = self.cos_sin_table.index_select(0, positions).to(dtype).unsqueeze(1)
        return table.chunk(2, dim=-1)


def apply_rotary(
    x: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    cos: torch.Tensor,  # [num_tokens, 1, head_dim // 2]
    sin: torch.Tensor,  # [num_tokens, 1, head_dim // 2]
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    x1, x2 = x.chunk(2, dim=-1)
    # (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin): rotate_half's result, without its concat.
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
