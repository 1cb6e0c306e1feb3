"""Repetition, presence and frequency penalties.

Semantics:
- repetition_penalty (Hugging Face / CTRL): every token that occurs in the prompt or in the
  output so far has its logit divided by the penalty when positive and multiplied by it when
  negative, so a penalty > 1 always makes a seen token less likely.
- presence_penalty and frequency_penalty (OpenAI): over the output tokens only,
  logit -= presence_penalty * [count > 0] + frequency_penalty * count.
Repetition is applied first, then presence and frequency (the order vLLM uses).

Token ids are padded with `vocab_size` and scattered into a [B, V + 1] buffer whose last column is
dropped, so padding needs no mask and rows of different lengths share one tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class PenaltyTensors:
    """Per-row penalties and the token ids they look at. A part is None when no row uses it."""

    # None when no row has a repetition penalty; rows without one hold 1.0.
    repetition_penalties: torch.Tensor | None  # [num_reqs] float32
    # Prompt ids of the rows with a repetition penalty (others are all padding), or None with it.
    prompt_token_ids: torch.Tensor | None  # [num_reqs, max_prompt_len] int64, padded with vocab_size
    # None when no row has a presence or frequency penalty; rows without hold 0.0.
    presence_penalties: torch.Tensor | None  # [num_reqs] float32
    frequency_penalties: torch.Tensor | None  # [num_reqs] float32
    # Output ids of the rows with any penalty (others are all padding).
    output_token_ids: torch.Tensor  # [num_reqs, max_output_len] int64, padded with vocab_size

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        prompt_token_ids: Sequence[Sequence[int]],
        output_token_ids: Sequence[Sequence[int]],
        vocab_size: int,
        device: torch.device,
    ) -> PenaltyTensors:
        """Copies only the token ids of rows that need them: prompts for repetition penalties,
        outputs for any penalty. Rows without penalties contribute empty (all-padding) rows."""
        uses_repetition = [p.repetition_penalty != 1.0 for p in params]
        uses_additive = [p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params]
        any_repetition = any(uses_repetition)
        any_additive = any(uses_additive)
        prompts = [ids if rep else () for ids, rep in zip(prompt_token_ids, uses_repetition)]
        outputs = [ids if rep or add else () for ids, rep, add in zip(output_token_ids, uses_repetition, uses_additive)]
        return cls(
            repetition_penalties=(_floats([p.repetition_penalty for p in params], device)
                                  if any_repetition else None),
            prompt_token_ids=_padded(prompts, vocab_size, device) if any_repetition else None,
            presence_penalties=_floats([p.presence_penalty for p in params], device) if any_additive else None,
            frequency_penalties=_floats([p.frequency_penalty for p in params], device) if any_additive else None,
            output_token_ids=_padded(outputs, vocab_size, device),
        )


def apply_penalties(logits: torch.Tensor, penalties: PenaltyTensors) -> None:
    """Applies the penalties to logits in place.

    logits: [num_reqs, vocab_size] float32
    """
    num_reqs, vocab_size = logits.shape
    output_ids = penalties.output_token_ids  # [num_reqs, max_output_len]
    output_counts = torch.zeros(num_reqs, vocab_size + 1, dtype=logits.dtype, device=logits.device)
    output_counts.scatter_add_(1, output_ids, torch.ones_like(output_ids, dtype=logits.dtype))
    output_counts = output_counts[:, :vocab_size]  # [num_reqs, vocab_size]; drop the padding column

    if penalties.repetition_penalties is not None:
        assert penalties.prompt_token_ids is not None
        seen = torch.zeros(num_reqs, vocab_size + 1, dtype=torch.bool, device=logits.device)
        seen.scatter_(1, penalties.prompt_token_ids, True)
        seen = seen[:, :vocab_size] | (output_counts > 0)  # [num_reqs, vocab_size]
        penalty = torch.where(seen, penalties.repetition_penalties.unsqueeze(1), 1.0)
        # Divide (not multiply by the reciprocal) so the result is exactly the HF definition.
        logits.copy_(torch.where(logits > 0, logits / penalty, logits * penalty))

    if penalties.presence_penalties is not None:
        assert penalties.frequency_penalties is not None
        logits.sub_(penalties.frequency_penalties.unsqueeze(1) * output_counts)
        logits.sub_(penalties.presence_penalties.unsqueeze(1) * (output_counts > 0).to(logits.dtype))


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`; on CUDA through pinned memory so the copy does not block."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor if device.type == "cpu" else tensor.to(device)


def _floats(values: list[float], device: torch.device) -> torch.Tensor:  # [len(values)] float32
    return host_to_device(torch.tensor(values, dtype=torch.float32), device)


def _padded(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> torch.Tensor:
    """Rows of token ids as one [len(rows), longest] int64 tensor padded with pad_id."""
    width = max((len(r) for r in rows), default=0)
    array = np.full((len(rows), width), pad_id, dtype=np.int64)
    for i, r in enumerate(rows):
        if len(r):
            array[i, : len(r)] = r
    return host_to_device(torch.from_numpy(array), device)
