"""An EAGLE head's passes and greedy tokens in one compiled call each (kernels/cpu/eagle_head.cpp).

Where the head's layer takes the one-call decoder stack (engine/model/fused_decoder.py: a
float32 head on an AVX2 CPU, or over held bf16 or int8 weights on a wider one), a position
driven from Python paid ~10 tensor ops and 3 ctypes calls around its kernels: the embedding
lookup, the concatenation with the target's state, the fc product and the layer's call, then the
output head's product, softmax, maximum, argmax and the map to target ids. Measured on an AVX2
EPYC (2 threads, the shipped head with int8-held weights, one code stream), a head call spent
1.04 ms of its 2.24 ms outside the kernels. Here each pass is one call into the same kernels on
the same inputs: its predicted states (and so the head's KV) are the Python path's bit for bit,
and so is the greedy token; its probability is summed in the kernel's own order (it only prices
the draft). Anything the call does not cover (another dtype or device, more rows than the
few-row kernel takes, a full-vocabulary head) keeps the Python path, which returns None here.
"""

from __future__ import annotations

import torch

from engine.model.attention_metadata import AttentionMetadata
from engine.spec_decode.draft_model import DraftModel
from kernels import small_rows_linear
from kernels.cpu import CpuKernels, cpu_kernels

_WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.int8)


def _held(weight: torch.Tensor | None, scales: torch.Tensor | None) -> bool:
    """Whether a product over this weight is one the few-row kernel takes as it is."""
    return (weight is not None and weight.is_cpu and weight.dtype in _WEIGHT_DTYPES and weight.is_contiguous()
            and (weight.dtype is torch.int8) == (scales is not None)
            and (scales is None or (scales.dtype is torch.float32 and scales.is_contiguous())))


class CompiledEagleHead:
    def __init__(self, kernels: CpuKernels, draft: DraftModel, kv_caches: list[torch.Tensor]) -> None:
        self.kernels = kernels
        self.draft = draft
        self.kv_caches = kv_caches
        model = draft.model
        self.embedding = model.embed_tokens.weight  # [vocab, hidden] float32
        self.cos_sin_table = model.rotary.cos_sin_table  # [max_positions, head_dim] float32
        self.fused = model._fused_decoder()  # (build checked it is there)
        assert draft.fc_weight is not None
        # The greedy token in the call too where the head drafts from a reduced vocabulary.
        self.tops = (draft.head_weight is not None and _held(draft.head_weight, draft.head_scales)
                     and draft.vocab_ids is not None and draft.vocab_ids.dtype is torch.int64
                     and draft.vocab_ids.is_contiguous())

    @staticmethod
    def build(draft: DraftModel, kv_caches: list[torch.Tensor], device: torch.device,
              dtype: torch.dtype) -> CompiledEagleHead | None:
        """The compiled path for this head, or None where it does not apply."""
        kernels = cpu_kernels()
        if (kernels is None or device.type != "cpu" or dtype != torch.float32
                or draft.model._fused_decoder() is None):
            return None
        model = draft.model
        embedding, table = model.embed_tokens.weight, model.rotary.cos_sin_table
        if (embedding.dtype != torch.float32 or not embedding.is_contiguous() or table.dtype != torch.float32
                or not table.is_contiguous() or not _held(draft.fc_weight, draft.fc_scales)):
            return None
        return CompiledEagleHead(kernels, draft, kv_caches)

    def forward(self, input_ids: torch.Tensor, states: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor | None:
        """input_ids [n] int64, states [n, hidden] float32, positions [n] int64 -> the head's
        predicted states [n, hidden] (its KV written), or None where the call does not apply."""
        return self.fused.run_eagle(input_ids, self.embedding, states, self.draft.fc_weight, self.draft.fc_scales,
                                    self.cos_sin_table, positions, self.kv_caches, meta)

    def top1(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """states [n, hidden] -> ([n] target token ids, [n] float32 their probabilities), as
        draft_model.top_draft_tokens_with_prob(..., 1) gives them, or None where the call does
        not apply."""
        if (not self.tops or states.dtype != torch.float32
                or not 1 <= states.shape[0] <= small_rows_linear.SKINNY_MAX_ROWS):
            return None
        draft = self.draft
        assert draft.head_weight is not None and draft.vocab_ids is not None
        return self.kernels.draft_top1(states.contiguous(), draft.head_weight, draft.head_scales, draft.vocab_ids)
