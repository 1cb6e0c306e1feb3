"""Scheduling decisions with exact token counts and block ids, driven by the fake runner."""

from __future__ import annotations

import pytest
from scheduler_harness import (
    FakeRunner,
    assert_pool_whole,
    check_invariants,
    make_request,
    make_scheduler,
    run_to_completion,
    scripted,
    step,
)

from engine.core.scheduler import RequestRejectedError
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams


def test_chunked_prefill_splits_a_long_prompt_with_exact_counts() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8)
    runner = FakeRunner(4, 64)
    scheduler.add_request(make_request("a", list(range(100, 120)), max_tokens=3))
    expected = [  # (scheduled, computed before the step, new block ids, tokens produced)
        (8, 0, [0, 1], 0),
        (8, 8, [2, 3], 0),
        (4, 16, [4], 1),
        (1, 20, [5], 1),
        (1, 21, [], 1),
    ]
    for index, (num_tokens, num_computed, block_ids, num_produced) in enumerate(expected):
        output, results = step(scheduler, runner)
        assert output.num_scheduled_tokens == {"a": num_tokens}
        assert output.total_num_scheduled_tokens == num_tokens
        if index == 0:
            [new] = output.scheduled_new_reqs
            assert (new.block_ids, new.num_computed_tokens, new.output_token_ids) == (block_ids, 0, [])
            assert output.scheduled_cached_reqs == []
        else:
            [cached] = output.scheduled_cached_reqs
            assert (cached.new_block_ids, cached.num_computed_tokens) == (block_ids, num_computed)
        assert sum(len(r.new_token_ids) for r in results) == num_produced
    assert results[0].finish_reason == "length" and not scheduler.has_unfinished_requests()
    assert_pool_whole(scheduler)


def test_decodes_keep_running_while_a_long_prompt_chunks() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8)
    runner = FakeRunner(4, 64)
    scheduler.add_request(make_request("a", [1, 2, 3], max_tokens=20))
    assert step(scheduler, runner)[0].num_scheduled_tokens == {"a": 3}
    scheduler.add_request(make_request("b", list(range(200, 230)), max_tokens=2))
    schedule = [step(scheduler, runner)[0].num_scheduled_tokens for _ in range(6)]
    assert schedule == [{"a": 1, "b": 7}] * 4 + [{"a": 1, "b": 2}, {"a": 1, "b": 1}]
    run_to_completion(scheduler, runner)
    assert_pool_whole(scheduler)


def test_long_prefill_threshold_caps_each_chunk() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=16, long_prefill_token_threshold=5)
    runner = FakeRunner(4, 64)
    scheduler.add_request(make_request("a", list(range(12)), max_tokens=1))
    scheduler.add_request(make_request("b", list(range(50, 53)), max_tokens=1))
    counts = [step(scheduler, runner)[0].num_scheduled_tokens for _ in range(3)]
    assert counts == [{"a": 5, "b": 3}, {"a": 5}, {"a": 2}]
    assert not scheduler.has_unfinished_requests()


def test_budget_and_max_num_seqs_limit_admission() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=10, max_num_seqs=3)
    runner = FakeRunner(4, 64)
    for name in "abcde":
        scheduler.add_request(make_request(name, [ord(name)] * 6, max_tokens=5))
    first, _ = step(scheduler, runner)
    assert first.num_scheduled_tokens == {"a": 6, "b": 4}
    second, _ = step(scheduler, runner)
    assert second.num_scheduled_tokens == {"a": 1, "b": 2, "c": 6}  # d waits: 3 seqs at most
    assert scheduler.num_running == 3 and scheduler.num_waiting == 2
    outputs, _ = run_to_completion(scheduler, runner)
    for output in [first, second, *outputs]:
        assert output.total_num_scheduled_tokens == sum(output.num_scheduled_tokens.values()) <= 10
        assert len(output.num_scheduled_tokens) <= 3
        assert all(count > 0 for count in output.num_scheduled_tokens.values())
    assert_pool_whole(scheduler)


def test_without_chunked_prefill_a_prompt_that_does_not_fit_waits() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=16, max_model_len=16, enable_chunked_prefill=False)
    runner = FakeRunner(4, 64)
    scheduler.add_request(make_request("a", list(range(10)), max_tokens=3))
    scheduler.add_request(make_request("b", list(range(20, 30)), max_tokens=3))
    assert step(scheduler, runner)[0].num_scheduled_tokens == {"a": 10}
    assert step(scheduler, runner)[0].num_scheduled_tokens == {"a": 1, "b": 10}
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        make_scheduler(max_num_batched_tokens=8, max_model_len=16, enable_chunked_prefill=False)


@pytest.mark.parametrize(
    ("policy", "expected_order"), [("priority", ["high", "mid", "low"]), ("fcfs", ["low", "high", "mid"])]
)
def test_admission_order_follows_the_policy(policy: str, expected_order: list[str]) -> None:
    scheduler = make_scheduler(policy=policy, max_num_seqs=1)
    runner = FakeRunner(4, 64)
    scheduler.add_request(make_request("low", [1, 2], priority=5, arrival_time=1.0, max_tokens=1))
    scheduler.add_request(make_request("high", [1, 3], priority=0, arrival_time=3.0, max_tokens=1))
    scheduler.add_request(make_request("mid", [1, 4], priority=0, arrival_time=4.0, max_tokens=1))
    outputs, _ = run_to_completion(scheduler, runner)
    assert [new.req_id for output in outputs for new in output.scheduled_new_reqs] == expected_order


def test_fcfs_preempts_the_last_running_request_which_resumes_from_its_cached_prefix() -> None:
    scheduler = make_scheduler(num_blocks=4, max_num_batched_tokens=16)
    runner = FakeRunner(4, 4, next_token=scripted({"a": [11, 12, 13, 14, 15, 16], "b": [21, 22, 23, 24, 25, 26]}))
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7], max_tokens=6)
    b = make_request("b", [8, 9, 10, 11, 12, 13, 14], max_tokens=6)
    c = make_request("c", [30, 31, 32, 33, 34, 35, 36], max_tokens=1)
    for request in (a, b, c):
        scheduler.add_request(request)
    first, _ = step(scheduler, runner)
    assert [(n.req_id, n.block_ids) for n in first.scheduled_new_reqs] == [("a", [0, 1]), ("b", [2, 3])]
    assert c.status == RequestStatus.WAITING  # no blocks left for it
    second, _ = step(scheduler, runner)
    assert second.num_scheduled_tokens == {"a": 1, "b": 1} and second.preempted_req_ids == set()

    third, _ = step(scheduler, runner)  # a needs a 3rd block; none is free
    assert third.preempted_req_ids == {"b"}
    assert third.num_scheduled_tokens == {"a": 1}
    assert [(c.req_id, c.new_block_ids) for c in third.scheduled_cached_reqs] == [("a", [3])]  # b's tail first
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert scheduler.num_waiting == 2 and scheduler.make_stats().num_preemptions == 1
    check_invariants(scheduler)

    # b's first block (id 2) is still cached, but b also needs two new ones: it waits for a.
    for _ in range(3):
        output, _ = step(scheduler, runner)
        assert output.scheduled_new_reqs == []
    assert a.status == RequestStatus.FINISHED_LENGTH_CAPPED and a.output_token_ids == [11, 12, 13, 14, 15, 16]

    resumed, _ = step(scheduler, runner)
    [new] = resumed.scheduled_new_reqs  # b is back at the front of the queue, ahead of c
    assert (new.req_id, new.block_ids, new.num_computed_tokens) == ("b", [2, 3, 1], 4)
    assert new.output_token_ids == [21, 22]
    assert resumed.num_scheduled_tokens == {"b": 5}
    assert b.num_cached_tokens == 0  # set at first scheduling only
    run_to_completion(scheduler, runner)
    assert b.output_token_ids == [21, 22, 23, 24, 25, 26] and c.num_output_tokens == 1
    assert_pool_whole(scheduler)


def test_priority_preemption_can_pick_the_request_itself() -> None:
    scheduler = make_scheduler(num_blocks=4, policy="priority")
    runner = FakeRunner(4, 4)
    low = make_request("low", [1, 2, 3, 4, 5, 6, 7], priority=1, max_tokens=4)
    scheduler.add_request(low)
    step(scheduler, runner)
    scheduler.add_request(make_request("high", [8, 9, 10, 11, 12, 13, 14], priority=0, max_tokens=4))
    assert step(scheduler, runner)[0].num_scheduled_tokens == {"low": 1, "high": 7}
    output, _ = step(scheduler, runner)  # low comes first, needs a block, and is the victim itself
    assert output.preempted_req_ids == {"low"} and output.num_scheduled_tokens == {"high": 1}
    assert low.status == RequestStatus.PREEMPTED
    run_to_completion(scheduler, runner)
    assert low.status == RequestStatus.FINISHED_LENGTH_CAPPED and len(low.output_token_ids) == 4
    assert_pool_whole(scheduler)


def test_priority_preemption_takes_back_a_request_scheduled_earlier_in_the_step() -> None:
    scheduler = make_scheduler(num_blocks=4, policy="priority", max_num_batched_tokens=16)
    runner = FakeRunner(4, 4)
    x = make_request("x", [1, 2, 3, 4, 5, 6], priority=1, max_tokens=5)
    scheduler.add_request(x)
    step(scheduler, runner)
    scheduler.add_request(make_request("y", [7, 8, 9, 10, 11, 12, 13, 14], priority=0, max_tokens=3))
    assert step(scheduler, runner)[0].num_scheduled_tokens == {"x": 1, "y": 8}
    pool = scheduler.kv_cache_manager.block_pool
    output, _ = step(scheduler, runner)
    # x was scheduled first (and its second block registered), then y needed a block.
    assert output.preempted_req_ids == {"x"}
    assert output.num_scheduled_tokens == {"y": 1} and output.total_num_scheduled_tokens == 1
    assert [(c.req_id, c.new_block_ids) for c in output.scheduled_cached_reqs] == [("y", [1])]
    # x's second block was registered for tokens that were never computed: its key is gone.
    assert pool.get_cached_block(x.block_hashes[1]) is None
    assert pool.get_cached_block(x.block_hashes[0]).block_id == 0
    run_to_completion(scheduler, runner)  # the runner checks every KV slot x reads on resume
    assert x.status == RequestStatus.FINISHED_LENGTH_CAPPED and len(x.output_token_ids) == 5
    assert_pool_whole(scheduler)


def test_blocks_registered_for_a_step_that_never_ran_are_not_served() -> None:
    scheduler = make_scheduler(num_blocks=5, policy="priority")
    runner = FakeRunner(4, 5, next_token=scripted({"x": [60, 61, 62, 63, 64]}))
    x = make_request("x", [1, 2, 3, 4, 5, 6], priority=1, max_tokens=5)
    scheduler.add_request(x)
    step(scheduler, runner)
    scheduler.add_request(make_request("y", list(range(20, 28)), priority=0, max_tokens=3))
    step(scheduler, runner)
    assert x.all_token_ids == [1, 2, 3, 4, 5, 6, 60, 61]
    scheduler.set_spec_token_ids({"x": [62, 63]})
    output, _ = step(scheduler, runner)
    # x was scheduled first: its drafts took block 4 and its block 1 (now full of real tokens)
    # got a key; then y needed a block and x, the lower priority, was taken back and preempted.
    assert output.preempted_req_ids == {"x"} and output.num_scheduled_tokens == {"y": 1}
    pool = scheduler.kv_cache_manager.block_pool
    assert [block.block_id for block in pool.free_block_queue] == [1, 0]  # block 4 went to y
    assert pool.get_cached_block(x.block_hashes[1]) is None  # position 7 was never written
    z = make_request("z", [1, 2, 3, 4, 5, 6, 60, 61, 9], priority=0, max_tokens=2)
    scheduler.add_request(z)
    admitted: list[tuple[str, int]] = []
    while not admitted:  # z (priority 0) is admitted first, once y has finished
        output, _ = step(scheduler, runner)
        admitted = [(n.req_id, n.num_computed_tokens) for n in output.scheduled_new_reqs]
    assert admitted == [("z", 4), ("x", 4)]  # neither is served the never-written block 1
    run_to_completion(scheduler, runner)
    assert_pool_whole(scheduler)


def test_prefix_hits_are_scheduled_from_the_cached_prefix_and_counted() -> None:
    scheduler = make_scheduler()
    runner = FakeRunner(4, 64)
    shared = list(range(300, 310))
    scheduler.add_request(make_request("a", shared + [1], max_tokens=2))
    run_to_completion(scheduler, runner)
    scheduler.add_request(make_request("b", shared + [2, 3], max_tokens=2))
    output, results = step(scheduler, runner)
    [new] = output.scheduled_new_reqs
    assert new.num_computed_tokens == 8 and output.num_scheduled_tokens == {"b": 4}
    assert results[0].num_cached_tokens == 8 and results[0].num_prompt_tokens == 12
    stats = scheduler.make_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (11 + 12, 8)
    assert stats.num_running == 1 and stats.kv_cache_usage == pytest.approx(3 / 64)
    assert scheduler.reset_prefix_cache() is False
    run_to_completion(scheduler, runner)
    assert scheduler.reset_prefix_cache() is True
    scheduler.add_request(make_request("c", shared + [1], max_tokens=1))
    assert step(scheduler, runner)[0].scheduled_new_reqs[0].num_computed_tokens == 0


def test_same_step_admissions_share_blocks_registered_at_allocation() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=64)
    runner = FakeRunner(4, 64)
    scheduler.add_request(make_request("a", list(range(9)), max_tokens=2))
    scheduler.add_request(make_request("b", list(range(9)), max_tokens=2))
    output, _ = step(scheduler, runner)
    assert [(n.req_id, n.block_ids, n.num_computed_tokens) for n in output.scheduled_new_reqs] == [
        ("a", [0, 1, 2], 0),
        ("b", [0, 1, 3], 8),
    ]
    assert output.num_scheduled_tokens == {"a": 9, "b": 1}
    run_to_completion(scheduler, runner)
    assert_pool_whole(scheduler)


def test_lookahead_slots_are_reserved_for_the_draft_model() -> None:
    scheduler = make_scheduler(num_lookahead_tokens=2)
    runner = FakeRunner(4, 64)
    scheduler.add_request(make_request("a", [1, 2, 3, 4], max_tokens=2))
    assert step(scheduler, runner)[0].scheduled_new_reqs[0].block_ids == [0, 1]


def test_admission_errors_name_the_limit() -> None:
    scheduler = make_scheduler(max_model_len=16, num_blocks=64)
    too_long = make_request("long", list(range(16)))
    with pytest.raises(RequestRejectedError) as error:
        scheduler.add_request(too_long)
    assert str(error.value) == (
        "prompt has 16 tokens but the model's context (max_model_len) is 16; "
        "at least one token must be left for the output"
    )
    assert isinstance(error.value, ValueError) and too_long.status == RequestStatus.FINISHED_IGNORED

    small_pool = make_scheduler(num_blocks=2, max_model_len=100)
    with pytest.raises(RequestRejectedError, match=r"prompt has 8 tokens and needs 3 KV-cache blocks") as error:
        small_pool.add_request(make_request("big", list(range(8))))
    assert "whole KV cache holds 2 blocks (8 tokens)" in str(error.value)
    small_pool.add_request(make_request("fits", list(range(7))))  # 7 + 1 tokens fill 2 blocks
    with pytest.raises(ValueError, match="already in the scheduler"):
        small_pool.add_request(make_request("fits", [1]))
    with pytest.raises(ValueError, match="block_hasher"):
        small_pool.add_request(Request("nohash", list(range(5)), SamplingParams()))
    assert small_pool.num_waiting == 1 and set(small_pool.requests) == {"fits"}
