"""One input -> canonical output case per rule, each rule run alone, plus the policy gates."""

from __future__ import annotations

import json

import pytest

from gateway.canonical.canonical_json import canonical_arguments, canonical_dumps, sort_keys
from gateway.canonical.pipeline import NOTE_HEADER, canonicalize
from gateway.canonical.policy import POLICY_HEADER, Policy, narrow, parse_policy
from gateway.canonical.rules import RULE_NAMES, RULES, Conversation


def run_rule(name: str, messages: list[dict], tools: list[dict] | None = None,
             policy: Policy = Policy.SAFE) -> Conversation:
    [rule] = [rule for rule in RULES if rule.name == name]
    return rule.apply(Conversation(messages, tools), policy)


def weather_tool(parameters: dict, name: str = "get_weather", description: str = "Weather.") -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def test_system_text_normalizes_line_endings_trailing_space_and_nfc() -> None:
    decomposed = "Cafe\u0301"  # e + combining acute
    result = run_rule("system_text", [
        {"role": "system", "content": f"You are {decomposed}.  \r\nBe brief.\t\rEnd"},
        {"role": "user", "content": "keep  \r\n me"},
    ], [weather_tool({}, description="Line one.  \r\nLine two.")])
    assert result.messages[0]["content"] == "You are Caf\u00e9.\nBe brief.\nEnd"
    assert result.messages[1]["content"] == "keep  \r\n me"  # user content is never touched
    assert result.tools[0]["function"]["description"] == "Line one.\nLine two."


def test_tool_order_sorts_by_function_name() -> None:
    tools = [weather_tool({}, name=name) for name in ("search", "get_weather", "read_file")]
    result = run_rule("tool_order", [], tools)
    assert [tool["function"]["name"] for tool in result.tools] == ["get_weather", "read_file", "search"]


def test_schema_key_order_sorts_schema_keys_but_keeps_the_function_layout() -> None:
    tool = {"function": {"parameters": {"type": "object", "required": ["b"], "properties": {
        "b": {"type": "string", "description": "B"}, "a": {"enum": ["y", "x"], "type": "string"}}},
        "description": "Weather.", "strict": True, "name": "get_weather"}, "type": "function"}
    result = run_rule("schema_key_order", [], [tool])
    assert json.dumps(result.tools[0]) == json.dumps({"type": "function", "function": {
        "name": "get_weather", "description": "Weather.", "parameters": {
            "properties": {"a": {"enum": ["y", "x"], "type": "string"}, "b": {"description": "B", "type": "string"}},
            "required": ["b"], "type": "object"}, "strict": True}})


def test_schema_required_order_sorts_required_lists_at_every_depth() -> None:
    parameters = {"type": "object", "required": ["b", "a"], "properties": {
        "inner": {"type": "object", "required": ["z", "y"], "properties": {}}}}
    result = run_rule("schema_required_order", [], [weather_tool(parameters)])
    parameters = result.tools[0]["function"]["parameters"]
    assert parameters["required"] == ["a", "b"]
    assert parameters["properties"]["inner"]["required"] == ["y", "z"]


def test_tool_call_arguments_are_reserialized_canonically() -> None:
    result = run_rule("tool_call_arguments", [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b":1,  "a":{"d":[2,1],"c":"é"}}'}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
    ]}])
    calls = result.messages[0]["tool_calls"]
    assert calls[0]["function"]["arguments"] == '{"a": {"c": "é", "d": [2, 1]}, "b": 1}'
    assert calls[1]["function"]["arguments"] == "not json"
    assert calls[0]["id"] == "c1"


def test_empty_reasoning_blocks_are_dropped_from_assistant_turns_only() -> None:
    result = run_rule("empty_reasoning", [
        {"role": "assistant", "content": "<think>\n\n</think>\n\nThe answer is 4."},
        {"role": "assistant", "content": "<think>real thoughts</think>4"},
        {"role": "user", "content": "<think></think>keep"},
    ])
    assert [m["content"] for m in result.messages] == ["The answer is 4.", "<think>real thoughts</think>4",
                                                       "<think></think>keep"]


def test_volatile_spans_move_to_placeholders_under_safe_and_are_stripped_under_aggressive() -> None:
    system = ("x-anthropic-billing-header: cc_version=1.0.33; cch=8f3a1;\n"
              "Today is 2026-03-01T10:15:00Z (2026-03-01). Session id: sess_9f8e7d6c5b4a.\n"
              "Trace 123e4567-e89b-12d3-a456-426614174000.")
    safe = run_rule("volatile_spans", [{"role": "system", "content": system}])
    # The billing line is transport metadata, dropped under every policy but off.
    assert safe.messages[0]["content"] == ("Today is [timestamp-a] ([date-a]). "
                                           "Session id: [id-a].\nTrace [uuid-a].")
    assert safe.volatile_values == {
        "[timestamp-a]": "2026-03-01T10:15:00Z", "[date-a]": "2026-03-01", "[id-a]": "sess_9f8e7d6c5b4a",
        "[uuid-a]": "123e4567-e89b-12d3-a456-426614174000"}
    aggressive = run_rule("volatile_spans", [{"role": "system", "content": system}], policy=Policy.AGGRESSIVE)
    assert aggressive.messages[0]["content"] == "Today is [timestamp] ([date]). Session id: [id].\nTrace [uuid]."
    assert aggressive.volatile_values == {}


def test_every_rule_is_listed_once() -> None:
    assert len(set(RULE_NAMES)) == len(RULE_NAMES) == 7


def test_policy_off_changes_nothing_and_safe_adds_the_note_last() -> None:
    messages = [{"role": "system", "content": "Now: 2026-03-01T10:15:00Z  "}, {"role": "user", "content": "hi"}]
    tools = [weather_tool({}, name="b"), weather_tool({}, name="a")]
    off = canonicalize(messages, tools, Policy.OFF)
    assert off.messages == messages and off.tools == tools and off.rules_applied == []
    safe = canonicalize(messages, tools, Policy.SAFE)
    assert safe.rules_applied == ["system_text", "tool_order", "volatile_spans"]
    assert safe.messages[-1]["role"] == "system"
    assert safe.messages[-1]["content"] == f"{NOTE_HEADER}\n[timestamp-a] = 2026-03-01T10:15:00Z"
    assert safe.conversation_messages == [{"role": "system", "content": "Now: [timestamp-a]"},
                                          {"role": "user", "content": "hi"}]
    aggressive = canonicalize(messages, tools, Policy.AGGRESSIVE)
    assert not aggressive.has_note and aggressive.messages[0]["content"] == "Now: [timestamp]"


def test_rules_can_be_switched_off_one_by_one() -> None:
    messages = [{"role": "system", "content": "Now: 2026-03-01T10:15:00Z"}, {"role": "user", "content": "hi"}]
    result = canonicalize(messages, None, Policy.SAFE, disabled_rules={"volatile_spans"})
    assert result.messages == messages and not result.has_note


def test_two_requests_differing_only_in_volatile_values_share_everything_but_the_note() -> None:
    def request(stamp: str, request_id: str) -> list[dict]:
        return [{"role": "system", "content": f"Agent. Time {stamp}. request_id={request_id}"},
                {"role": "user", "content": "go"}]

    first = canonicalize(request("2026-03-01T10:00:00Z", "abcdef123"), None, Policy.SAFE)
    second = canonicalize(request("2026-03-01T10:00:07Z", "zyxwvu987"), None, Policy.SAFE)
    assert first.conversation_messages == second.conversation_messages
    assert first.messages[-1] != second.messages[-1]


def test_canonical_json_sorts_by_utf16_code_units_and_keeps_arrays() -> None:
    value = {"\U0001f600": 1, "\uff5e": 2, "b": [3, {"z": 1, "a": 2}], "a": None}
    # U+FF5E sorts after the surrogate pair of U+1F600 in UTF-16 (0xD83D < 0xFF5E).
    assert list(sort_keys(value)) == ["a", "b", "\U0001f600", "\uff5e"]
    assert canonical_dumps(value) == '{"a": null, "b": [3, {"a": 2, "z": 1}], "😀": 1, "～": 2}'
    assert canonical_arguments("[1, 2]") == "[1, 2]" and canonical_arguments('"text"') == '"text"'


@pytest.mark.parametrize(("server", "header", "expected"), [
    (Policy.SAFE, None, Policy.SAFE),
    (Policy.SAFE, "off", Policy.OFF),
    (Policy.SAFE, "AGGRESSIVE", Policy.SAFE),  # a request may narrow, never widen
    (Policy.AGGRESSIVE, "safe", Policy.SAFE),
    (Policy.OFF, "aggressive", Policy.OFF),
])
def test_a_request_header_narrows_the_server_policy(server: Policy, header: str | None, expected: Policy) -> None:
    assert narrow(server, header) == expected


def test_a_bad_policy_names_the_header() -> None:
    with pytest.raises(ValueError, match=POLICY_HEADER):
        narrow(Policy.SAFE, "strict")
    with pytest.raises(ValueError, match="canonicalization"):
        parse_policy("bogus")
