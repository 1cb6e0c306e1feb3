"""Stop checks, speculative-token accounting and aborts, with scripted model outputs."""

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

from engine.request import RequestStatus

EOS = 2


@pytest.mark.parametrize(
    ("script", "params", "expected_outputs", "finish_reason", "stop_reason"),
    [
        ([5, EOS, 7], {}, [5, EOS], "stop", None),
        ([5, EOS, 7], {"ignore_eos": True, "max_tokens": 3}, [5, EOS, 7], "length", None),
        # min_tokens: a stop token counts only after min_tokens outputs before it.
        ([EOS, 5, EOS, 9], {"min_tokens": 2}, [EOS, 5, EOS], "stop", None),
        ([5, EOS, 9], {"min_tokens": 2, "max_tokens": 3}, [5, EOS, 9], "length", None),
        ([5, 9, 7], {"stop_token_ids": [9]}, [5, 9], "stop", 9),
        ([9, 5, 9], {"stop_token_ids": [9], "min_tokens": 2}, [9, 5, 9], "stop", 9),
        ([5, 6, 7], {"max_tokens": 2}, [5, 6], "length", None),
        ([5, EOS], {"max_tokens": 2}, [5, EOS], "stop", None),  # the model did stop
    ],
)
def test_stop_conditions(
    script: list[int], params: dict[str, object], expected_outputs: list[int], finish_reason: str,
    stop_reason: int | None,
) -> None:
    scheduler = make_scheduler()
    runner = FakeRunner(4, 64, next_token=scripted({"r": script}))
    params.setdefault("max_tokens", 10)
    request = make_request("r", [1, 3, 4], eos_token_ids=frozenset({EOS}), **params)
    scheduler.add_request(request)
    _, final = run_to_completion(scheduler, runner)
    assert request.output_token_ids == expected_outputs
    assert final["r"].finish_reason == finish_reason and final["r"].stop_reason == stop_reason
    assert final["r"].new_token_ids == expected_outputs[-1:]
    assert_pool_whole(scheduler)


def test_max_model_len_ends_the_request_and_caps_scheduling() -> None:
    scheduler = make_scheduler(max_model_len=10)
    runner = FakeRunner(4, 64)
    request = make_request("r", list(range(7)), max_tokens=None)
    scheduler.add_request(request)
    _, final = run_to_completion(scheduler, runner)
    assert request.num_tokens == 10 and request.num_output_tokens == 3
    assert final["r"].finish_reason == "length"

    # Drafts may not run past the context: positions up to max_model_len - 2 are processed.
    scheduler.add_request(make_request("s", list(range(7)), max_tokens=None))
    step(scheduler, runner)
    scheduler.set_spec_token_ids({"s": [30, 31, 32]})
    output, _ = step(scheduler, runner)
    assert output.num_scheduled_tokens == {"s": 2} and output.scheduled_spec_decode_tokens == {"s": [30]}


@pytest.mark.parametrize("num_lookahead_tokens", [0, 2])
def test_a_request_cannot_outgrow_the_pool(num_lookahead_tokens: int) -> None:
    # 3 blocks of 4 tokens: a lone request stops at 12 tokens instead of preempting itself forever
    # (lookahead slots for a draft model are trimmed near the end for the same reason).
    scheduler = make_scheduler(num_blocks=3, max_model_len=100, num_lookahead_tokens=num_lookahead_tokens)
    runner = FakeRunner(4, 3)
    request = make_request("r", list(range(7)), max_tokens=None)
    scheduler.add_request(request)
    _, final = run_to_completion(scheduler, runner)
    assert request.num_tokens == 12 and final["r"].finish_reason == "length"
    assert scheduler.make_stats().num_preemptions == 0


def test_spec_tokens_are_scheduled_and_rejected_ones_rolled_back() -> None:
    scheduler = make_scheduler()
    outputs = [10, 11, 12, 13, 14, 15, 16, 17]
    runner = FakeRunner(4, 64, next_token=scripted({"r": outputs}), with_logprobs=True)
    request = make_request("r", [1, 3, 4, 5, 6], max_tokens=8, logprobs=1)
    scheduler.add_request(request)
    step(scheduler, runner)
    assert (request.num_tokens, request.num_computed_tokens) == (6, 5)

    scheduler.set_spec_token_ids({"r": [11, 99, 13], "unknown": [1]})
    output, results = step(scheduler, runner)
    assert output.num_scheduled_tokens == {"r": 4}
    assert output.scheduled_spec_decode_tokens == {"r": [11, 99, 13]}
    # 11 accepted, 99 rejected (the model says 12): one draft accepted, two rolled back.
    assert results[0].new_token_ids == [11, 12]
    assert [lp.token_id for lp in results[0].new_logprobs] == [11, 12]
    assert (request.num_tokens, request.num_computed_tokens) == (8, 7)
    assert request.spec_token_ids == []
    stats = scheduler.make_stats()
    assert (stats.spec_num_draft_tokens, stats.spec_num_accepted_tokens) == (3, 1)

    scheduler.set_spec_token_ids({"r": [13, 14]})  # all accepted, plus the bonus token
    output, results = step(scheduler, runner)
    assert output.num_scheduled_tokens == {"r": 3} and results[0].new_token_ids == [13, 14, 15]
    assert (request.num_tokens, request.num_computed_tokens) == (11, 10)

    output, _ = step(scheduler, runner)  # no drafts: a plain decode step
    assert output.num_scheduled_tokens == {"r": 1} and output.scheduled_spec_decode_tokens == {}
    assert scheduler.make_stats().spec_num_accepted_tokens == 3


def test_drafts_beyond_the_budget_are_dropped() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=3)
    runner = FakeRunner(4, 64, next_token=scripted({"r": [10, 11, 12, 13]}))
    request = make_request("r", [1, 3], max_tokens=8)
    scheduler.add_request(request)
    step(scheduler, runner)
    scheduler.set_spec_token_ids({"r": [11, 12, 13, 14]})
    output, results = step(scheduler, runner)
    assert output.num_scheduled_tokens == {"r": 3}
    assert output.scheduled_spec_decode_tokens == {"r": [11, 12]}
    assert results[0].new_token_ids == [11, 12, 13]


def test_tokens_after_a_stop_are_dropped() -> None:
    scheduler = make_scheduler()
    runner = FakeRunner(4, 64, next_token=scripted({"r": [5, EOS, 7, 8]}), with_logprobs=True)
    request = make_request("r", [1, 3], eos_token_ids=frozenset({EOS}), logprobs=0)
    scheduler.add_request(request)
    step(scheduler, runner)
    scheduler.set_spec_token_ids({"r": [EOS, 7]})
    _, results = step(scheduler, runner)
    assert results[0].new_token_ids == [EOS] and results[0].finish_reason == "stop"
    assert len(results[0].new_logprobs) == 1
    assert request.output_token_ids == [5, EOS]
    assert_pool_whole(scheduler)


def test_aborts_free_everything_in_every_state() -> None:
    scheduler = make_scheduler(num_blocks=5, max_num_batched_tokens=8)
    runner = FakeRunner(4, 5)
    running = make_request("running", [1, 2, 3], max_tokens=50)
    chunking = make_request("chunking", list(range(100, 116)), max_tokens=50)
    waiting = make_request("waiting", list(range(200, 205)), max_tokens=50)
    for request in (running, chunking, waiting):
        scheduler.add_request(request)
    step(scheduler, runner)
    output, _ = step(scheduler, runner)
    assert output.num_scheduled_tokens == {"running": 1, "chunking": 7}
    assert chunking.num_computed_tokens == 12 and waiting.status == RequestStatus.WAITING

    scheduler.finish_requests(["chunking", "waiting", "nope"], RequestStatus.FINISHED_ABORTED)
    assert chunking.finish_reason == "abort" and waiting.finish_reason == "abort"
    assert set(scheduler.requests) == {"running"}
    next_output, _ = step(scheduler, runner)
    assert next_output.finished_req_ids == {"chunking", "waiting"}
    assert step(scheduler, runner)[0].finished_req_ids == set()  # reported once
    check_invariants(scheduler)

    scheduler.finish_requests("running", RequestStatus.FINISHED_STOPPED, stop_reason="END")
    scheduler.finish_requests("running", RequestStatus.FINISHED_ABORTED)  # already finished: ignored
    assert running.finish_reason == "stop" and running.stop_reason == "END"
    assert_pool_whole(scheduler)
    with pytest.raises(ValueError, match="finished status"):
        scheduler.finish_requests("x", RequestStatus.RUNNING)


def test_abort_of_a_preempted_request_and_during_a_step() -> None:
    scheduler = make_scheduler(num_blocks=4, max_num_batched_tokens=16)
    runner = FakeRunner(4, 4)
    a = make_request("a", list(range(7)), max_tokens=6)
    b = make_request("b", list(range(50, 57)), max_tokens=6)
    scheduler.add_request(a)
    scheduler.add_request(b)
    for _ in range(3):
        output, _ = step(scheduler, runner)
    assert output.preempted_req_ids == {"b"} and b.status == RequestStatus.PREEMPTED
    scheduler.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    assert scheduler.num_waiting == 0

    # An abort that arrives while a step runs: its output is ignored.
    output = scheduler.schedule()
    model_output = runner.execute(output)
    scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert scheduler.update_from_output(output, model_output) == []
    assert a.finish_reason == "abort"
    assert_pool_whole(scheduler)
    assert scheduler.schedule().finished_req_ids == {"a"}  # b was reported with the step before


def test_mid_prefill_steps_produce_no_result() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=4)
    runner = FakeRunner(4, 64)
    scheduler.add_request(make_request("r", list(range(10)), max_tokens=1))
    assert step(scheduler, runner)[1] == [] and step(scheduler, runner)[1] == []
    [result] = step(scheduler, runner)[1]
    assert result.finish_reason == "length" and len(result.new_token_ids) == 1
