"""Property tests: canonicalization is idempotent and never touches what it must not."""

from __future__ import annotations

import json
import re
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.canonical.pipeline import canonicalize
from gateway.canonical.policy import Policy
from gateway.canonical.rules import normalize_text

_VOLATILE_BITS = st.sampled_from([
    "2026-03-01T10:15:00Z", "2025-12-31", "123e4567-e89b-12d3-a456-426614174000", "request_id: abc12345",
    "sess_9f8e7d6c5b4a3", "nonce=Zx81kQ", "x-anthropic-billing-header: cc_version=1; cch=77;", "March 3, 2026",
    "deadbeef0123456789abcdefdeadbeef",
])
_TEXT = st.text(alphabet=string.ascii_letters + string.digits + " \t\r\n.:-_=[]{}\"'éü\u0301<>/", max_size=40)
_MIXED = st.lists(st.one_of(_TEXT, _VOLATILE_BITS), max_size=5).map("".join)

_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=5)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=8,
)


@st.composite
def tool_calls(draw: st.DrawFn) -> list[dict]:
    calls = []
    for index in range(draw(st.integers(1, 2))):
        arguments = draw(st.one_of(_JSON.map(json.dumps), _TEXT))
        calls.append({"id": f"call_{index}", "type": "function",
                      "function": {"name": draw(st.sampled_from(["f", "g"])), "arguments": arguments}})
    return calls


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[dict], list[dict] | None]:
    messages: list[dict] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_MIXED)})
    for _ in range(draw(st.integers(1, 6))):
        role = draw(st.sampled_from(["user", "assistant", "tool", "system"]))
        message: dict = {"role": role, "content": draw(_MIXED)}
        if role == "assistant" and draw(st.booleans()):
            message["tool_calls"] = draw(tool_calls())
            if draw(st.booleans()):
                message["content"] = "<think>\n</think>\n" + message["content"]
        if role == "tool":
            message["tool_call_id"] = "call_0"
        messages.append(message)
    tools = None
    if draw(st.booleans()):
        tools = [{"type": "function", "function": {"name": draw(st.sampled_from(["a", "b", "c", "zz"])),
                                                   "description": draw(_TEXT), "parameters": draw(_JSON)}}
                 for _ in range(draw(st.integers(0, 4)))]
    return messages, tools


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _text(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)  # order-sensitive, unlike == on dicts


@SETTINGS
@given(conversations(), st.sampled_from(list(Policy)))
def test_canonicalizing_twice_changes_nothing(conversation: tuple[list[dict], list[dict] | None],
                                             policy: Policy) -> None:
    messages, tools = conversation
    once = canonicalize(messages, tools, policy)
    twice = canonicalize(once.messages, once.tools, policy)
    assert _text(twice.messages) == _text(once.messages)
    assert _text(twice.tools) == _text(once.tools)


@SETTINGS
@given(conversations(), st.sampled_from(list(Policy)))
def test_order_roles_user_content_and_tool_results_are_kept(conversation: tuple[list[dict], list[dict] | None],
                                                            policy: Policy) -> None:
    messages, tools = conversation
    result = canonicalize(messages, tools, policy)
    kept = result.conversation_messages
    assert [m["role"] for m in kept] == [m["role"] for m in messages]
    for before, after in zip(messages, kept):
        if before["role"] in ("user", "tool"):
            assert after == before
        if before.get("tool_calls"):
            assert [(c["id"], c["function"]["name"]) for c in after["tool_calls"]] == [
                (c["id"], c["function"]["name"]) for c in before["tool_calls"]]
            for call_before, call_after in zip(before["tool_calls"], after["tool_calls"]):
                try:
                    # Compared as re-serialised values: NaN (which json reads) never equals itself.
                    assert json.dumps(json.loads(call_after["function"]["arguments"]), sort_keys=True) == json.dumps(
                        json.loads(call_before["function"]["arguments"]), sort_keys=True)
                except ValueError:
                    assert call_after["function"]["arguments"] == call_before["function"]["arguments"]
    # The inputs are never mutated.
    assert all(isinstance(m, dict) for m in messages)
    if tools is not None:
        assert sorted(_tool_names(result.tools)) == sorted(_tool_names(tools))


@SETTINGS
@given(conversations())
def test_policy_off_is_the_identity(conversation: tuple[list[dict], list[dict] | None]) -> None:
    messages, tools = conversation
    before = _text([messages, tools])
    result = canonicalize(messages, tools, Policy.OFF)
    assert _text([result.messages, result.tools]) == before
    assert _text([messages, tools]) == before  # the input is not mutated


_BILLING_LINE = re.compile(r"^x-anthropic-billing-header:[^\n]*\n?", re.MULTILINE | re.IGNORECASE)


@SETTINGS
@given(conversations())
def test_the_note_restores_every_value_moved_out(conversation: tuple[list[dict], list[dict] | None]) -> None:
    messages, tools = conversation
    result = canonicalize(messages, tools, Policy.SAFE)
    systems = [m["content"] for m in result.conversation_messages if m["role"] == "system"]
    originals = [m["content"] for m in messages if m["role"] == "system"]
    for canonical_text, original in zip(systems, originals):
        restored = canonical_text
        for name, value in result.volatile_values.items():
            restored = restored.replace(name, value)
        # Billing-header lines are dropped, not moved (transport metadata, never model input).
        assert restored == _BILLING_LINE.sub("", normalize_text(original))


def _tool_names(tools: list[dict] | None) -> list[str]:
    return [tool["function"]["name"] for tool in tools or []]
