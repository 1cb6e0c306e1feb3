"""What one step's attention needs to know about the flattened batch. Built by the model runner.

Tokens of all scheduled requests are concatenated (request i owns query rows
query_start_loc[i]:query_start_loc[i+1]); every request's new keys/values go to slot_mapping,
then each query attends to its request's first seq_lens[i] cached tokens, causally.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: block_id * block_size + offset of each new token
    block_table: torch.Tensor  # [num_reqs, max_blocks_per_req] int32
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32, on the device
    seq_lens: torch.Tensor  # [num_reqs] int32, on the device
    # Host copies, so that the torch path never synchronizes with the device.
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    max_query_len: int
    max_seq_len: int
    # Shape-only precomputation shared by every layer of the step (kernels.plan_attention),
    # keyed by sliding window; filled lazily by the attention layers.
    plans: dict[Any, Any] = field(default_factory=dict)

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens_cpu)

    @classmethod
    def build(
        cls,
        *,
        query_lens: list[int],
        seq_lens: list[int],
        block_ids: list[list[int]],
        block_size: int,
        device: torch.device | str,
    ) -> AttentionMetadata:
        """Builds metadata from host lists (tests and simple callers; the runner fills
        preallocated buffers instead). Request i's new tokens sit at positions
        seq_lens[i] - query_lens[i] .. seq_lens[i] - 1."""
        slots: list[int] = []
        for q_len, s_len, blocks in zip(query_lens, seq_lens, block_ids, strict=True):
            if s_len > len(blocks) * block_size:
                raise ValueError(f"seq_len {s_len} needs more than the {len(blocks)} blocks given")
            for pos in range(s_len - q_len, s_len):
                slots.append(blocks[pos // block_size] * block_size + pos % block_size)
        max_blocks = max(len(b) for b in block_ids)
        table = [b + [0] * (max_blocks - len(b)) for b in block_ids]
        starts = [0]
        for q_len in query_lens:
            starts.append(starts[-1] + q_len)
        return cls(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_table=torch.tensor(table, dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            query_start_loc_cpu=starts,
            seq_lens_cpu=list(seq_lens),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
        )
