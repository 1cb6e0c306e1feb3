"""Continuous batching by the catch-up rule (vLLM v1's idea), without torch.

Each request has num_computed_tokens and num_tokens_with_spec; every step the scheduler gives it
tokens so that the first catches up with the second. Prefill, chunked prefill, prefix hits,
decode and speculative verification are all that one case; there are no phases.

One `schedule()`:
1. running requests, in order, each get min(num_tokens_with_spec - num_computed_tokens, budget
   left, long_prefill_token_threshold, room left in the context). When the pool has no blocks
   for one, the lowest-priority running request is preempted by recompute (its blocks freed,
   num_computed_tokens 0, back to the front of the waiting queue) until it fits; a request may
   preempt itself, and then it is not scheduled;
2. only when nothing was preempted: waiting requests are admitted in policy order while budget,
   max_num_seqs and blocks allow, starting from their cached prefix, chunked when the rest does
   not fit the budget.
`update_from_output()` then advances the counters, rolls back rejected drafts, appends sampled
tokens with stop checks and frees finished requests.

Length rule: a request ends ("length") once it holds min(max_model_len, pool tokens) tokens, so
a single request always fits the pool alone and preemption can never loop forever.
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Iterable

from engine.config import CacheConfig, SchedulerConfig
from engine.core.kv_cache_manager import KVCacheManager, cdiv
from engine.core.model_runner_output import ModelRunnerOutput
from engine.core.scheduler_output import CachedRequestData, NewRequestData, RequestStepResult, SchedulerOutput
from engine.core.stats import SchedulerStats
from engine.request import Request, RequestStatus


class RequestRejectedError(ValueError):
    """A request that can never be served (too long for the model or the KV cache)."""


class _WaitingQueue:
    """fcfs: a deque in arrival order, preempted requests go to the front. priority: a heap by
    (priority, arrival_time, request_id); a preempted request re-enters by its own key, which
    puts it ahead of later arrivals of the same priority."""

    def __init__(self, policy: str) -> None:
        self._by_priority = policy == "priority"
        self._heap: list[Request] = []
        self._deque: collections.deque[Request] = collections.deque()

    def add(self, request: Request) -> None:
        if self._by_priority:
            heapq.heappush(self._heap, request)
        else:
            self._deque.append(request)

    def add_front(self, request: Request) -> None:
        if self._by_priority:
            heapq.heappush(self._heap, request)
        else:
            self._deque.appendleft(request)

    def peek(self) -> Request:
        return self._heap[0] if self._by_priority else self._deque[0]

    def pop(self) -> Request:
        return heapq.heappop(self._heap) if self._by_priority else self._deque.popleft()

    def remove(self, request: Request) -> None:
        if self._by_priority:
            self._heap.remove(request)
            heapq.heapify(self._heap)
        else:
            self._deque.remove(request)

    def __len__(self) -> int:
        return len(self._heap) if self._by_priority else len(self._deque)


class Scheduler:
    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        num_blocks: int,
        max_model_len: int,
        num_lookahead_tokens: int = 0,
    ) -> None:
        """num_lookahead_tokens: KV slots to reserve past each scheduled range for a draft
        model that writes its own proposals (0 without one)."""
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        if not scheduler_config.enable_chunked_prefill and scheduler_config.max_num_batched_tokens < max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({scheduler_config.max_num_batched_tokens}) must be >= max_model_len "
                f"({max_model_len}) when enable_chunked_prefill is False, or long prompts could never run"
            )
        self.config = scheduler_config
        self.block_size = cache_config.block_size
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len
        self.num_lookahead_tokens = num_lookahead_tokens
        self.enable_caching = cache_config.enable_prefix_caching
        self.kv_cache_manager = KVCacheManager(num_blocks, cache_config.block_size, cache_config.enable_prefix_caching)
        # The longest a request may grow: the model's context or the whole pool, whichever is less.
        self.max_num_tokens = min(max_model_len, num_blocks * cache_config.block_size)

        self.requests: dict[str, Request] = {}
        self.waiting = _WaitingQueue(scheduler_config.policy)
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        # Agent session of each request that named one (session retention and priority).
        self._session_of: dict[str, str] = {}
        self.num_preemptions = 0
        self.spec_num_draft_tokens = 0
        self.spec_num_accepted_tokens = 0
        self.spec_num_drafts = 0
        self.spec_accepted_per_pos: list[int] = []
        self.spec_drafted_per_pos: list[int] = []

    # ---- admission ---------------------------------------------------------------------------
    def add_request(self, request: Request, session_id: str | None = None) -> None:
        """Queues a request, or raises RequestRejectedError (its status set to FINISHED_IGNORED)
        when it could never run.

        session_id: the agent session it belongs to. When that session has blocks retained (its
        previous turn ended in tool calls), the request is the session's next turn: it goes ahead
        of requests of its own priority class (fcfs: to the front of the queue), and once it is
        admitted the retention is released, since the request now holds the blocks it hit."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in the scheduler")
        if request.status != RequestStatus.WAITING:
            raise ValueError(f"request {request.request_id!r} must be WAITING, got {request.status.name}")
        num_prompt_tokens = request.num_prompt_tokens
        if num_prompt_tokens >= self.max_model_len:
            request.status = RequestStatus.FINISHED_IGNORED
            raise RequestRejectedError(
                f"prompt has {num_prompt_tokens} tokens but the model's context (max_model_len) is "
                f"{self.max_model_len}; at least one token must be left for the output"
            )
        num_blocks_needed = cdiv(num_prompt_tokens + 1, self.block_size)
        if num_blocks_needed > self.num_blocks:
            request.status = RequestStatus.FINISHED_IGNORED
            raise RequestRejectedError(
                f"prompt has {num_prompt_tokens} tokens and needs {num_blocks_needed} KV-cache blocks of "
                f"{self.block_size} tokens (one token left for the output), but the whole KV cache holds "
                f"{self.num_blocks} blocks ({self.num_blocks * self.block_size} tokens)"
            )
        if self.enable_caching and len(request.block_hashes) != request.num_tokens // self.block_size:
            raise ValueError(
                f"request {request.request_id!r} has {len(request.block_hashes)} block hashes for "
                f"{request.num_tokens} tokens: create it with block_hasher=make_block_hasher({self.block_size}, seed)"
            )
        self.requests[request.request_id] = request
        if session_id is not None:
            self._session_of[request.request_id] = session_id
        if self.kv_cache_manager.retention.is_retained(session_id):
            if self.config.policy == "fcfs":
                self.waiting.add_front(request)
                return
            request.priority -= 1
        self.waiting.add(request)

    # ---- one step ----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        self.kv_cache_manager.retention.expire()
        token_budget = self.config.max_num_batched_tokens
        num_scheduled_tokens: dict[str, int] = {}
        new_block_ids: dict[str, list[int]] = {}
        spec_decode_tokens: dict[str, list[int]] = {}
        scheduled_running: list[Request] = []
        preempted: list[Request] = []

        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            num_new_tokens = self._cap_new_tokens(
                request, request.num_tokens_with_spec - request.num_computed_tokens, token_budget
            )
            if num_new_tokens <= 0:
                req_index += 1
                continue
            while True:
                block_ids = self.kv_cache_manager.allocate_slots(
                    request, num_new_tokens, num_lookahead_tokens=self._lookahead(request, num_new_tokens)
                )
                if block_ids is not None:
                    break
                if self.kv_cache_manager.retention.release_oldest():
                    continue  # retained sessions give their blocks back before anyone is preempted
                victim_index = self._pick_victim()
                victim = self.running.pop(victim_index)
                if victim_index < req_index:
                    req_index -= 1
                if victim.request_id in num_scheduled_tokens:
                    # Scheduled earlier in this step (priority policy): take it all back.
                    token_budget += num_scheduled_tokens.pop(victim.request_id)
                    new_block_ids.pop(victim.request_id)
                    spec_decode_tokens.pop(victim.request_id, None)
                    scheduled_running.remove(victim)
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if block_ids is None:
                continue  # it preempted itself; running[req_index] is now the next request

            num_scheduled_tokens[request.request_id] = num_new_tokens
            new_block_ids[request.request_id] = block_ids
            token_budget -= num_new_tokens
            num_spec_tokens = request.num_computed_tokens + num_new_tokens - request.num_tokens
            if request.spec_token_ids:
                # Drafts past the budget or the context are dropped; they were only guesses.
                del request.spec_token_ids[max(num_spec_tokens, 0) :]
                if request.spec_token_ids:
                    spec_decode_tokens[request.request_id] = list(request.spec_token_ids)
            scheduled_running.append(request)
            req_index += 1

        scheduled_new: list[Request] = []
        if not preempted:
            token_budget = self._admit_waiting(token_budget, num_scheduled_tokens, scheduled_new)

        output = SchedulerOutput(
            scheduled_new_reqs=[self._new_request_data(request) for request in scheduled_new],
            scheduled_cached_reqs=[
                CachedRequestData(request.request_id, new_block_ids[request.request_id], request.num_computed_tokens)
                for request in scheduled_running
            ],
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=self.config.max_num_batched_tokens - token_budget,
            scheduled_spec_decode_tokens=spec_decode_tokens,
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids={request.request_id for request in preempted},
        )
        self.finished_req_ids = set()
        return output

    def _admit_waiting(
        self, token_budget: int, num_scheduled_tokens: dict[str, int], scheduled_new: list[Request]
    ) -> int:
        while len(self.waiting) > 0 and token_budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.peek()
            computed_blocks, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(request)
            num_new_tokens = request.num_tokens - num_hit_tokens
            if not self.config.enable_chunked_prefill and num_new_tokens > token_budget:
                break  # whole prompts only: it waits for a step with room
            num_new_tokens = self._cap_new_tokens(request, num_new_tokens, token_budget, num_hit_tokens)
            block_ids = self.kv_cache_manager.allocate_slots(
                request,
                num_new_tokens,
                num_hit_tokens,
                computed_blocks,
                num_lookahead_tokens=self._lookahead(request, num_new_tokens, num_hit_tokens),
            )
            if block_ids is None:
                if not self.running and self.kv_cache_manager.retention.release_oldest():
                    continue  # nothing runs that could free blocks: retention must yield
                break  # head-of-line: later requests must not overtake it
            self.waiting.pop()
            self.kv_cache_manager.retention.release(self._session_of.get(request.request_id))
            self.running.append(request)
            scheduled_new.append(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit_tokens
            num_scheduled_tokens[request.request_id] = num_new_tokens
            token_budget -= num_new_tokens
        return token_budget

    def _cap_new_tokens(self, request: Request, num_new_tokens: int, token_budget: int, num_hit_tokens: int = 0) -> int:
        threshold = self.config.long_prefill_token_threshold
        if threshold > 0 and self.config.enable_chunked_prefill:
            num_new_tokens = min(num_new_tokens, threshold)
        # Processing the token at position p predicts position p + 1, so positions up to
        # max_num_tokens - 2 are ever processed.
        room = self.max_num_tokens - 1 - request.num_computed_tokens - num_hit_tokens
        return min(num_new_tokens, token_budget, room)

    def _lookahead(self, request: Request, num_new_tokens: int, num_hit_tokens: int = 0) -> int:
        end = request.num_computed_tokens + num_hit_tokens + num_new_tokens
        return max(0, min(self.num_lookahead_tokens, self.max_num_tokens - 1 - end))

    def _pick_victim(self) -> int:
        """Index in self.running of the request to preempt: the last one (fcfs) or the one with
        the largest (priority, arrival_time), later in the list on ties (priority)."""
        if self.config.policy == "fcfs":
            return len(self.running) - 1
        return max(
            range(len(self.running)),
            key=lambda index: (self.running[index].priority, self.running[index].arrival_time, index),
        )

    def _preempt(self, request: Request) -> None:
        self.kv_cache_manager.free(request)  # before num_computed_tokens is reset: see free()
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.add_front(request)

    def _new_request_data(self, request: Request) -> NewRequestData:
        return NewRequestData(
            req_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            output_token_ids=list(request.output_token_ids),
            sampling_params=request.sampling_params,
            block_ids=self.kv_cache_manager.get_block_ids(request.request_id),
            num_computed_tokens=request.num_computed_tokens,
            eos_token_ids=request.eos_token_ids,
        )

    # ---- after the step ----------------------------------------------------------------------
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> list[RequestStepResult]:
        row_of = {req_id: row for row, req_id in enumerate(model_runner_output.req_ids)}
        results: list[RequestStepResult] = []
        finished: list[Request] = []
        for req_id, num_tokens_scheduled in scheduler_output.num_scheduled_tokens.items():
            request = self.requests.get(req_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # finished or aborted while the step ran
            row = row_of.get(req_id)
            sampled_token_ids = model_runner_output.sampled_token_ids[row] if row is not None else []
            request.num_computed_tokens += num_tokens_scheduled
            draft_token_ids = scheduler_output.scheduled_spec_decode_tokens.get(req_id)
            if draft_token_ids and sampled_token_ids:
                num_rejected = len(draft_token_ids) + 1 - len(sampled_token_ids)
                request.num_computed_tokens -= num_rejected
                num_accepted = len(draft_token_ids) - num_rejected
                self.spec_num_drafts += 1
                self.spec_num_draft_tokens += len(draft_token_ids)
                self.spec_num_accepted_tokens += num_accepted
                grow = len(draft_token_ids) - len(self.spec_drafted_per_pos)
                if grow > 0:
                    self.spec_drafted_per_pos += [0] * grow
                    self.spec_accepted_per_pos += [0] * grow
                for position in range(len(draft_token_ids)):
                    self.spec_drafted_per_pos[position] += 1
                for position in range(num_accepted):
                    self.spec_accepted_per_pos[position] += 1
            # The drafts were for this step; the proposer sets fresh ones for the next.
            request.spec_token_ids = []

            new_token_ids: list[int] = []
            for token_id in sampled_token_ids:
                request.append_output_token_ids(token_id)
                new_token_ids.append(token_id)
                if self._check_stop(request, token_id):
                    finished.append(request)
                    break  # tokens after a stop are dropped
            if not new_token_ids and request.status == RequestStatus.RUNNING:
                continue
            new_logprobs = None
            if model_runner_output.logprobs is not None and row is not None:
                row_logprobs = model_runner_output.logprobs[row]
                if row_logprobs is not None:
                    new_logprobs = row_logprobs[: len(new_token_ids)]
            results.append(
                RequestStepResult(
                    request_id=req_id,
                    new_token_ids=new_token_ids,
                    new_logprobs=new_logprobs,
                    finish_reason=request.finish_reason,
                    stop_reason=request.stop_reason,
                    num_cached_tokens=request.num_cached_tokens,
                    num_prompt_tokens=request.num_prompt_tokens,
                )
            )
        if finished:
            finished_ids = {request.request_id for request in finished}
            self.running = [request for request in self.running if request.request_id not in finished_ids]
            for request in finished:
                self._release(request)
        return results

    def _check_stop(self, request: Request, token_id: int) -> bool:
        """Stop checks after appending one token. A stop token counts only once the request had
        min_tokens outputs before it (the sampler masks it until then, so this matches). A stop
        token that is also the last allowed token reports "stop": the model did stop."""
        params = request.sampling_params
        num_outputs_before = request.num_output_tokens - 1
        if num_outputs_before >= params.min_tokens:
            if not params.ignore_eos and token_id in request.eos_token_ids:
                request.status = RequestStatus.FINISHED_STOPPED
                return True
            if token_id in params.stop_token_ids:
                request.status = RequestStatus.FINISHED_STOPPED
                request.stop_reason = token_id
                return True
        if (params.max_tokens is not None and request.num_output_tokens >= params.max_tokens) or (
            request.num_tokens >= self.max_num_tokens
        ):
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        return False

    # ---- finishing from outside --------------------------------------------------------------
    def finish_requests(
        self, request_ids: str | Iterable[str], status: RequestStatus, stop_reason: int | str | None = None
    ) -> None:
        """Finishes waiting or running requests from outside the step: aborts, and stop strings
        found by the detokenizer. Unknown or already finished ids are ignored."""
        if not RequestStatus.is_finished(status):
            raise ValueError(f"status must be a finished status, got {status.name}")
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        to_finish = [self.requests[req_id] for req_id in dict.fromkeys(ids) if req_id in self.requests]
        if not to_finish:
            return
        finishing_ids = {request.request_id for request in to_finish}
        self.running = [request for request in self.running if request.request_id not in finishing_ids]
        for request in to_finish:
            if request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                self.waiting.remove(request)
            request.status = status
            if stop_reason is not None:
                request.stop_reason = stop_reason
            self._release(request)

    def _release(self, request: Request) -> None:
        self._session_of.pop(request.request_id, None)
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)

    # ---- drafts and queries ------------------------------------------------------------------
    def set_spec_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None:
        """Stores the proposer's drafts for the next step (ignored for requests not running)."""
        for req_id, token_ids in draft_token_ids.items():
            request = self.requests.get(req_id)
            if request is not None and request.status == RequestStatus.RUNNING:
                request.spec_token_ids = list(token_ids)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def make_stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage,
            prefix_cache_queries=self.kv_cache_manager.prefix_cache_queries,
            prefix_cache_hits=self.kv_cache_manager.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
            spec_num_draft_tokens=self.spec_num_draft_tokens,
            spec_num_accepted_tokens=self.spec_num_accepted_tokens,
            spec_num_drafts=self.spec_num_drafts,
            spec_accepted_per_pos=list(self.spec_accepted_per_pos),
            spec_drafted_per_pos=list(self.spec_drafted_per_pos),
        )

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached prefix; refused (False) while any request holds blocks."""
        return self.kv_cache_manager.reset_prefix_cache()
