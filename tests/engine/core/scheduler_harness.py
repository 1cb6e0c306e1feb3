"""Test helpers for the scheduler: a fake model runner and an invariant checker.

The fake runner is not a mock of a real part: the scheduler's contract with the runner is
data in (SchedulerOutput) and data out (ModelRunnerOutput), and this runner plays that contract
the way a real one must. It keeps its own per-request state (token ids, block table, computed
count) from the deltas it receives, and a "KV store" that records which token id was written to
each slot. Every step it writes the scheduled tokens first, then checks that every position each
request attends to holds that request's token: a wrong prefix hit, a block shared by mistake or
an uncomputed block served from the cache fails the check.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from engine.config import CacheConfig, SchedulerConfig
from engine.core.block_hash import make_block_hasher
from engine.core.model_runner_output import ModelRunnerOutput, TokenLogprobs
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import RequestStepResult, SchedulerOutput
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams

# (req_id, token ids so far incl. accepted outputs, prompt length) -> the model's next token
NextToken = Callable[[str, list[int], int], int]


def content_next_token(req_id: str, token_ids: list[int], num_prompt_tokens: int) -> int:
    """A deterministic 'model': the next token depends only on the sequence's content."""
    return (sum(token_ids[-3:]) * 31 + len(token_ids)) % 97 + 3


def scripted(outputs: dict[str, list[int]], fallback: int = 50) -> NextToken:
    """The k-th output of request r is outputs[r][k] (then `fallback`)."""

    def next_token(req_id: str, token_ids: list[int], num_prompt_tokens: int) -> int:
        script = outputs.get(req_id, [])
        index = len(token_ids) - num_prompt_tokens
        return script[index] if index < len(script) else fallback

    return next_token


@dataclass
class _RunnerRequest:
    token_ids: list[int]
    num_prompt_tokens: int
    block_ids: list[int]
    num_computed_tokens: int


class FakeRunner:
    def __init__(
        self,
        block_size: int,
        num_blocks: int,
        next_token: NextToken = content_next_token,
        with_logprobs: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        self.block_size = block_size
        self.kv: list[int | None] = [None] * (num_blocks * block_size)
        self.next_token = next_token
        self.with_logprobs = with_logprobs
        # When set, drafts are accepted by chance instead of by matching next_token.
        self.rng = rng
        self.states: dict[str, _RunnerRequest] = {}

    def _slot(self, state: _RunnerRequest, position: int) -> int:
        block_index = position // self.block_size
        assert block_index < len(state.block_ids), "position beyond the request's block table"
        return state.block_ids[block_index] * self.block_size + position % self.block_size

    def execute(self, output: SchedulerOutput) -> ModelRunnerOutput:
        for req_id in output.finished_req_ids | output.preempted_req_ids:
            self.states.pop(req_id, None)
        for new in output.scheduled_new_reqs:
            assert new.req_id not in self.states
            self.states[new.req_id] = _RunnerRequest(
                new.prompt_token_ids + new.output_token_ids, len(new.prompt_token_ids),
                list(new.block_ids), new.num_computed_tokens,
            )
        for cached in output.scheduled_cached_reqs:
            state = self.states[cached.req_id]
            assert state.num_computed_tokens == cached.num_computed_tokens
            state.block_ids.extend(cached.new_block_ids)
        assert set(output.num_scheduled_tokens) == {r.req_id for r in output.scheduled_new_reqs} | {
            r.req_id for r in output.scheduled_cached_reqs
        }

        sequences: dict[str, list[int]] = {}
        for req_id, num_tokens in output.num_scheduled_tokens.items():  # write phase
            state = self.states[req_id]
            sequence = state.token_ids + output.scheduled_spec_decode_tokens.get(req_id, [])
            end = state.num_computed_tokens + num_tokens
            assert num_tokens > 0 and end <= len(sequence)
            for position in range(state.num_computed_tokens, end):
                self.kv[self._slot(state, position)] = sequence[position]
            sequences[req_id] = sequence
        for req_id, num_tokens in output.num_scheduled_tokens.items():  # attention reads
            state = self.states[req_id]
            sequence = sequences[req_id]
            for position in range(state.num_computed_tokens + num_tokens):
                assert self.kv[self._slot(state, position)] == sequence[position], (req_id, position)

        req_ids: list[str] = []
        sampled_rows: list[list[int]] = []
        logprob_rows: list[list[TokenLogprobs] | None] = []
        for req_id, num_tokens in output.num_scheduled_tokens.items():  # sampling
            state = self.states[req_id]
            end = state.num_computed_tokens + num_tokens
            drafts = output.scheduled_spec_decode_tokens.get(req_id, [])
            sampled: list[int] = []
            if end >= len(state.token_ids):
                assert end == len(state.token_ids) + len(drafts)
                for draft in drafts:
                    if self.rng is not None:
                        target = draft if self.rng.random() < 0.6 else (draft + 1) % 100
                    else:
                        target = self.next_token(req_id, state.token_ids + sampled, state.num_prompt_tokens)
                    sampled.append(target)
                    if target != draft:
                        break
                else:
                    sampled.append(self.next_token(req_id, state.token_ids + sampled, state.num_prompt_tokens))
            num_rejected = len(drafts) + 1 - len(sampled) if sampled and drafts else 0
            state.num_computed_tokens = end - num_rejected
            state.token_ids.extend(sampled)
            req_ids.append(req_id)
            sampled_rows.append(sampled)
            logprob_rows.append([TokenLogprobs(t, -0.5, [(t, -0.5), (t + 1, -1.5)]) for t in sampled])
        return ModelRunnerOutput(req_ids, sampled_rows, logprob_rows if self.with_logprobs else None)


def step(scheduler: Scheduler, runner: FakeRunner) -> tuple[SchedulerOutput, list[RequestStepResult]]:
    output = scheduler.schedule()
    return output, scheduler.update_from_output(output, runner.execute(output))


def run_to_completion(
    scheduler: Scheduler, runner: FakeRunner, max_steps: int = 1000
) -> tuple[list[SchedulerOutput], dict[str, RequestStepResult]]:
    """Steps until nothing is left; returns every output and each request's final result."""
    outputs: list[SchedulerOutput] = []
    final: dict[str, RequestStepResult] = {}
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return outputs, final
        output, results = step(scheduler, runner)
        outputs.append(output)
        for result in results:
            if result.finished:
                final[result.request_id] = result
        check_invariants(scheduler)
    raise AssertionError("the scheduler did not finish")


def check_invariants(scheduler: Scheduler) -> None:
    """Reference counts, free queue, hash map and block-table sharing are mutually consistent."""
    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    running_ids = {request.request_id for request in scheduler.running}
    assert set(manager.req_to_blocks) == running_ids, "only running requests hold blocks"
    waiting_statuses = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
    waiting_ids = {r.request_id for r in scheduler.requests.values() if r.status in waiting_statuses}
    assert set(scheduler.requests) == running_ids | waiting_ids
    assert scheduler.num_waiting + scheduler.num_running == len(scheduler.requests)

    holders: dict[int, list[tuple[Request, int]]] = {}
    for request in scheduler.running:
        assert request.status == RequestStatus.RUNNING
        blocks = manager.req_to_blocks[request.request_id]
        assert len({block.block_id for block in blocks}) == len(blocks), "a block twice in one table"
        for index, block in enumerate(blocks):
            holders.setdefault(block.block_id, []).append((request, index))
            if block.block_hash is not None:
                assert block.block_hash == request.block_hashes[index], "cached block at the wrong place"
    free_ids = [block.block_id for block in pool.free_block_queue]
    assert len(free_ids) == len(set(free_ids)) == pool.num_free_blocks
    for block in pool.blocks:
        assert block.ref_cnt >= 0
        assert block.ref_cnt == len(holders.get(block.block_id, [])), block
        assert (block.ref_cnt == 0) == (block.block_id in set(free_ids))
        if len(holders.get(block.block_id, [])) > 1:
            # Sharing happens only through the prefix cache: same index, same key.
            assert block.block_hash is not None
            assert len({index for _, index in holders[block.block_id]}) == 1
    assert pool.num_free_blocks + len(holders) == pool.num_blocks
    for block_hash, block in pool.cached_block_hash_to_block.items():
        assert block.block_hash == block_hash


def assert_pool_whole(scheduler: Scheduler) -> None:
    pool = scheduler.kv_cache_manager.block_pool
    assert all(block.ref_cnt == 0 for block in pool.blocks)
    assert pool.num_free_blocks == pool.num_blocks
    assert not scheduler.kv_cache_manager.req_to_blocks
    assert not scheduler.requests and scheduler.num_running == 0 and scheduler.num_waiting == 0


def make_scheduler(
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_batched_tokens: int = 64,
    max_num_seqs: int = 16,
    max_model_len: int = 256,
    policy: str = "fcfs",
    enable_chunked_prefill: bool = True,
    long_prefill_token_threshold: int = 0,
    enable_prefix_caching: bool = True,
    num_lookahead_tokens: int = 0,
) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
            long_prefill_token_threshold=long_prefill_token_threshold,
            policy=policy,
        ),
        CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching),
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        num_lookahead_tokens=num_lookahead_tokens,
    )


_ARRIVALS = iter(range(1, 10**9))


def make_request(
    request_id: str,
    prompt_token_ids: list[int],
    *,
    block_size: int = 4,
    eos_token_ids: frozenset[int] = frozenset(),
    priority: int = 0,
    arrival_time: float | None = None,
    cache_salt: str | None = None,
    **sampling: object,
) -> Request:
    """A request whose hashes match make_scheduler's block size; arrival times increase with
    every call so fcfs and priority ties are deterministic."""
    sampling.setdefault("max_tokens", 16)
    return Request(
        request_id,
        prompt_token_ids,
        SamplingParams(**sampling),  # type: ignore[arg-type]
        eos_token_ids=eos_token_ids,
        arrival_time=float(next(_ARRIVALS)) if arrival_time is None else arrival_time,
        priority=priority,
        cache_salt=cache_salt,
        block_hasher=make_block_hasher(block_size, "test-model"),
    )
