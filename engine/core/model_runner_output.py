"""What the model runner returns to the scheduler after a step. Data only, no torch: the runner
converts its tensors to Python lists once per step (one device sync)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class TokenLogprobs(NamedTuple):
    """Logprobs of one generated token: the sampled token's own logprob and the top
    (token_id, logprob) pairs, best first (as many as the request asked for; may be empty)."""

    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]]


@dataclass(slots=True)
class ModelRunnerOutput:
    # One row per request scheduled in the step, in any order.
    req_ids: list[str]
    # Per row: [] for a request still mid-prefill; 1 token normally; with speculation the
    # accepted drafts followed by one bonus/recovered token (1 .. 1 + num drafts).
    sampled_token_ids: list[list[int]]
    # Per row: one entry per sampled token, or None when the request asked for no logprobs;
    # None for the whole step when no request did.
    logprobs: list[list[TokenLogprobs] | None] | None = None
    # Speculative decoding: draft tokens proposed for the next step, by request (only requests
    # that just sampled and will decode next); None when speculation is off.
    spec_token_ids: dict[str, list[int]] | None = None

    def __post_init__(self) -> None:
        if len(self.req_ids) != len(self.sampled_token_ids):
            raise ValueError(
                f"sampled_token_ids has {len(self.sampled_token_ids)} rows for {len(self.req_ids)} req_ids"
            )
        if self.logprobs is not None and len(self.logprobs) != len(self.req_ids):
            raise ValueError(f"logprobs has {len(self.logprobs)} rows for {len(self.req_ids)} req_ids")

    @classmethod
    def empty(cls) -> ModelRunnerOutput:
        return cls(req_ids=[], sampled_token_ids=[])
