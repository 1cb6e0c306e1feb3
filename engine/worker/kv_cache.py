"""KV cache tensors: geometry, sizing from a memory budget, allocation.

All layers' caches live in one allocation, [num_layers, 2, num_blocks, num_kv_heads, block_size,
head_dim]; layer i's view is [2, num_blocks, num_kv_heads, block_size, head_dim] (head-major blocks,
see kernels/kv_store.py). Block ids come
from the torch-free KVCacheManager and index dimension 2 of every layer alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.worker.huge_pages import zeros_in_huge_pages
from kernels.kv_store import FP8KVCache

# CPU default when no budget is configured: a quarter of available memory, at most 4 GiB.
_CPU_DEFAULT_MAX_BYTES = 4 << 30


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype  # the model's dtype
    # What the cache stores: None (the model dtype) or torch.float8_e4m3fn, which adds a float32
    # scale per stored (token, kv head) vector (kernels/kv_store.py).
    cache_dtype: torch.dtype | None = None

    @property
    def storage_dtype(self) -> torch.dtype:
        return self.cache_dtype or self.dtype

    @property
    def is_fp8(self) -> bool:
        return self.storage_dtype == torch.float8_e4m3fn

    @property
    def bytes_per_block(self) -> int:
        element_size = torch.empty((), dtype=self.storage_dtype).element_size()
        bytes_per_vector = self.head_dim * element_size + (4 if self.is_fp8 else 0)
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * bytes_per_vector


def kv_cache_torch_dtype(kv_cache_dtype: str) -> torch.dtype | None:
    """CacheConfig.kv_cache_dtype -> KVCacheSpec.cache_dtype."""
    return torch.float8_e4m3fn if kv_cache_dtype == "fp8" else None


def cpu_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux); a conservative 8 GiB guess elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def num_blocks_for_budget(spec: KVCacheSpec, budget_bytes: int, extra_bytes_per_block: int = 0) -> int:
    """extra_bytes_per_block: what each block costs beyond this spec (a draft model's pool)."""
    bytes_per_block = spec.bytes_per_block + extra_bytes_per_block
    num_blocks = budget_bytes // bytes_per_block
    if num_blocks < 1:
        raise ValueError(
            f"kv_cache_memory_bytes ({budget_bytes}) is smaller than one KV block ({bytes_per_block} bytes)"
        )
    return num_blocks


def default_cpu_budget_bytes() -> int:
    return min(cpu_available_bytes() // 4, _CPU_DEFAULT_MAX_BYTES)


def cuda_budget_bytes(device: torch.device, gpu_memory_utilization: float, peak_activation_bytes: int) -> int:
    """What KV may use on a CUDA device: the allowed share of total memory, minus what torch
    already holds (weights) and the measured activation peak of a profiling forward."""
    free_bytes, total_bytes = torch.cuda.mem_get_info(device)
    used_by_others = total_bytes - free_bytes - torch.cuda.memory_reserved(device)
    allowed = int(total_bytes * gpu_memory_utilization) - used_by_others
    budget = allowed - torch.cuda.memory_allocated(device) - peak_activation_bytes
    if budget <= 0:
        raise ValueError(
            f"no memory left for the KV cache on {device}: gpu_memory_utilization={gpu_memory_utilization} "
            f"allows {allowed / 2**30:.1f} GiB, weights and activations need more"
        )
    return budget


def allocate_kv_caches(spec: KVCacheSpec, num_blocks: int, device: torch.device, *,
                       huge_pages: bool = False) -> list[torch.Tensor] | list[FP8KVCache]:
    """One [2, num_blocks, num_kv_heads, block_size, head_dim] view per layer; for an fp8 spec,
    one FP8KVCache (that view in float8_e4m3fn plus its [2, num_blocks, num_kv_heads,
    block_size] float32 scales) per layer. huge_pages: on a CPU, the memory in 2 MiB pages where
    Linux allows it (engine/worker/huge_pages.py)."""
    # zeros, not empty: attention reads padded key slots of the last block (masked out, but a
    # NaN from uninitialised memory times a zero weight is still NaN).
    shape = (spec.num_layers, 2, num_blocks, spec.num_kv_heads, spec.block_size, spec.head_dim)
    if huge_pages and device.type == "cpu":
        storage = zeros_in_huge_pages(shape, spec.storage_dtype)
    else:
        storage = torch.zeros(shape, dtype=spec.storage_dtype, device=device)
    if not spec.is_fp8:
        return list(storage.unbind(0))
    scales = torch.zeros((spec.num_layers, 2, num_blocks, spec.num_kv_heads, spec.block_size),
                         dtype=torch.float32, device=device)
    return [FP8KVCache(data, layer_scales) for data, layer_scales in zip(storage.unbind(0), scales.unbind(0))]
