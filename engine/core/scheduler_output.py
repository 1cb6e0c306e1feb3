"""What the scheduler hands to the model runner each step, and what it hands back to the engine
core per request after the step. Data only: plain values, no torch, no live Request objects
(the runner keeps its own per-request state and must not reach into the scheduler's).

Runner contract:
- drop the state of every id in `finished_req_ids` and `preempted_req_ids` first;
- `scheduled_new_reqs` are requests the runner has no state for: admitted for the first time or
  resumed after preemption (then `prompt_token_ids + output_token_ids` is everything to recompute);
- `scheduled_cached_reqs` continue: append `new_block_ids` to the request's block table;
- request r processes tokens at positions
  [num_computed_tokens, num_computed_tokens + num_scheduled_tokens[r]) of its token ids followed
  by `scheduled_spec_decode_tokens.get(r, [])`; it samples only when that range reaches the end
  of its real tokens (otherwise it is mid-prefill and returns no token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.core.model_runner_output import TokenLogprobs


@dataclass(slots=True)
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    # Non-empty only for a request resumed after preemption.
    output_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    # Tokens already in the KV cache (a prefix hit); the runner computes from here.
    num_computed_tokens: int
    eos_token_ids: frozenset[int] = frozenset()


@dataclass(slots=True)
class CachedRequestData:
    req_id: str
    new_block_ids: list[int]
    num_computed_tokens: int


@dataclass(slots=True)
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: list[CachedRequestData]
    # req_id -> tokens scheduled this step (always > 0), drafts included.
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # req_id -> draft tokens to verify this step (only requests that have some).
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # Finished or aborted since the previous schedule().
    finished_req_ids: set[str] = field(default_factory=set)
    # Preempted during this schedule(): their blocks are already back in the pool.
    preempted_req_ids: set[str] = field(default_factory=set)

    @property
    def num_scheduled_reqs(self) -> int:
        return len(self.num_scheduled_tokens)

    @classmethod
    def empty(cls) -> SchedulerOutput:
        return cls(scheduled_new_reqs=[], scheduled_cached_reqs=[], num_scheduled_tokens={},
                   total_num_scheduled_tokens=0)


@dataclass(slots=True)
class RequestStepResult:
    """One request's news after a step: the tokens it gained (after stop checks) and, when it
    finished, why. Only requests that produced tokens or finished get one."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] | None
    finish_reason: str | None  # "stop", "length", "abort", "error" or None while running
    stop_reason: int | str | None  # the stop token id (or stop string) that ended it
    num_cached_tokens: int  # prompt tokens served from the prefix cache at first scheduling
    num_prompt_tokens: int

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
