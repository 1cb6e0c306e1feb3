"""Session retention: an agent session's KV blocks stay warm while its tool runs.

The scheduler tests drive the real Scheduler with the harness's fake runner (which checks that
every attended position holds the right token), and a fake clock for TTLs.
"""

from __future__ import annotations

import pytest

from engine.core.block_hash import hash_token_blocks
from engine.core.block_pool import BlockPool
from engine.core.scheduler import Scheduler
from engine.core.session_retention import SessionRetention, SessionTurns
from engine.request import Request
from tests.engine.core.scheduler_harness import FakeRunner, make_request, make_scheduler, scripted, step

BLOCK_SIZE = 4
SEED = "test-model"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cached_pool(num_blocks: int, token_ids: list[int]) -> tuple[BlockPool, list[bytes]]:
    """A pool whose first blocks hold `token_ids`' full blocks, cached and free (as after a
    request finished)."""
    pool = BlockPool(num_blocks)
    hashes = hash_token_blocks(token_ids, BLOCK_SIZE, SEED)
    blocks = pool.get_new_blocks(len(hashes))
    for block, block_hash in zip(blocks, hashes):
        block.block_hash = block_hash
        pool.cached_block_hash_to_block[block_hash] = block
    pool.free_blocks(reversed(blocks))
    return pool, hashes


# ---- SessionRetention on a bare pool ----------------------------------------------------------

def test_retain_pins_the_cached_prefix_and_release_gives_it_back_tail_first() -> None:
    pool, hashes = cached_pool(16, list(range(1, 25)))  # 6 cached blocks
    retention = SessionRetention(pool, clock=Clock())
    assert retention.retain("s", hashes, ttl_seconds=5.0, max_retained_fraction=1.0) == 6
    assert [block.ref_cnt for block in pool.blocks[:6]] == [1] * 6
    assert pool.num_free_blocks == 10 and retention.num_pinned_blocks == 6
    assert retention.num_retained_only_blocks == 6
    # New allocations cannot take pinned blocks, however many there are.
    taken = pool.get_new_blocks(10)
    assert {block.block_id for block in taken}.isdisjoint(range(6))
    pool.free_blocks(taken)
    assert retention.release("s") == 6
    assert retention.num_sessions == 0 and pool.num_free_blocks == 16
    # Tail first: the prefix's last block is the first to be reused.
    order = [block.block_id for block in pool.free_block_queue]
    assert order.index(5) < order.index(0)
    assert all(pool.get_cached_block(block_hash) is not None for block_hash in hashes)


def test_retain_stops_at_the_first_block_no_longer_cached() -> None:
    pool, hashes = cached_pool(16, list(range(1, 25)))
    missing = pool.get_cached_block(hashes[3])
    pool.uncache_block(missing)
    retention = SessionRetention(pool, clock=Clock())
    assert retention.retain("s", hashes, 5.0, 1.0) == 3
    assert retention.retained_block_ids("s") == [0, 1, 2]


def test_the_ttl_releases_the_pins() -> None:
    pool, hashes = cached_pool(16, list(range(1, 25)))
    clock = Clock()
    retention = SessionRetention(pool, clock=clock)
    retention.retain("s", hashes, ttl_seconds=5.0, max_retained_fraction=1.0)
    clock.now += 4.9
    assert retention.expire() == [] and retention.is_retained("s")
    clock.now += 0.2
    assert not retention.is_retained("s")
    assert retention.expire() == ["s"]
    assert pool.num_free_blocks == 16 and retention.num_expired == 1


def test_the_cap_releases_older_sessions_and_trims_a_long_prefix() -> None:
    pool = BlockPool(20)
    prompts = {name: [base + i for i in range(16)] for name, base in (("a", 100), ("b", 200), ("c", 300))}
    all_hashes = {}
    for name, tokens in prompts.items():
        hashes = hash_token_blocks(tokens, BLOCK_SIZE, SEED)
        blocks = pool.get_new_blocks(4)
        for block, block_hash in zip(blocks, hashes):
            block.block_hash = block_hash
            pool.cached_block_hash_to_block[block_hash] = block
        pool.free_blocks(reversed(blocks))
        all_hashes[name] = hashes
    retention = SessionRetention(pool, clock=Clock())
    cap = 0.4  # 8 of 20 blocks
    assert retention.retain("a", all_hashes["a"], 5.0, cap) == 4
    assert retention.retain("b", all_hashes["b"], 5.0, cap) == 4
    assert retention.retain("c", all_hashes["c"], 5.0, cap) == 4
    assert list(retention.sessions) == ["b", "c"] and retention.num_pinned_blocks == 8
    # A prefix longer than the cap keeps its first blocks only.
    assert retention.retain("c", all_hashes["c"], 5.0, 0.15) == 3
    assert list(retention.sessions) == ["c"]


def test_sessions_sharing_a_prefix_pin_it_once_each() -> None:
    pool, hashes = cached_pool(16, list(range(1, 25)))
    retention = SessionRetention(pool, clock=Clock())
    retention.retain("a", hashes, 5.0, 1.0)
    retention.retain("b", hashes[:4], 5.0, 1.0)
    assert [block.ref_cnt for block in pool.blocks[:6]] == [2, 2, 2, 2, 1, 1]
    assert retention.num_pinned_blocks == 6
    retention.release("a")
    assert [block.ref_cnt for block in pool.blocks[:6]] == [1, 1, 1, 1, 0, 0]
    retention.release("b")
    assert pool.num_free_blocks == 16


def test_retaining_again_replaces_the_previous_pins_without_freeing_shared_blocks() -> None:
    pool, hashes = cached_pool(16, list(range(1, 25)))
    retention = SessionRetention(pool, clock=Clock())
    retention.retain("s", hashes[:4], 5.0, 1.0)
    retention.retain("s", hashes, 5.0, 1.0)
    assert [block.ref_cnt for block in pool.blocks[:6]] == [1] * 6
    assert retention.num_sessions == 1 and pool.num_free_blocks == 10
    assert retention.retain("s", hashes, ttl_seconds=0.0) == 0  # a zero TTL retains nothing
    assert pool.num_free_blocks == 16


# ---- SessionTurns: which finished turns are retained -------------------------------------------

def _finished_request(scheduler: Scheduler, runner: FakeRunner, request: Request) -> Request:
    scheduler.add_request(request)
    while scheduler.has_unfinished_requests():
        step(scheduler, runner)
    return request


@pytest.mark.parametrize(("require_text", "texts", "finish_reason", "retained"), [
    (None, [], "stop", True),
    ("<tool_call>", ["Let me check. <tool", "_call>\n{...}"], "stop", True),  # the tag split across deltas
    ("<tool_call>", ["The weather is fine."], "stop", False),  # a final answer: the loop ended
    (None, [], "length", False),  # cut off: no tool will run
    (None, [], "abort", False),
])
def test_a_turn_is_retained_only_when_it_ends_in_a_tool_call(require_text: str | None, texts: list[str],
                                                             finish_reason: str, retained: bool) -> None:
    scheduler = make_scheduler(num_blocks=32)
    runner = FakeRunner(BLOCK_SIZE, 32)
    request = make_request("turn-1", list(range(1, 30)), max_tokens=3)
    turns = SessionTurns(scheduler.kv_cache_manager.retention, BLOCK_SIZE)
    turns.add(request, "s", ttl_seconds=10.0, max_retained_fraction=1.0, require_text=require_text)
    _finished_request(scheduler, runner, request)
    for text in texts:
        turns.on_text("turn-1", text)
    pinned = turns.on_finish("turn-1", finish_reason)
    retention = scheduler.kv_cache_manager.retention
    assert retention.is_retained("s") == retained
    # 29 prompt + 3 outputs, of which 31 computed: 7 full blocks.
    assert pinned == (7 if retained else 0)


# ---- the scheduler under pressure from other traffic -------------------------------------------

def _session_prompt() -> list[int]:
    return [(7 * i) % 89 + 1 for i in range(40)]  # 10 blocks


def _run_tool_loop(retain: bool, clock: Clock, tool_seconds: float) -> tuple[Scheduler, Request]:
    """Turn 1 of a session, then other traffic that cycles the whole pool while the tool runs,
    then turn 2 (turn 1's prompt and output plus the tool result)."""
    scheduler = make_scheduler(num_blocks=32, policy="priority", max_num_batched_tokens=64)
    scheduler.kv_cache_manager.retention.clock = clock
    turn_1_output = [90, 91, 92, 93]
    runner = FakeRunner(BLOCK_SIZE, 32, next_token=scripted({"turn-1": turn_1_output}))
    turns = SessionTurns(scheduler.kv_cache_manager.retention, BLOCK_SIZE)
    prompt = _session_prompt()
    turn_1 = make_request("turn-1", prompt, max_tokens=4)
    if retain:
        turns.add(turn_1, "session", ttl_seconds=30.0, max_retained_fraction=0.5)
    scheduler.add_request(turn_1, session_id="session")
    while scheduler.has_unfinished_requests():
        step(scheduler, runner)
    turns.on_finish("turn-1", "stop")

    # The tool runs: eight other requests, 28 distinct tokens each, two at a time (16 blocks: they
    # fit beside the pins, so this is churn, not a shortage), go through the pool (256 tokens >
    # the pool's 128): LRU eviction reaches every free block.
    for wave in range(4):
        for index in range(2):
            number = wave * 2 + index
            scheduler.add_request(make_request(f"other-{number}", [1000 + number * 50 + i for i in range(28)],
                                               max_tokens=4))
        while scheduler.has_unfinished_requests():
            step(scheduler, runner)
        clock.now += tool_seconds / 4

    turn_2 = make_request("turn-2", prompt + turn_1_output + [95, 96, 97, 98, 99], max_tokens=2)
    scheduler.add_request(turn_2, session_id="session")
    step(scheduler, runner)
    return scheduler, turn_2


def test_under_pressure_a_retained_session_still_finds_its_prefix() -> None:
    scheduler, turn_2 = _run_tool_loop(retain=True, clock=Clock(), tool_seconds=3.0)
    # Turn 1 computed 40 + 3 tokens: its 10 full blocks were pinned, and turn 2 hits them all.
    assert turn_2.num_cached_tokens == 40
    # Admitting turn 2 handed the blocks over: no pins are left behind.
    assert scheduler.kv_cache_manager.retention.num_sessions == 0


def test_without_retention_the_same_traffic_evicts_the_prefix() -> None:
    _, turn_2 = _run_tool_loop(retain=False, clock=Clock(), tool_seconds=3.0)
    assert turn_2.num_cached_tokens == 0


def test_a_tool_slower_than_the_ttl_loses_the_prefix_and_the_pins_are_released() -> None:
    clock = Clock()
    scheduler, turn_2 = _run_tool_loop(retain=True, clock=clock, tool_seconds=61.0)
    assert turn_2.num_cached_tokens == 0
    assert scheduler.kv_cache_manager.retention.num_sessions == 0
    assert scheduler.kv_cache_manager.retention.num_expired == 1


def test_retained_blocks_do_not_count_as_used_and_expire_when_idle() -> None:
    clock = Clock()
    scheduler = make_scheduler(num_blocks=32)
    retention = scheduler.kv_cache_manager.retention
    retention.clock = clock
    runner = FakeRunner(BLOCK_SIZE, 32)
    request = make_request("turn-1", _session_prompt(), max_tokens=2)
    _finished_request(scheduler, runner, request)
    retention.retain("s", request.block_hashes, ttl_seconds=10.0, max_retained_fraction=1.0)
    assert scheduler.kv_cache_manager.usage == 0.0
    assert scheduler.kv_cache_manager.num_free_blocks == 32 - 10
    clock.now += 11.0
    assert retention.expire() == ["s"]
    assert scheduler.kv_cache_manager.num_free_blocks == 32


def test_running_requests_take_retained_blocks_before_anyone_is_preempted() -> None:
    scheduler = make_scheduler(num_blocks=16, max_num_batched_tokens=64)
    retention = scheduler.kv_cache_manager.retention
    retention.clock = Clock()
    runner = FakeRunner(BLOCK_SIZE, 16)
    session = make_request("turn-1", list(range(1, 33)), max_tokens=1)  # 8 blocks
    _finished_request(scheduler, runner, session)
    assert retention.retain("s", session.block_hashes, 30.0, 1.0) == 8
    # Two requests admitted together (3 blocks each) that grow to 6 blocks each as they decode:
    # the pool has 8 unpinned blocks.
    for index in range(2):
        scheduler.add_request(make_request(f"r{index}", [500 + 40 * index + i for i in range(12)], max_tokens=12))
    while scheduler.has_unfinished_requests():
        step(scheduler, runner)
    assert scheduler.num_preemptions == 0
    assert retention.num_released_for_pressure == 1 and retention.num_sessions == 0


def test_a_waiting_request_that_cannot_fit_takes_the_pins_when_nothing_runs() -> None:
    scheduler = make_scheduler(num_blocks=16)
    retention = scheduler.kv_cache_manager.retention
    retention.clock = Clock()
    runner = FakeRunner(BLOCK_SIZE, 16)
    session = make_request("turn-1", list(range(1, 41)), max_tokens=1)  # 10 blocks
    _finished_request(scheduler, runner, session)
    retention.retain("s", session.block_hashes, 30.0, 1.0)
    big = make_request("big", [700 + i for i in range(40)], max_tokens=2)  # needs 11 blocks
    scheduler.add_request(big)
    output, _ = step(scheduler, runner)
    assert [new.req_id for new in output.scheduled_new_reqs] == ["big"]
    assert retention.num_sessions == 0


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_the_next_turn_of_a_retained_session_goes_first(policy: str) -> None:
    scheduler = make_scheduler(num_blocks=64, policy=policy, max_num_seqs=1)
    retention = scheduler.kv_cache_manager.retention
    retention.clock = Clock()
    runner = FakeRunner(BLOCK_SIZE, 64)
    turn_1 = make_request("turn-1", _session_prompt(), max_tokens=2)
    _finished_request(scheduler, runner, turn_1)
    retention.retain("s", turn_1.block_hashes, 30.0, 1.0)
    for index in range(3):
        scheduler.add_request(make_request(f"other-{index}", [300 + 20 * index + i for i in range(12)]))
    scheduler.add_request(make_request("turn-2", turn_1.all_token_ids + [5, 6], max_tokens=2), session_id="s")
    scheduler.add_request(make_request("stranger", [900 + i for i in range(12)]), session_id="not-retained")
    output, _ = step(scheduler, runner)
    assert [new.req_id for new in output.scheduled_new_reqs] == ["turn-2"]
    assert retention.num_sessions == 0


def test_reset_prefix_cache_releases_retention() -> None:
    scheduler = make_scheduler(num_blocks=32)
    retention = scheduler.kv_cache_manager.retention
    runner = FakeRunner(BLOCK_SIZE, 32)
    request = make_request("turn-1", _session_prompt(), max_tokens=2)
    _finished_request(scheduler, runner, request)
    retention.retain("s", request.block_hashes, 30.0, 1.0)
    assert scheduler.reset_prefix_cache()
    assert retention.num_sessions == 0 and not scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block
