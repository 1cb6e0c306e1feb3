"""The canonicalization rules: small, pure, individually switchable, idempotent.

Each rule maps a `Conversation` (the normalised message dicts both chat routes produce, the tool
list, and the volatile values collected so far) to a new one, never mutating its input. A rule
runs when the request's policy is at least the rule's `min_policy`; rules that act differently
by policy read it. docs/canonicalization.md shows one before/after example per rule.

What no rule ever changes: the number, order and roles of messages, user message content, and
tool results. Only system prompts, tool definitions, and the rendering of earlier assistant
turns (which the model itself wrote) are rewritten.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.canonical.canonical_json import canonical_arguments, sort_keys
from gateway.canonical.policy import Policy
from gateway.canonical.volatile import replace_volatile_spans

Message = dict[str, Any]
Tool = dict[str, Any]


@dataclass(frozen=True)
class Conversation:
    messages: list[Message]
    tools: list[Tool] | None
    # placeholder -> value of the volatile spans moved out of the system prompts (policy safe).
    volatile_values: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Rule:
    name: str
    min_policy: Policy
    summary: str
    apply: Callable[[Conversation, Policy], Conversation]


# ---- system prompt text ---------------------------------------------------------------------

_TRAILING_SPACE = re.compile(r"[ \t]+$", re.MULTILINE)


def normalize_text(text: str) -> str:
    """CRLF and CR -> LF, no trailing spaces or tabs on any line, Unicode NFC."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", _TRAILING_SPACE.sub("", text))


def _system_text(conversation: Conversation, policy: Policy) -> Conversation:
    messages = [
        {**message, "content": normalize_text(message["content"])}
        if message.get("role") == "system" and isinstance(message.get("content"), str) else message
        for message in conversation.messages
    ]
    tools = conversation.tools
    if tools:
        tools = [_map_function(tool, _normalize_description) for tool in tools]
    return replace(conversation, messages=messages, tools=tools)


def _normalize_description(function: dict[str, Any]) -> dict[str, Any]:
    description = function.get("description")
    if isinstance(description, str):
        return {**function, "description": normalize_text(description)}
    return function


# ---- tools ----------------------------------------------------------------------------------

def _tool_name(tool: Tool) -> str:
    function = tool.get("function")
    name = function.get("name") if isinstance(function, dict) else tool.get("name")
    return name if isinstance(name, str) else ""


def _tool_order(conversation: Conversation, policy: Policy) -> Conversation:
    if not conversation.tools:
        return conversation
    # sorted() is stable: tools with equal names keep their relative order.
    return replace(conversation, tools=sorted(conversation.tools, key=_tool_name))


# The fields of a function definition in the order templates conventionally print them.
_FUNCTION_KEY_ORDER = ("name", "description", "parameters")


def _canonical_function(function: dict[str, Any]) -> dict[str, Any]:
    ordered = {key: function[key] for key in _FUNCTION_KEY_ORDER if key in function}
    for key in sorted(set(function) - set(_FUNCTION_KEY_ORDER)):
        ordered[key] = sort_keys(function[key])
    if isinstance(ordered.get("parameters"), dict):
        ordered["parameters"] = sort_keys(ordered["parameters"])
    return ordered


def _schema_key_order(conversation: Conversation, policy: Policy) -> Conversation:
    if not conversation.tools:
        return conversation
    tools = []
    for tool in conversation.tools:
        tool = _map_function(tool, _canonical_function)
        # {"type": ..., "function": ...} first, anything else after in canonical order.
        ordered = {key: tool[key] for key in ("type", "function") if key in tool}
        for key in sorted(set(tool) - {"type", "function"}):
            ordered[key] = sort_keys(tool[key])
        tools.append(ordered)
    return replace(conversation, tools=tools)


def _sorted_required(schema: Any) -> Any:
    if isinstance(schema, dict):
        result = {key: _sorted_required(value) for key, value in schema.items()}
        required = result.get("required")
        if isinstance(required, list) and all(isinstance(item, str) for item in required):
            result["required"] = sorted(required)
        return result
    if isinstance(schema, list):
        return [_sorted_required(item) for item in schema]
    return schema


def _schema_required_order(conversation: Conversation, policy: Policy) -> Conversation:
    if not conversation.tools:
        return conversation

    def fix(function: dict[str, Any]) -> dict[str, Any]:
        if isinstance(function.get("parameters"), dict):
            return {**function, "parameters": _sorted_required(function["parameters"])}
        return function

    return replace(conversation, tools=[_map_function(tool, fix) for tool in conversation.tools])


def _map_function(tool: Tool, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Tool:
    function = tool.get("function")
    if isinstance(function, dict):
        return {**tool, "function": change(function)}
    return tool


# ---- earlier assistant turns ----------------------------------------------------------------

def _tool_call_arguments(conversation: Conversation, policy: Policy) -> Conversation:
    messages = []
    for message in conversation.messages:
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if calls:
            message = {**message, "tool_calls": [
                {**call, "function": {**call["function"],
                                      "arguments": canonical_arguments(call["function"].get("arguments", ""))}}
                if isinstance(call.get("function"), dict) and isinstance(call["function"].get("arguments"), str)
                else call
                for call in calls
            ]}
        messages.append(message)
    return replace(conversation, messages=messages)


_EMPTY_REASONING = re.compile(r"\A\s*<think>\s*</think>\s*")


def _empty_reasoning(conversation: Conversation, policy: Policy) -> Conversation:
    messages = [
        {**message, "content": _EMPTY_REASONING.sub("", message["content"])}
        if message.get("role") == "assistant" and isinstance(message.get("content"), str) else message
        for message in conversation.messages
    ]
    return replace(conversation, messages=messages)


# ---- volatile values ------------------------------------------------------------------------

def _volatile_spans(conversation: Conversation, policy: Policy) -> Conversation:
    values = dict(conversation.volatile_values)
    strip = policy >= Policy.AGGRESSIVE
    messages = [
        {**message, "content": replace_volatile_spans(message["content"], values, strip)}
        if message.get("role") == "system" and isinstance(message.get("content"), str) else message
        for message in conversation.messages
    ]
    return replace(conversation, messages=messages, volatile_values=values)


RULES: tuple[Rule, ...] = (
    Rule("system_text", Policy.SAFE,
         "system prompts and tool descriptions: CRLF -> LF, no trailing whitespace, Unicode NFC", _system_text),
    Rule("tool_order", Policy.SAFE, "tools sorted by function name", _tool_order),
    Rule("schema_key_order", Policy.SAFE,
         "tool definitions and JSON schemas with keys in canonical (RFC 8785) order", _schema_key_order),
    Rule("schema_required_order", Policy.SAFE, "\"required\" lists of JSON schemas sorted (they are sets)",
         _schema_required_order),
    Rule("tool_call_arguments", Policy.SAFE, "tool-call arguments in history re-serialized as canonical JSON",
         _tool_call_arguments),
    Rule("empty_reasoning", Policy.SAFE, "empty <think></think> blocks dropped from earlier assistant turns",
         _empty_reasoning),
    Rule("volatile_spans", Policy.SAFE,
         "timestamps, dates, ids and nonces in system prompts: moved to a note at the end (safe) or stripped "
         "(aggressive); billing-header lines dropped", _volatile_spans),
)

RULE_NAMES = tuple(rule.name for rule in RULES)
