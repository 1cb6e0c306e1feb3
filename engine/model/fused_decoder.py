"""A decoder stack's few-row steps in one compiled call (kernels/cpu/decoder_layers.cpp).

Decode and verification steps of a float32 model on an AVX2 CPU (and a draft's, over held bf16
or int8 weights, on AVX512 ones too) run every linear through the compiled few-row kernel;
driven layer by layer from Python the step also pays for ~9 module and ctypes calls a layer and
the rotary embedding as tensor ops: on the embedded model (30 layers, 2 threads, an AVX2 EPYC) a
one-token step spent 20 ms inside the kernels and 11 ms outside them.
`FusedDecoder` hands the whole stack to one C call that runs the same kernels in the same order
on the same inputs, so its output equals the layer-by-layer path's bit for bit
(tests/engine/model/test_fused_decoder.py); the model falls back to that path for everything
the call does not cover (see `FusedDecoder.build` and `run`).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.model.attention_metadata import AttentionMetadata
from engine.model.layers.mlp import GatedMLP
from engine.model.layers.quant_linear import Bf16WeightLinear, Int8WeightLinear, PackedLinear
from engine.model.layers.rms_norm import RMSNorm
from kernels import small_rows_linear
from kernels.cpu import CpuKernels, DecoderLayerTensors, DecoderStack, cpu_kernels


def _weight(linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
    """The weight the few-row kernels read (float32 panels, or a plain [N, K] weight), the bias and
    an int8 weight's scales, or None for another form."""
    if isinstance(linear, PackedLinear) and not linear.float_output:
        weight = linear.panels if linear.panels is not None else linear.plain_weight
        return None if weight is None else (weight, linear.bias, None)
    if isinstance(linear, Bf16WeightLinear) and not linear.float_output:
        return linear.weight_bf16, linear.bias, None
    if isinstance(linear, Int8WeightLinear) and not linear.float_output:
        return linear.weight_int8, linear.bias, linear.scales
    return None


def _logical_shape(weight: torch.Tensor) -> tuple[int, ...]:
    """[N, K] of a linear weight, held plain or in panels ([N / 16, K, 16])."""
    if weight.dim() == 3:
        return weight.shape[0] * weight.shape[2], weight.shape[1]
    return tuple(weight.shape)


class FusedDecoder:
    """The compiled path for a stack of LlamaDecoderLayers and the final norm."""

    def __init__(self, kernels: CpuKernels, layers: list[dict], final_norm: torch.Tensor, *, num_heads: int,
                 num_kv_heads: int, head_dim: int, intermediate: int, scale: float, eps: float) -> None:
        self.kernels = kernels
        self._layers = layers  # per layer: its tensors but the caches (DecoderLayerTensors' other fields)
        self.final_norm = final_norm
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.intermediate, self.scale, self.eps = intermediate, scale, eps
        # The stack (its C array) for the last KV caches seen (they are allocated once per
        # engine), keyed by their addresses; it holds the tensors it points into.
        self._stack_key: tuple[int, ...] | None = None
        self._stack: DecoderStack | None = None
        self._array_tensors: list[DecoderLayerTensors] = []

    @staticmethod
    def build(layers: nn.ModuleList, norm: RMSNorm) -> FusedDecoder | None:
        """The compiled path for these layers, or None where it does not apply: no compiled
        kernels, not an AVX2 CPU (skinny_enabled) nor a wider one with every linear's weight
        held in bf16 or int8 (held_weights_enabled), linears not in the few-row kernel's form
        (quantized, oneDNN-only, or still training-form Linears), per-head q/k norms (Qwen3),
        anything but float32 norms."""
        kernels = cpu_kernels()
        if kernels is None or len(layers) == 0:
            return None
        # On AVX2 CPUs every float32 few-row product takes the compiled kernel; on wider ones
        # only products over held bf16 or int8 weights do (a draft's: held_weights_enabled). A
        # PackedLinear holds the plain or panel weight the kernel reads only where
        # skinny_enabled, so elsewhere _weight finds none for it and the stack does not apply.
        if not (small_rows_linear.skinny_enabled() or small_rows_linear.held_weights_enabled()):
            return None
        entries, shapes = [], set()
        for layer in layers:
            attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            if attention is None or not isinstance(mlp, GatedMLP) or attention.q_norm is not None:
                return None
            weights = [_weight(m) for m in (attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj)]
            norms = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
            if any(w is None for w in weights) or any(n.dtype != torch.float32 or not n.is_cpu for n in norms):
                return None
            (qkv, qkv_bias, qkv_scales), (o, o_bias, o_scales), (gate_up, gate_up_bias, gate_up_scales), \
                (down, down_bias, down_scales) = weights  # type: ignore[misc]
            # The C side trusts these shapes (it reads [N, K] from the sizes it is given).
            hidden, q_size = norms[0].shape[0], attention.num_heads * attention.head_dim
            qkv_rows, intermediate = q_size + 2 * attention.num_kv_heads * attention.head_dim, _logical_shape(down)[1]
            expected = [(qkv, (qkv_rows, hidden)), (o, (hidden, q_size)), (gate_up, (2 * intermediate, hidden)),
                        (down, (hidden, intermediate)), (norms[1], (hidden,))]
            biases = [(qkv_bias, qkv_rows), (o_bias, hidden), (gate_up_bias, 2 * intermediate), (down_bias, hidden)]
            if (any(_logical_shape(t) != shape for t, shape in expected)
                    or any(b is not None and tuple(b.shape) != (n,) for b, n in biases)):
                return None
            entries.append(dict(input_norm=norms[0].contiguous(), post_norm=norms[1].contiguous(), qkv=qkv,
                                qkv_bias=qkv_bias, o=o, o_bias=o_bias, gate_up=gate_up, gate_up_bias=gate_up_bias,
                                down=down, down_bias=down_bias, sliding_window=attention.attn.sliding_window,
                                qkv_scales=qkv_scales, o_scales=o_scales, gate_up_scales=gate_up_scales,
                                down_scales=down_scales))
            shapes.add((attention.num_heads, attention.num_kv_heads, attention.head_dim, intermediate, hidden,
                        attention.attn.scale, layer.input_layernorm.eps, layer.post_attention_layernorm.eps))
        if len(shapes) != 1 or norm.weight.dtype != torch.float32:
            return None
        num_heads, num_kv_heads, head_dim, intermediate, hidden, scale, eps, post_eps = shapes.pop()
        if tuple(norm.weight.shape) != (hidden,):
            return None
        if eps != post_eps or eps != norm.eps or head_dim % 2:
            return None
        return FusedDecoder(kernels, entries, norm.weight.contiguous(), num_heads=num_heads,
                            num_kv_heads=num_kv_heads, head_dim=head_dim, intermediate=intermediate, scale=scale,
                            eps=eps)

    def _stack_for(self, kv_caches: list[torch.Tensor]) -> DecoderStack | None:
        if not all(isinstance(kv, torch.Tensor) for kv in kv_caches):
            return None  # fp8 caches (FP8KVCache): the layer loop
        key = tuple(kv.data_ptr() for kv in kv_caches)
        if key != self._stack_key:
            if len(kv_caches) != len(self._layers):
                return None
            for kv in kv_caches:
                if (kv.dtype != torch.float32 or not kv.is_cpu or not kv.is_contiguous() or kv.dim() != 5
                        or kv.shape[2:] != kv_caches[0].shape[2:]):
                    return None
            tensors = [DecoderLayerTensors(k_cache=kv[0], v_cache=kv[1], **layer)
                       for layer, kv in zip(self._layers, kv_caches)]
            k_cache = kv_caches[0][0]  # [num_blocks, num_kv_heads, block_size, head_dim]
            self._stack = DecoderStack(CpuKernels.decoder_layer_weights(tensors), self.final_norm,
                                       num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                                       head_dim=self.head_dim, intermediate=self.intermediate,
                                       num_blocks=k_cache.shape[0], block_size=k_cache.shape[2], scale=self.scale,
                                       eps=self.eps)
            self._array_tensors, self._stack_key = tensors, key
        return self._stack

    @staticmethod
    def _meta_tensors(meta: AttentionMetadata) -> tuple[torch.Tensor, ...]:
        """slot_mapping (int64), block_table, query_start_loc and seq_lens (int32), contiguous."""
        return (meta.slot_mapping.to(torch.int64).contiguous(), meta.block_table.to(torch.int32).contiguous(),
                meta.query_start_loc.to(torch.int32).contiguous(), meta.seq_lens.to(torch.int32).contiguous())

    def run(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden] float32: the first layer's input
        cos_sin_table: torch.Tensor,  # [max_positions, head_dim] float32: the rotary table (cos | sin)
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[torch.Tensor],  # per layer [2, num_blocks, num_kv_heads, block_size, head_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor | None:  # [num_tokens, hidden] the final norm's output, or None: not taken
        """The stack's output, or None where this step is not for the compiled path (more rows
        than the few-row kernel takes, other dtypes or devices, gradients)."""
        num_tokens = hidden.shape[0]
        if (not 1 <= num_tokens <= small_rows_linear.SKINNY_MAX_ROWS or hidden.dtype != torch.float32
                or not hidden.is_cpu or hidden.requires_grad or cos_sin_table.dtype != torch.float32):
            return None
        stack = self._stack_for(kv_caches)
        if stack is None:
            return None
        return self.kernels.decoder_layers(stack, hidden.contiguous(), cos_sin_table.index_select(0, positions),
                                           *self._meta_tensors(meta))

    def run_eagle(
        self,
        token_ids: torch.Tensor,  # [num_tokens] int64: each position's next token
        embedding: torch.Tensor,  # [vocab, hidden] float32, contiguous
        states: torch.Tensor,  # [num_tokens, hidden] float32: the target's states
        fc_weight: torch.Tensor,  # [hidden, 2 * hidden] float32, bfloat16 or int8, contiguous
        fc_scales: torch.Tensor | None,  # [hidden] float32: an int8 fc's
        cos_sin_table: torch.Tensor,  # [max_positions, head_dim] float32, contiguous
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[torch.Tensor],  # the head's one layer's
        meta: AttentionMetadata,
    ) -> torch.Tensor | None:  # [num_tokens, hidden] the head's predicted states, or None: not taken
        """An EAGLE head's pass over this (one-layer) stack in one call: fc([embedding[token_ids];
        states]) through the layer and the final norm (kernels/cpu/eagle_head.cpp), or None where
        run would not take it."""
        num_tokens = states.shape[0]
        if (not 1 <= num_tokens <= small_rows_linear.SKINNY_MAX_ROWS or states.dtype != torch.float32
                or not states.is_cpu or len(self._layers) != 1):
            return None
        stack = self._stack_for(kv_caches)
        if stack is None:
            return None
        return self.kernels.eagle_forward(stack, token_ids.to(torch.int64).contiguous(), embedding,
                                          states.contiguous(), fc_weight, fc_scales, cos_sin_table,
                                          positions.to(torch.int64).contiguous(), *self._meta_tensors(meta))
