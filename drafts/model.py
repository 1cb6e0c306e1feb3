"""A trainable llama-family decoder whose forward equals the engine's inference model.

The engine's `LlamaForCausalLM` runs one flattened varlen step over a paged KV cache and has no
autograd; training needs padded [batch, seq] batches, causal SDPA and gradients. This module is
that second face of the same math: the same parameter names and fused layouts as the engine
(qkv_proj stacks q/k/v rows, gate_up_proj stacks gate/up rows), the same RoPE table
(engine.model.layers.rotary), the same RMSNorm rounding. So:
- the teacher wraps the engine model's own tensors without copying them (`wrap_engine_model`),
  which matters for a 32B target on one GPU;
- a draft initialised from target layers is a copy of some of those tensors (drafts/init.py);
- export only has to split the fused rows into Hugging Face names (drafts/export.py).

Output vocabulary: `head_weight` holds the output rows, all of the target's vocabulary or only
the draft vocabulary's rows (`vocab_ids`, sorted target token ids). With a shared embedding
both the input embedding and the head are the target's and stay frozen.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.arch_config import ArchConfig
from engine.model.layers.rotary import RotaryEmbedding, apply_rotary


def _empty(*shape: int, dtype: torch.dtype, device: torch.device | str | None) -> nn.Parameter:
    # Filled by an initialiser or by wrapping; torch.empty skips a wasted random init.
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device))


class TrainLinear(nn.Module):
    """y = x W^T (+ b); `output_sizes` records the fused shards (as engine Linear does)."""

    def __init__(self, input_size: int, output_sizes: list[int], *, bias: bool, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self.output_sizes = list(output_sizes)
        self.weight = _empty(sum(output_sizes), input_size, dtype=dtype, device=device)  # [out, in]
        self.bias = _empty(sum(output_sizes), dtype=dtype, device=device) if bias else None  # [out]

    def shard_rows(self, shard: int) -> slice:
        start = sum(self.output_sizes[:shard])
        return slice(start, start + self.output_sizes[shard])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        return F.linear(x, self.weight, self.bias)


class TrainRMSNorm(nn.Module):
    """The engine's RMSNorm: statistics in float32, normalized value cast back to the input
    dtype before the weight multiplies it (what bf16 references do)."""

    def __init__(self, hidden_size: int, eps: float, *, dtype: torch.dtype, device: torch.device | str | None) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = _empty(hidden_size, dtype=dtype, device=device)  # [hidden_size]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., hidden_size]
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, (self.hidden_size,), self.weight, self.eps)
        normed = F.rms_norm(x.float(), (self.hidden_size,), None, self.eps)
        return self.weight * normed.to(x.dtype)


class TrainAttention(nn.Module):
    def __init__(self, arch: ArchConfig, layer_idx: int, *, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self.num_heads = arch.num_attention_heads
        self.num_kv_heads = arch.num_key_value_heads
        self.head_dim = arch.head_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = TrainLinear(arch.hidden_size, [q_size, kv_size, kv_size], bias=arch.attention_bias,
                                    dtype=dtype, device=device)
        self.o_proj = TrainLinear(q_size, [arch.hidden_size], bias=arch.attention_output_bias,
                                  dtype=dtype, device=device)
        self.q_norm: TrainRMSNorm | None = None
        self.k_norm: TrainRMSNorm | None = None
        if arch.qk_norm:
            self.q_norm = TrainRMSNorm(self.head_dim, arch.rms_norm_eps, dtype=dtype, device=device)
            self.k_norm = TrainRMSNorm(self.head_dim, arch.rms_norm_eps, dtype=dtype, device=device)
        self.sliding_window = arch.sliding_window_for_layer(layer_idx)

    def forward(
        self,
        hidden: torch.Tensor,  # [batch, seq, hidden_size]
        cos: torch.Tensor,  # [batch, seq, 1, head_dim // 2]
        sin: torch.Tensor,  # [batch, seq, 1, head_dim // 2]
    ) -> torch.Tensor:  # [batch, seq, hidden_size]
        batch, seq, _ = hidden.shape
        qkv = self.qkv_proj(hidden).view(batch, seq, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        q = qkv[:, :, : self.num_heads]  # [batch, seq, num_heads, head_dim]
        k = qkv[:, :, self.num_heads: self.num_heads + self.num_kv_heads]  # [batch, seq, num_kv_heads, head_dim]
        v = qkv[:, :, self.num_heads + self.num_kv_heads:]  # [batch, seq, num_kv_heads, head_dim]
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        mask = None
        if self.sliding_window is not None and seq > self.sliding_window:
            # Query i sees keys i - window + 1 .. i (the engine's window convention).
            i = torch.arange(seq, device=hidden.device)
            distance = i[:, None] - i[None, :]
            mask = (distance >= 0) & (distance < self.sliding_window)  # [seq, seq] True = attend
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
            is_causal=mask is None, scale=self.head_dim ** -0.5, enable_gqa=self.num_heads != self.num_kv_heads,
        )  # [batch, num_heads, seq, head_dim]
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim))


class TrainMLP(nn.Module):
    def __init__(self, arch: ArchConfig, *, dtype: torch.dtype, device: torch.device | str | None) -> None:
        super().__init__()
        self.gate_up_proj = TrainLinear(arch.hidden_size, [arch.intermediate_size] * 2, bias=arch.mlp_bias,
                                        dtype=dtype, device=device)
        self.down_proj = TrainLinear(arch.intermediate_size, [arch.hidden_size], bias=arch.mlp_bias,
                                     dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> [..., hidden]
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class TrainDecoderLayer(nn.Module):
    def __init__(self, arch: ArchConfig, layer_idx: int, *, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self.input_layernorm = TrainRMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype=dtype, device=device)
        self.self_attn = TrainAttention(arch, layer_idx, dtype=dtype, device=device)
        self.post_attention_layernorm = TrainRMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype=dtype, device=device)
        self.mlp = TrainMLP(arch, dtype=dtype, device=device)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # hidden: [batch, seq, hidden_size] (the residual stream)
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class TrainableLlama(nn.Module):
    """forward: token ids [batch, seq] -> final-norm hidden states [batch, seq, hidden].
    logits: hidden -> float32 logits over the output vocabulary ([.., len(vocab_ids)] or [.., vocab]).

    arch: the architecture (vocab_size is the target's vocabulary, whatever the output rows).
    vocab_ids: sorted target token ids of the output rows, or None for the full vocabulary.
    Parameters are allocated uninitialised; drafts/init.py fills or wraps them.
    """

    def __init__(self, arch: ArchConfig, *, vocab_ids: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 max_positions: int | None = None) -> None:
        super().__init__()
        self.arch = arch
        num_outputs = arch.vocab_size if vocab_ids is None else int(vocab_ids.numel())
        self.embed_tokens = nn.Module()
        self.embed_tokens.weight = _empty(arch.vocab_size, arch.hidden_size, dtype=dtype, device=device)  # [vocab, hidden]
        self.layers = nn.ModuleList(TrainDecoderLayer(arch, i, dtype=dtype, device=device)
                                    for i in range(arch.num_hidden_layers))
        self.norm = TrainRMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype=dtype, device=device)
        self.lm_head = nn.Module()
        self.lm_head.weight = _empty(num_outputs, arch.hidden_size, dtype=dtype, device=device)  # [num_outputs, hidden]
        # [num_outputs] int64 target ids of the output rows; a buffer so it follows .to(device).
        self.register_buffer("vocab_ids", None if vocab_ids is None else vocab_ids.to(device=device, dtype=torch.int64))
        self.rotary = RotaryEmbedding(arch.head_dim, arch.rope_theta, arch.rope_scaling, arch.max_position_embeddings,
                                      max_positions=max_positions, device=device)

    @property
    def num_outputs(self) -> int:
        return int(self.lm_head.weight.shape[0])

    def forward(
        self,
        input_ids: torch.Tensor,  # [batch, seq] int64
        positions: torch.Tensor | None = None,  # [batch, seq] int64; None: 0 .. seq - 1
    ) -> torch.Tensor:  # [batch, seq, hidden_size]
        batch, seq = input_ids.shape
        if positions is None:
            positions = torch.arange(seq, device=input_ids.device).expand(batch, seq)
        if seq > self.rotary.max_positions:
            raise ValueError(f"sequence of {seq} tokens is longer than the RoPE table ({self.rotary.max_positions})")
        # A shared embedding may be the target's bf16 tensor while the draft trains in float32.
        hidden = F.embedding(input_ids, self.embed_tokens.weight).to(self.norm.weight.dtype)
        dtype = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(hidden.device.type) \
            else hidden.dtype
        cos, sin = self.rotary.cos_sin(positions.reshape(-1), dtype)  # 2 x [batch * seq, 1, head_dim // 2]
        cos = cos.view(batch, seq, 1, -1)
        sin = sin.view(batch, seq, 1, -1)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin)
        return self.norm(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> [..., num_outputs] float32
        weight = self.lm_head.weight
        return F.linear(hidden.to(weight.dtype), weight).float()

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The tensors a checkpoint must hold: every parameter that trains (frozen shared ones
        are the target's and are rebuilt from it)."""
        return {name: p.detach() for name, p in self.named_parameters() if p.requires_grad}
