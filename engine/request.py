"""A request as the engine core sees it: token ids, progress counters and status. No torch.

Catch-up invariant: `num_computed_tokens <= num_tokens_with_spec`; each step the scheduler gives
the request `num_tokens_with_spec - num_computed_tokens` tokens (or fewer, under the budget).
Prefill, chunked prefill, prefix hits and speculative verification are all this one case.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence

from engine.sampling_params import SamplingParams

# A prefix-cache key: chained hash of one full block of token ids (see engine/core/block_hash.py).
BlockHash = bytes


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    # Everything after this line is finished.
    FINISHED_STOPPED = 3  # EOS, a stop token id or a stop string
    FINISHED_LENGTH_CAPPED = 4  # max_tokens or the model's context length
    FINISHED_ABORTED = 5  # the client went away or asked to cancel
    FINISHED_IGNORED = 6  # refused at admission (could never fit)

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status >= RequestStatus.FINISHED_STOPPED


FINISH_REASONS: dict[RequestStatus, str] = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_IGNORED: "error",
}


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams,
        *,
        eos_token_ids: frozenset[int] = frozenset(),
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        block_hasher: Callable[[Request], list[BlockHash]] | None = None,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("prompt must contain at least one token")
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_token_ids
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.priority = priority  # lower value = more urgent
        self.cache_salt = cache_salt

        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        # Draft tokens proposed for verification in the next step (speculative decoding).
        self.spec_token_ids: list[int] = []

        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        # Prompt tokens served from the prefix cache at first scheduling (-1: not scheduled yet).
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        # Why it stopped: the stop token id or the stop string, when that was the reason.
        self.stop_reason: int | str | None = None

        # Chained hashes of every full block of all_token_ids, kept current by append.
        self._block_hasher = block_hasher
        self.block_hashes: list[BlockHash] = []
        self._update_block_hashes()

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def max_tokens(self) -> int | None:
        return self.sampling_params.max_tokens

    # ---- state -------------------------------------------------------------------------------
    @property
    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)
        self._update_block_hashes()

    def _update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def __lt__(self, other: Request) -> bool:
        # Heap order for the waiting queue under the priority policy.
        return (self.priority, self.arrival_time, self.request_id) < (
            other.priority,
            other.arrival_time,
            other.request_id,
        )

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, prompt={self.num_prompt_tokens}, "
            f"output={self.num_output_tokens}, computed={self.num_computed_tokens})"
        )
