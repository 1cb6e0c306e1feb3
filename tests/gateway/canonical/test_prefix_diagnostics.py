"""Prefix diagnostics: the first diverged segment, reusable tokens, and one hash space."""

from __future__ import annotations

import pytest

from engine.core.block_hash import hash_token_blocks, make_block_hasher
from engine.request import Request
from engine.sampling_params import SamplingParams
from gateway.canonical.diagnostics import (
    NEW_SESSION,
    NO_DIVERGENCE,
    VOLATILE_NOTE,
    conversation_segments,
    first_divergence,
    message_digest,
    output_segment,
    reusable_tokens,
)
from gateway.canonical.pipeline import canonicalize
from gateway.canonical.policy import Policy
from gateway.sessions import prefix_key

TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
         for name in ("b_tool", "a_tool")]


def turn_1(stamp: str = "2026-03-01T10:00:00Z") -> list[dict]:
    return [{"role": "system", "content": f"Agent at {stamp}."}, {"role": "user", "content": "weather?"}]


def turn_2(stamp: str, arguments: str = '{"city": "Paris"}') -> list[dict]:
    return turn_1(stamp) + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "a_tool", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "sunny"},
    ]


def previous_segments(messages: list[dict], tools: list[dict], policy: Policy) -> list:
    canonical = canonicalize(messages, tools, policy)
    return [*conversation_segments(canonical), output_segment(None, [("a_tool", '{"city":"Paris"}')])]


def test_the_first_request_of_a_session_is_new() -> None:
    assert first_divergence(None, conversation_segments(canonicalize(turn_1(), TOOLS, Policy.SAFE))) == NEW_SESSION


def test_safe_policy_breaks_only_at_the_note() -> None:
    previous = previous_segments(turn_1("2026-03-01T10:00:00Z"), TOOLS, Policy.SAFE)
    current = conversation_segments(canonicalize(turn_2("2026-03-01T10:00:09Z"), list(reversed(TOOLS)), Policy.SAFE))
    assert first_divergence(previous, current) == VOLATILE_NOTE


def test_policy_off_names_the_segment_that_broke_the_prefix() -> None:
    previous = previous_segments(turn_1(), TOOLS, Policy.OFF)
    shuffled = conversation_segments(canonicalize(turn_2("2026-03-01T10:00:00Z"), list(reversed(TOOLS)), Policy.OFF))
    assert first_divergence(previous, shuffled) == "tools"
    restamped = conversation_segments(canonicalize(turn_2("2026-03-01T10:00:09Z"), TOOLS, Policy.OFF))
    assert first_divergence(previous, restamped) == "system"
    exact = conversation_segments(canonicalize(turn_2("2026-03-01T10:00:00Z"), TOOLS, Policy.OFF))
    assert first_divergence(previous, exact) == NO_DIVERGENCE


def test_an_answer_sent_back_differently_is_an_output_divergence() -> None:
    previous = previous_segments(turn_1(), TOOLS, Policy.OFF)
    changed = conversation_segments(canonicalize(turn_2("2026-03-01T10:00:00Z", '{"city": "Lyon"}'), TOOLS,
                                                 Policy.OFF))
    assert first_divergence(previous, changed) == "output"


def test_an_edited_or_cut_history_names_the_message() -> None:
    messages = turn_2("2026-03-01T10:00:00Z") + [{"role": "user", "content": "and tomorrow?"}]
    previous = [*conversation_segments(canonicalize(messages, TOOLS, Policy.OFF)), output_segment("ok", [])]
    edited = [dict(m) for m in messages]
    edited[1]["content"] = "weather??"
    assert first_divergence(previous, conversation_segments(canonicalize(edited, TOOLS, Policy.OFF))) == "message[1]"
    cut = conversation_segments(canonicalize(messages[:2], TOOLS, Policy.OFF))
    assert first_divergence(previous, cut) == "message[2]"


def test_message_digests_ignore_call_ids_and_argument_layout() -> None:
    def call(call_id: str, arguments: str) -> dict:
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "function": {"name": "f", "arguments": arguments}}]}

    assert message_digest(call("a", '{"x":1,"y":2}')) == message_digest(call("b", '{"y": 2, "x": 1}'))
    assert message_digest(call("a", '{"x":1}')) != message_digest(call("a", '{"x":2}'))


def test_reusable_tokens_are_whole_shared_blocks_short_of_the_last_token() -> None:
    previous = hash_token_blocks(list(range(100)), 16, "seed")
    current_ids = list(range(70)) + [999] * 30
    current = hash_token_blocks(current_ids, 16, "seed")
    assert reusable_tokens(previous, current, 16, len(current_ids)) == 64  # 4 blocks, then 70 != 999 at block 4
    assert reusable_tokens(None, current, 16, len(current_ids)) == 0
    # A prompt that is entirely cached still recomputes its last token: 64 of 64 tokens -> 48.
    same = hash_token_blocks(list(range(64)), 16, "seed")
    assert reusable_tokens(previous, same, 16, 64) == 48


def test_a_different_salt_or_seed_shares_nothing() -> None:
    ids = list(range(64))
    assert hash_token_blocks(ids, 16, "seed", "tenant-a")[0] != hash_token_blocks(ids, 16, "seed", "tenant-b")[0]
    assert hash_token_blocks(ids, 16, "seed")[0] != hash_token_blocks(ids, 16, "other-seed")[0]


@pytest.mark.parametrize("cache_salt", [None, "tenant-a"])
def test_gateway_keys_are_the_engine_request_keys(cache_salt: str | None) -> None:
    """One hash space: the gateway's keys over a token stream are the engine's block hashes."""
    token_ids = [(i * 13) % 500 for i in range(75)]
    request = Request("r", token_ids, SamplingParams(), cache_salt=cache_salt,
                      block_hasher=make_block_hasher(16, "model|float32"))
    assert hash_token_blocks(token_ids, 16, "model|float32", cache_salt) == request.block_hashes
    assert prefix_key(token_ids, 16, "model|float32", cache_salt) == request.block_hashes[-1].hex()[:32]
    # Shorter than a block: still a key of the same chain (a partial block under the same root).
    assert prefix_key(token_ids[:5], 16, "model|float32", cache_salt) != prefix_key(token_ids[:6], 16,
                                                                                  "model|float32", cache_salt)
