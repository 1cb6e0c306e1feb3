"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over a paged KV cache.

One forward covers a whole step: the new tokens of every scheduled request, flattened into
[num_tokens] (see AttentionMetadata). The families differ only in switches read from
ArchConfig: q/k/v bias (Qwen2), per-head q/k RMSNorm (Qwen3), a sliding window (Mistral,
Qwen2/3 upper layers), tied embeddings, scaled RoPE.

Parameter names follow Hugging Face's without the leading "model." and with q/k/v and
gate/up fused (qkv_proj, gate_up_proj); the loaders map checkpoint tensors onto them.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.model.arch_config import ArchConfig
from engine.model.attention_metadata import AttentionMetadata
from engine.model.fused_decoder import FusedDecoder
from engine.model.layers.attention import PagedAttention
from engine.model.layers.linear import Linear
from engine.model.layers.mlp import GatedMLP
from engine.model.layers.rms_norm import RMSNorm
from engine.model.layers.rotary import RotaryEmbedding, apply_rotary
from engine.model.layers.vocab_embedding import LMHead, VocabEmbedding


class LlamaAttention(nn.Module):
    def __init__(self, arch: ArchConfig, layer_idx: int, *, dtype: torch.dtype | None,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self.num_heads = arch.num_attention_heads
        self.num_kv_heads = arch.num_key_value_heads
        self.head_dim = arch.head_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        # Shards 0, 1, 2 are q_proj, k_proj, v_proj.
        self.qkv_proj = Linear(arch.hidden_size, [q_size, kv_size, kv_size], bias=arch.attention_bias,
                               dtype=dtype, device=device)
        self.o_proj = Linear(q_size, [arch.hidden_size], bias=arch.attention_output_bias,
                             dtype=dtype, device=device)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if arch.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, arch.rms_norm_eps, dtype=dtype, device=device)
            self.k_norm = RMSNorm(self.head_dim, arch.rms_norm_eps, dtype=dtype, device=device)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim,
                                   scale=self.head_dim ** -0.5,
                                   sliding_window=arch.sliding_window_for_layer(layer_idx))
        self.kv_proj: Linear | None = None  # k and v alone, for store_kv (add_kv_projection)

    def add_kv_projection(self) -> None:
        """Gives store_kv a k/v projection of its own (a copy of qkv_proj's k and v rows), so
        KV-only passes skip computing q: for a layer that runs many of them, an EAGLE head's
        (q is 576 of SmolLM2's 960 qkv outputs: at 248 rows, bf16 on 2 cores, the projection
        took 0.82 ms with q, of a 2.4 ms KV-only pass). Before the model's linears are
        converted to their execution form, which no longer exposes the weight."""
        weight, bias = self.qkv_proj.weight, self.qkv_proj.bias
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        proj = Linear(weight.shape[1], [kv_size, kv_size], bias=bias is not None, dtype=weight.dtype,
                      device=weight.device)
        with torch.no_grad():
            proj.weight.copy_(weight[q_size:])
            if bias is not None and proj.bias is not None:
                proj.bias.copy_(bias[q_size:])
        self.kv_proj = proj

    def _qkv(self, hidden: torch.Tensor) -> torch.Tensor:
        """[num_tokens, hidden_size] -> [num_tokens, num_heads + 2 * num_kv_heads, head_dim]."""
        return self.qkv_proj(hidden).view(hidden.shape[0], self.num_heads + 2 * self.num_kv_heads, self.head_dim)

    def forward(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden_size]
        cos: torch.Tensor,  # [num_tokens, 1, head_dim // 2]
        sin: torch.Tensor,  # [num_tokens, 1, head_dim // 2]
        kv_cache: torch.Tensor,  # [2, num_blocks, num_kv_heads, block_size, head_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden_size]
        num_tokens = hidden.shape[0]
        qkv = self._qkv(hidden)
        num_qk_heads = self.num_heads + self.num_kv_heads
        v = qkv[:, num_qk_heads:]  # [num_tokens, num_kv_heads, head_dim]
        if self.q_norm is None:
            # q and k rotate by the same angles: one rotary pass over both sets of heads.
            qk = apply_rotary(qkv[:, :num_qk_heads], cos, sin)
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads:]
        else:
            assert self.k_norm is not None
            q = apply_rotary(self.q_norm(qkv[:, : self.num_heads]), cos, sin)
            k = apply_rotary(self.k_norm(qkv[:, self.num_heads: num_qk_heads]), cos, sin)
        out = self.attn(q, k, v, kv_cache, meta)  # [num_tokens, num_heads, head_dim]
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))

    def store_kv(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                 meta: AttentionMetadata) -> None:
        """forward's arguments; stores only the keys/values forward would (the same ops), for
        positions whose outputs nobody reads."""
        if self.kv_proj is not None:
            kv = self.kv_proj(hidden).view(hidden.shape[0], 2 * self.num_kv_heads, self.head_dim)
            k, v = kv[:, : self.num_kv_heads], kv[:, self.num_kv_heads:]
        else:
            qkv = self._qkv(hidden)
            k = qkv[:, self.num_heads: self.num_heads + self.num_kv_heads]
            v = qkv[:, self.num_heads + self.num_kv_heads:]
        if self.k_norm is not None:
            k = self.k_norm(k)
        self.attn.store(apply_rotary(k, cos, sin), v, kv_cache, meta)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, arch: ArchConfig, layer_idx: int, *, dtype: torch.dtype | None,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype=dtype, device=device)
        self.self_attn = LlamaAttention(arch, layer_idx, dtype=dtype, device=device)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype=dtype, device=device)
        self.mlp = GatedMLP(arch.hidden_size, arch.intermediate_size, bias=arch.mlp_bias,
                            dtype=dtype, device=device)

    def forward(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden_size]: the previous sub-layer's output
        residual: torch.Tensor | None,  # [num_tokens, hidden_size]; None before the first layer
        cos: torch.Tensor,  # [num_tokens, 1, head_dim // 2]
        sin: torch.Tensor,  # [num_tokens, 1, head_dim // 2]
        kv_cache: torch.Tensor,  # [2, num_blocks, num_kv_heads, block_size, head_dim]
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (mlp output, residual), both [num_tokens, hidden_size]
        # The residual add of each sub-layer is deferred into the next norm (fused add + norm).
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, cos, sin, kv_cache, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual

    def store_kv(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                 meta: AttentionMetadata) -> None:
        """Writes the keys/values forward(hidden, None, cos, sin, kv_cache, meta) would (hidden:
        the layer's input, no residual before it), skipping attention and MLP."""
        self.self_attn.store_kv(self.input_layernorm(hidden), cos, sin, kv_cache, meta)


class LlamaForCausalLM(nn.Module):
    """forward: token ids and positions of one step -> final-norm hidden states.
    compute_logits: hidden rows -> float32 vocabulary logits (only the rows being sampled).

    Parameters are created uninitialized in `dtype` on `device`; a loader fills them.
    max_positions bounds the RoPE table (default: arch.max_position_embeddings).
    """

    def __init__(self, arch: ArchConfig, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, max_positions: int | None = None) -> None:
        super().__init__()
        self.arch = arch
        self.embed_tokens = VocabEmbedding(arch.vocab_size, arch.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(arch, i, dtype=dtype, device=device) for i in range(arch.num_hidden_layers)
        )
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype=dtype, device=device)
        self.lm_head = LMHead(arch.vocab_size, arch.hidden_size,
                              tied_to=self.embed_tokens if arch.tie_word_embeddings else None,
                              dtype=dtype, device=device)
        self.rotary = RotaryEmbedding(arch.head_dim, arch.rope_theta, arch.rope_scaling,
                                      arch.max_position_embeddings, max_positions=max_positions, device=device)

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[torch.Tensor],  # per layer [2, num_blocks, num_kv_heads, block_size, head_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden_size]
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"kv_caches has {len(kv_caches)} entries for {len(self.layers)} layers")
        return self.run_layers(self.embed_tokens(input_ids), positions, kv_caches, meta)

    def run_layers(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden_size]: the first layer's input
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[torch.Tensor],  # per layer, as forward's
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden_size]: the final norm's output
        """Every decoder layer and the final norm (an EAGLE head runs its one layer from its own
        input through this). Few-row float32 steps on AVX2 CPUs go through one compiled call
        (engine/model/fused_decoder.py), bit-identical to the layer-by-layer loop below."""
        fused = self._fused_decoder()
        if fused is not None:
            out = fused.run(hidden, self.rotary.cos_sin_table, positions, kv_caches, meta)
            if out is not None:
                return out
        cos, sin = self.rotary.cos_sin(positions, hidden.dtype)
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden, residual = layer(hidden, residual, cos, sin, kv_cache, meta)
        if residual is None:  # a model without layers
            return self.norm(hidden)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def forget_fused_decoder(self) -> None:
        """Drops the compiled path built for the linears as they were (engine/model/
        quantization.py calls this after swapping them), so the next step builds it anew."""
        self.__dict__.pop("_fused", None)

    def _fused_decoder(self) -> FusedDecoder | None:
        """The compiled path, built on the first step (after the loader has put the linears in
        their execution form), or None where it does not apply."""
        if "_fused" not in self.__dict__:
            self.__dict__["_fused"] = FusedDecoder.build(self.layers, self.norm)
        return self.__dict__["_fused"]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [num_rows, hidden] -> [num_rows, vocab] fp32
        return self.lm_head(hidden)
