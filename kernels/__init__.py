"""Compute kernels: Triton on CUDA, torch references elsewhere. Imports nothing of ours.

Each public function dispatches on the device of its tensors. The Triton kernels land with the
kernels issue; until then every device uses the torch reference, which is also the CPU path.
"""

from __future__ import annotations

from kernels.kv_store import store_kv_ref
from kernels.paged_attention import AttentionPlan, paged_attention_ref, plan_attention

store_kv = store_kv_ref
paged_attention = paged_attention_ref

__all__ = ["AttentionPlan", "paged_attention", "paged_attention_ref", "plan_attention", "store_kv", "store_kv_ref"]
