"""Batched sampling parameters for one step: one row per request that samples.

`SamplingMetadata.build` runs every step for every sampling request, so it does only the work the
batch needs: a batch of plain greedy requests builds no tensor at all, and the [B, V]-sized work
of penalties happens only when some row uses a penalty. Host-side facts the sampler branches on
(all_greedy, max_top_k, ...) are computed here from the Python parameters, so the sampler never
reads a device value back (no host sync on CUDA).

Greedy rows are neutral in every random-path tensor (temperature 1.0, top_k off, top_p 1.0,
min_p 0.0, no generator): in a mixed batch the sampler runs the random path over all rows and
then takes the argmax for the greedy ones, so their entries must cost nothing and trigger nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.sample.penalties import PenaltyTensors, host_to_device
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class SparseLogitUpdate:
    """Additions to a few (row, token) cells of the logits, applied with one index_put_.

    Used for logit_bias (finite values) and for the min_tokens mask (-inf values). Every
    (row, token) pair appears at most once.
    """

    row_ids: torch.Tensor  # [num_entries] int64
    token_ids: torch.Tensor  # [num_entries] int64
    values: torch.Tensor  # [num_entries] float32

    def apply_(self, logits: torch.Tensor) -> None:  # logits: [num_reqs, vocab_size] float32
        logits.index_put_((self.row_ids, self.token_ids), self.values, accumulate=True)


@dataclass(frozen=True)
class SamplingMetadata:
    """Everything the sampler needs for one step, as device tensors plus host-side flags."""

    num_reqs: int
    all_greedy: bool  # no row samples at random (True for an empty batch)
    all_random: bool  # no row is greedy (True for an empty batch)
    # None when all_greedy. Greedy rows hold 1.0, so dividing by it is a no-op.
    temperature: torch.Tensor | None  # [num_reqs] float32
    # None unless the batch mixes greedy and random rows.
    is_greedy: torch.Tensor | None  # [num_reqs] bool
    # None when no random row uses top-k; rows without it hold vocab_size (keep everything).
    top_k: torch.Tensor | None  # [num_reqs] int64
    max_top_k: int  # the largest enabled top_k (host copy; 0 when top_k is None)
    # None when no random row uses top-p; rows without it hold 1.0.
    top_p: torch.Tensor | None  # [num_reqs] float32
    # None when no random row uses min-p; rows without it hold 0.0.
    min_p: torch.Tensor | None  # [num_reqs] float32
    # Seeded random rows draw their noise from a generator of their own, seeded by (seed, the
    # output position the row samples): row index -> generator (see position_seed).
    generators: dict[int, torch.Generator]
    penalties: PenaltyTensors | None
    logit_bias: SparseLogitUpdate | None
    # -inf on EOS and stop_token_ids for rows that have fewer than min_tokens outputs.
    min_tokens_mask: SparseLogitUpdate | None
    # The most top logprobs any row asked for (0: only the sampled token); None: no row asked.
    max_num_logprobs: int | None
    # Each row's own `logprobs` parameter, so results can be trimmed per request.
    num_logprobs: list[int | None]
    # Constrained decoding: bit i of word w allows token 32w + i; unconstrained rows are all
    # ones (-1). None when no row is constrained.
    token_bitmask: torch.Tensor | None = None  # [num_reqs, ceil(vocab_size / 32)] int32

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        prompt_token_ids: Sequence[Sequence[int]],
        output_token_ids: Sequence[Sequence[int]],
        eos_token_ids: frozenset[int],
        vocab_size: int,
        device: torch.device | str,
        token_bitmasks: Sequence[np.ndarray | None] | None = None,
    ) -> SamplingMetadata:
        """Builds the metadata for `len(params)` rows.

        A seeded random row gets a generator seeded by position_seed(seed, len(its outputs)):
        the noise that picks output token n depends on the seed and n only, so a seed fixes the
        whole sequence whatever the batch, and a verification row (whose outputs include the
        drafts before it) draws exactly the noise plain decoding would draw there.
        Token ids in logit_bias and stop_token_ids are checked against vocab_size.
        token_bitmasks: per row, the packed bitmask of the tokens its grammar allows
        ([ceil(vocab_size / 32)] int32), or None for an unconstrained row.
        """
        num_reqs = len(params)
        if len(prompt_token_ids) != num_reqs or len(output_token_ids) != num_reqs:
            raise ValueError(
                f"prompt_token_ids ({len(prompt_token_ids)}) and output_token_ids ({len(output_token_ids)}) "
                f"must have one entry per row of params ({num_reqs})")
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        device = torch.device(device)

        temperatures: list[float] = []
        greedy_rows: list[bool] = []
        top_ks: list[int] = []
        top_ps: list[float] = []
        min_ps: list[float] = []
        row_generators: dict[int, torch.Generator] = {}
        uses_top_k = uses_top_p = uses_min_p = uses_penalties = False
        bias_rows: list[int] = []
        bias_tokens: list[int] = []
        bias_values: list[float] = []
        mask_rows: list[int] = []
        mask_tokens: list[int] = []
        max_num_logprobs: int | None = None
        num_logprobs: list[int | None] = []

        for row, p in enumerate(params):
            greedy = p.greedy
            greedy_rows.append(greedy)
            if greedy:
                temperatures.append(1.0)
                top_ks.append(vocab_size)
                top_ps.append(1.0)
                min_ps.append(0.0)
            else:
                temperatures.append(p.temperature)
                # 0 and -1 disable top-k; a k at or above the vocabulary keeps everything.
                k = vocab_size if p.top_k <= 0 else min(p.top_k, vocab_size)
                top_ks.append(k)
                uses_top_k |= k < vocab_size
                top_ps.append(p.top_p)
                uses_top_p |= p.top_p < 1.0
                min_ps.append(p.min_p)
                uses_min_p |= p.min_p > 0.0
                if p.seed is not None:
                    row_generators[row] = make_generator(position_seed(p.seed, len(output_token_ids[row])), device)
            uses_penalties |= (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
                               or p.repetition_penalty != 1.0)
            if p.logit_bias or p.stop_token_ids:
                p.validate_vocab(vocab_size)
            if p.logit_bias:
                for token_id, bias in p.logit_bias.items():
                    bias_rows.append(row)
                    bias_tokens.append(token_id)
                    bias_values.append(bias)
            if p.min_tokens > len(output_token_ids[row]):
                # Only sampling is constrained here; ignore_eos (which only affects stopping)
                # does not lift the mask.
                blocked = eos_token_ids.union(p.stop_token_ids)
                for token_id in blocked:
                    if not 0 <= token_id < vocab_size:
                        raise ValueError(f"eos_token_ids: token id {token_id} is outside the vocabulary ({vocab_size})")
                mask_rows.extend([row] * len(blocked))
                mask_tokens.extend(sorted(blocked))
            num_logprobs.append(p.logprobs)
            if p.logprobs is not None:
                max_num_logprobs = p.logprobs if max_num_logprobs is None else max(max_num_logprobs, p.logprobs)

        all_greedy = all(greedy_rows)
        all_random = not any(greedy_rows)
        return cls(
            num_reqs=num_reqs,
            all_greedy=all_greedy,
            all_random=all_random,
            temperature=None if all_greedy else to_device(temperatures, torch.float32, device),
            is_greedy=None if all_greedy or all_random else to_device(greedy_rows, torch.bool, device),
            top_k=to_device(top_ks, torch.int64, device) if uses_top_k else None,
            max_top_k=max(k for k in top_ks if k < vocab_size) if uses_top_k else 0,
            top_p=to_device(top_ps, torch.float32, device) if uses_top_p else None,
            min_p=to_device(min_ps, torch.float32, device) if uses_min_p else None,
            generators=row_generators,
            penalties=(PenaltyTensors.build(params, prompt_token_ids, output_token_ids, vocab_size, device)
                       if uses_penalties else None),
            logit_bias=_sparse(bias_rows, bias_tokens, bias_values, device) if bias_rows else None,
            min_tokens_mask=(_sparse(mask_rows, mask_tokens, [float("-inf")] * len(mask_rows), device)
                             if mask_rows else None),
            max_num_logprobs=max_num_logprobs,
            num_logprobs=num_logprobs,
            token_bitmask=_stack_bitmasks(token_bitmasks, num_reqs, vocab_size, device),
        )


def _stack_bitmasks(rows: Sequence[np.ndarray | None] | None, num_reqs: int, vocab_size: int,
                    device: torch.device) -> torch.Tensor | None:  # [num_reqs, ceil(vocab_size / 32)] int32
    if rows is None or all(row is None for row in rows):
        return None
    if len(rows) != num_reqs:
        raise ValueError(f"token_bitmasks has {len(rows)} rows for {num_reqs} requests")
    packed = np.full((num_reqs, (vocab_size + 31) // 32), -1, dtype=np.int32)
    for index, row in enumerate(rows):
        if row is not None:
            packed[index] = row
    return host_to_device(torch.from_numpy(packed), device)


def position_seed(seed: int, position: int) -> int:
    """The seed of the noise that samples output token `position` of a request seeded `seed`:
    splitmix64 of the pair, so nearby seeds and positions give unrelated streams."""
    mask = (1 << 64) - 1
    z = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xD1B54A32D192ED03) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return (z ^ (z >> 31)) >> 1  # 63 bits: any torch generator takes it


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A generator on `device` seeded with `seed`."""
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(seed)
    return generator


def to_device(values: Sequence[object], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a device tensor; on CUDA through pinned memory so the copy does not block."""
    return host_to_device(torch.tensor(values, dtype=dtype), device)


def _sparse(rows: list[int], tokens: list[int], values: list[float], device: torch.device) -> SparseLogitUpdate:
    return SparseLogitUpdate(
        row_ids=to_device(rows, torch.int64, device),
        token_ids=to_device(tokens, torch.int64, device),
        values=to_device(values, torch.float32, device),
    )
