"""The model runner's per-request state and the flattening of one step into model inputs.

The runner keeps its own copy of each running request's tokens and blocks (the scheduler only
sends what changed); `build_step_inputs` turns a SchedulerOutput into flat host arrays:
token ids, positions and KV slots of every scheduled token, per-request query/sequence lengths,
the block table, and which rows produce logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.sampling_params import SamplingParams


@dataclass
class CachedRequestState:
    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    # Drafted tokens scheduled for verification this step (speculative decoding).
    spec_token_ids: list[int] = field(default_factory=list)
    # Runners-up for the first of spec_token_ids, verified in rows of their own
    # (engine/worker/alternatives.py); set with the proposal, used by the next step only.
    spec_alternatives: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_at(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output + drafts."""
        num_prompt = len(self.prompt_token_ids)
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        tail = self.output_token_ids + self.spec_token_ids
        if start >= num_prompt:
            return tail[start - num_prompt : end - num_prompt]
        return self.prompt_token_ids[start:] + tail[: end - num_prompt]


@dataclass
class StepInputs:
    req_ids: list[str]  # scheduled requests, in row order
    input_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    slot_mapping: np.ndarray  # [num_tokens] int64
    query_start_loc: list[int]  # num_reqs + 1
    seq_lens: list[int]  # num_reqs
    block_table: np.ndarray  # [num_reqs, max_blocks] int32
    # Rows (request indices) that sample this step. Each gets logits at its last real token and
    # at every draft after it (1 + num drafts rows, consecutive in logits_indices).
    sample_rows: list[int]
    num_logits: list[int]  # per sample row
    logits_indices: np.ndarray  # [sum(num_logits)] int64 flat token indices


def build_step_inputs(
    states: dict[str, CachedRequestState],
    req_ids: list[str],
    num_scheduled_tokens: dict[str, int],
    block_size: int,
) -> StepInputs:
    num_reqs = len(req_ids)
    query_lens = [num_scheduled_tokens[r] for r in req_ids]
    total = sum(query_lens)
    input_ids = np.empty(total, dtype=np.int64)
    positions = np.empty(total, dtype=np.int64)
    query_start_loc = [0] * (num_reqs + 1)
    seq_lens = [0] * num_reqs
    max_blocks = max(len(states[r].block_ids) for r in req_ids)
    block_table = np.zeros((num_reqs, max_blocks), dtype=np.int32)
    sample_rows: list[int] = []
    num_logits: list[int] = []
    logits_indices: list[int] = []

    offset = 0
    for row, req_id in enumerate(req_ids):
        state = states[req_id]
        start = state.num_computed_tokens
        n = query_lens[row]
        end = start + n
        input_ids[offset : offset + n] = state.token_at(start, end)
        positions[offset : offset + n] = np.arange(start, end)
        block_table[row, : len(state.block_ids)] = state.block_ids
        seq_lens[row] = end
        offset += n
        query_start_loc[row + 1] = offset
        # A request samples once every real token is in context; a prefill chunk that stops
        # short of the end produces nothing. Positions num_tokens-1 .. end-1 predict the first
        # draft .. the bonus token.
        if end >= state.num_tokens:
            first = offset - (end - state.num_tokens + 1)
            sample_rows.append(row)
            num_logits.append(offset - first)
            logits_indices.extend(range(first, offset))

    # Slots: for each token, its request's block at position // block_size.
    row_of_token = np.repeat(np.arange(num_reqs), query_lens)
    block_ids = block_table[row_of_token, positions // block_size].astype(np.int64)
    slot_mapping = block_ids * block_size + positions % block_size
    return StepInputs(
        req_ids=req_ids,
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_table=block_table,
        sample_rows=sample_rows,
        num_logits=num_logits,
        logits_indices=np.asarray(logits_indices, dtype=np.int64),
    )
