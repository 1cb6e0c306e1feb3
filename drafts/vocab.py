"""Reduced draft vocabulary: the target tokens the draft may propose.

The output head is a large share of a small draft's cost (SmolLM2: 49152 x 576, as many
weights as five of its layers). Tokens the target almost never writes are almost never
accepted either, so the draft keeps the most frequent tokens of the distillation data (where
the target's own transcripts stand for what it writes) plus every special token (end of turn
must always be proposable: a draft that cannot propose <|im_end|> rejects every final step).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch


def select_draft_vocab(token_counts: np.ndarray,  # [target_vocab] int64 occurrences in the data
                       size: int, always: Iterable[int]) -> torch.Tensor:  # [size] int64 sorted ids
    """The `size` most frequent ids, `always` included first; ties broken by lower id (stable)."""
    vocab_size = len(token_counts)
    if not 1 <= size <= vocab_size:
        raise ValueError(f"draft_vocab_size must be in 1..{vocab_size} (the target's vocabulary), got {size}")
    forced = sorted({int(i) for i in always if 0 <= int(i) < vocab_size})
    if len(forced) > size:
        raise ValueError(f"draft_vocab_size {size} is smaller than the {len(forced)} special tokens it must hold")
    chosen = set(forced)
    # argsort of -counts with a stable sort: most frequent first, lower id first among equals.
    for token_id in np.argsort(-token_counts, kind="stable"):
        if len(chosen) >= size:
            break
        chosen.add(int(token_id))
    return torch.tensor(sorted(chosen), dtype=torch.int64)


def count_tokens(tokens: np.ndarray, vocab_size: int) -> np.ndarray:  # [num_tokens] -> [vocab_size] int64
    return np.bincount(tokens.astype(np.int64), minlength=vocab_size)[:vocab_size]


def target_to_draft_map(vocab_ids: torch.Tensor,  # [num_outputs] int64 sorted target ids
                        vocab_size: int) -> torch.Tensor:  # [vocab_size] int64: output row, -1 if absent
    mapping = torch.full((vocab_size,), -1, dtype=torch.int64, device=vocab_ids.device)
    mapping[vocab_ids] = torch.arange(len(vocab_ids), device=vocab_ids.device)
    return mapping
