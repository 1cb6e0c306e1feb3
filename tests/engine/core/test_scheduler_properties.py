"""Random interleavings of add / abort / stop-string / drafts / step on small pools.

After every operation: the token budget and max_num_seqs hold, reference counts match the block
tables exactly, running requests share blocks only through cached prefixes, and the fake runner
finds every attended KV slot holding the right token. At the end, the pool is whole.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_harness import FakeRunner, assert_pool_whole, check_invariants, make_request, make_scheduler

from engine.core.scheduler import RequestRejectedError
from engine.request import RequestStatus

EOS = 3
PREFIXES = [[], [7, 7, 8, 9], [7, 7, 8, 9, 10, 11, 12, 13], [20, 21, 22, 23, 24]]

config_strategy = st.fixed_dictionaries(
    {
        "block_size": st.sampled_from([1, 2, 4]),
        "num_blocks": st.integers(3, 14),
        "max_num_batched_tokens": st.integers(1, 24),
        "max_num_seqs": st.integers(1, 4),
        "policy": st.sampled_from(["fcfs", "priority"]),
        "enable_chunked_prefill": st.booleans(),
        "long_prefill_token_threshold": st.sampled_from([0, 0, 3]),
        "enable_prefix_caching": st.booleans(),
        "num_lookahead_tokens": st.sampled_from([0, 0, 2]),
    }
)
add_op = st.tuples(
    st.just("add"),
    st.integers(0, len(PREFIXES) - 1),  # shared prefixes make prefix hits likely
    st.lists(st.integers(4, 40), min_size=1, max_size=12),
    st.integers(0, 2),  # priority
    st.integers(1, 12),  # max_tokens
)
op_strategy = st.one_of(
    add_op,
    add_op,
    st.tuples(st.just("abort"), st.integers(0, 30)),
    st.tuples(st.just("stop_string"), st.integers(0, 30)),
    # Drafts go to a running request (picked by index), so they are actually verified.
    st.tuples(st.just("drafts"), st.integers(0, 30), st.lists(st.integers(4, 40), min_size=1, max_size=3)),
    # An abort that arrives between schedule() and update_from_output().
    st.tuples(st.just("step_with_abort"), st.integers(0, 30)),
    *[st.tuples(st.just("step"))] * 5,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=config_strategy, ops=st.lists(op_strategy, min_size=20, max_size=60), seed=st.integers(0, 2**16))
def test_random_interleavings_keep_the_pool_consistent(
    config: dict[str, Any], ops: list[tuple[Any, ...]], seed: int
) -> None:
    if config["enable_chunked_prefill"]:
        max_model_len = 40
    else:  # whole prompts only: every prompt that fits the context must fit one step
        config["max_num_batched_tokens"] = max(config["max_num_batched_tokens"], 2)
        max_model_len = config["max_num_batched_tokens"]
    scheduler = make_scheduler(max_model_len=max_model_len, **config)
    block_size, budget = config["block_size"], config["max_num_batched_tokens"]
    rng = random.Random(seed)
    # Random outputs (EOS is 3, so some requests stop early) and random draft acceptance.
    runner = FakeRunner(block_size, config["num_blocks"], next_token=lambda *_: rng.randrange(3, 40), rng=rng)
    added: list[str] = []

    def run_step(abort_index: int | None = None) -> None:
        output = scheduler.schedule()
        model_output = runner.execute(output)
        if abort_index is not None and output.num_scheduled_tokens:
            scheduled_ids = list(output.num_scheduled_tokens)
            scheduler.finish_requests(scheduled_ids[abort_index % len(scheduled_ids)], RequestStatus.FINISHED_ABORTED)
        results = scheduler.update_from_output(output, model_output)
        assert output.total_num_scheduled_tokens == sum(output.num_scheduled_tokens.values()) <= budget
        assert all(count > 0 for count in output.num_scheduled_tokens.values())
        assert len(output.num_scheduled_tokens) <= config["max_num_seqs"]
        threshold = config["long_prefill_token_threshold"]
        if threshold and config["enable_chunked_prefill"]:
            assert all(count <= threshold for count in output.num_scheduled_tokens.values())
        for request in scheduler.requests.values():
            assert request.num_tokens <= scheduler.max_num_tokens
            assert request.num_computed_tokens <= request.num_tokens
        for result in results:
            assert result.new_token_ids or result.finished

    for op in ops:
        kind = op[0]
        if kind == "add":
            _, prefix_index, tail, priority, max_tokens = op
            request_id = f"r{len(added)}"
            added.append(request_id)
            request = make_request(
                request_id, PREFIXES[prefix_index] + tail, block_size=block_size, priority=priority,
                eos_token_ids=frozenset({EOS}), max_tokens=max_tokens,
            )
            try:
                scheduler.add_request(request)
            except RequestRejectedError:
                assert request.status == RequestStatus.FINISHED_IGNORED
        elif kind in ("abort", "stop_string") and added:
            request_id = added[op[1] % len(added)]
            status = RequestStatus.FINISHED_ABORTED if kind == "abort" else RequestStatus.FINISHED_STOPPED
            scheduler.finish_requests(request_id, status, stop_reason="s" if kind == "stop_string" else None)
        elif kind == "drafts" and scheduler.running:
            scheduler.set_spec_token_ids({scheduler.running[op[1] % len(scheduler.running)].request_id: op[2]})
        elif kind == "step":
            run_step()
        elif kind == "step_with_abort":
            run_step(abort_index=op[1])
        check_invariants(scheduler)

    # Half the time drain by running, half by aborting: both must leave the pool whole.
    if seed % 2 == 0:
        for _ in range(2000):
            if not scheduler.has_unfinished_requests():
                break
            run_step()
            check_invariants(scheduler)
        assert not scheduler.has_unfinished_requests(), "requests never finished"
    else:
        scheduler.finish_requests(list(scheduler.requests), RequestStatus.FINISHED_ABORTED)
    assert_pool_whole(scheduler)
