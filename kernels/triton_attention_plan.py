"""Launch plan of the Triton paged attention (kernels/triton_paged_attention.py): which query
tokens each program's tile covers and how many key splits a step uses. Host-side and shape-only,
built once per step and shared by every layer; no triton import, so dispatch code can name it on
any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# Below this many keys per split, splitting costs more (merge, extra programs) than it saves.
_MIN_KEYS_PER_SPLIT = 256
_MAX_SPLITS = 32


@dataclass
class TritonAttentionPlan:
    """Per-step, shape-only launch data shared by every layer (built by plan_attention_triton)."""

    tile_req: torch.Tensor  # [num_tiles] int32: the request of each tile
    tile_q_start: torch.Tensor  # [num_tiles] int32: its first query token, counted within the request
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32, on the device
    seq_lens: torch.Tensor  # [num_reqs] int32, on the device
    block_q: int
    num_splits: int
    sliding_window: int | None
    num_tokens: int


def _block_q(max_query_len: int, group: int) -> int:
    """Query tokens per tile: enough rows for a tensor-core dot (>= 16), up to 128 rows."""
    if max_query_len == 1:
        rows = max(16, _next_power_of_2(group))
    else:
        rows = max(16, min(128, _next_power_of_2(max_query_len * group)))
    return max(1, rows // group)


def plan_attention_triton(
    query_start_loc: list[int],  # num_reqs + 1 (host ints)
    seq_lens: list[int],  # num_reqs (host ints)
    num_heads: int,
    num_kv_heads: int,
    sliding_window: int | None,
    device: torch.device,
    num_programs_target: int | None = None,
    min_keys_per_split: int = _MIN_KEYS_PER_SPLIT,
) -> TritonAttentionPlan:
    """num_programs_target: how many programs fill the device (default: two per SM);
    min_keys_per_split: the shortest key range worth its own split (tests lower both)."""
    group = num_heads // num_kv_heads
    query_lens = [b - a for a, b in zip(query_start_loc, query_start_loc[1:])]
    max_query_len = max(query_lens) if query_lens else 1
    block_q = _block_q(max_query_len, group)
    tile_req: list[int] = []
    tile_q_start: list[int] = []
    for req, query_len in enumerate(query_lens):
        for start in range(0, query_len, block_q):
            tile_req.append(req)
            tile_q_start.append(start)
    if num_programs_target is None:
        num_programs_target = 2 * _num_sms(device)
    programs = max(1, len(tile_req) * num_kv_heads)
    longest = max(seq_lens) if seq_lens else 0
    if sliding_window is not None:
        longest = min(longest, sliding_window + max_query_len)
    num_splits = 1
    if programs < num_programs_target:
        wanted = _cdiv(num_programs_target, programs)
        num_splits = max(1, min(wanted, _MAX_SPLITS, longest // min_keys_per_split))
        num_splits = 1 << (num_splits.bit_length() - 1)  # a power of two: the merge kernel's arange
    host = torch.tensor([tile_req, tile_q_start], dtype=torch.int32).view(2, -1)
    lens = torch.tensor(list(query_start_loc) + list(seq_lens), dtype=torch.int32)
    host, lens = host.to(device, non_blocking=True), lens.to(device, non_blocking=True)
    num_reqs = len(seq_lens)
    return TritonAttentionPlan(host[0], host[1], lens[: num_reqs + 1], lens[num_reqs + 1:], block_q, num_splits,
                               sliding_window, query_start_loc[-1] if query_start_loc else 0)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter on CPU: small numbers keep tests fast but still exercise splits
