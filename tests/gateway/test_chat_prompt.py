"""Tools into prompts: the ChatML fallback for SmolLM2, structured tools for tool-aware templates."""

from __future__ import annotations

import json

import pytest

from engine.model.resolve import resolve_model
from engine.model.tokenizer import load_tokenizer
from gateway.chat_prompt import render_chat_prompt, resolve_tool_choice
from gateway.errors import APIError
from gateway.tool_prompt import (
    ToolChoice,
    inline_tool_messages,
    prefill_for,
    structured_tool_messages,
    template_supports_tools,
    tools_system_prompt,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
HISTORY = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
    {"role": "tool", "tool_call_id": "c2", "content": "25 C"},
]
# A minimal tool-aware template in the style of Qwen2.5's: it reads `tools` and renders calls itself.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments.city }}{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def tokenizer():
    # A fresh tokenizer per test: some tests swap its chat template.
    return load_tokenizer(resolve_model(None))


def test_template_support_detection(tokenizer) -> None:
    assert not template_supports_tools(tokenizer.chat_template)  # SmolLM2's plain ChatML
    assert template_supports_tools(TOOL_TEMPLATE)
    assert not template_supports_tools(None)


def test_inline_messages_carry_tools_calls_and_results_as_text() -> None:
    messages = inline_tool_messages([{"role": "system", "content": "Be brief."}, *HISTORY], [WEATHER])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    system = messages[0]["content"]
    assert system.startswith("Be brief.\n\n# Tools") and json.dumps(WEATHER) in system
    assert messages[2]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    )
    assert messages[3]["content"] == "<tool_response>\n21 C\n</tool_response>\n<tool_response>\n25 C\n</tool_response>"
    assert "tool_calls" not in messages[2]


def test_inline_messages_add_a_system_message_when_missing() -> None:
    messages = inline_tool_messages(HISTORY[:1], [WEATHER])
    assert messages[0] == {"role": "system", "content": tools_system_prompt([WEATHER])}
    assert inline_tool_messages(HISTORY[:1], None) == HISTORY[:1]


def test_structured_messages_parse_arguments() -> None:
    messages = structured_tool_messages(HISTORY)
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert HISTORY[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'  # input untouched


def test_smollm_prompt_with_tools_and_forced_call(tokenizer) -> None:
    prompt = render_chat_prompt(tokenizer, HISTORY, [WEATHER], ToolChoice("function", "get_weather"))
    text = tokenizer.decode(prompt.token_ids, skip_special_tokens=False)
    assert "<tools>" in text and '"name": "get_weather"' in text
    assert text.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": ')
    assert prompt.prefill == prefill_for(ToolChoice("function", "get_weather"))
    assert prompt.parse_tools and prompt.extra_stop == ["</tool_call>"]


def test_tool_choice_none_leaves_tools_out(tokenizer) -> None:
    prompt = render_chat_prompt(tokenizer, HISTORY, [WEATHER], ToolChoice("none"))
    text = tokenizer.decode(prompt.token_ids, skip_special_tokens=False)
    assert "<tools>" not in text and "<tool_response>" in text  # history still rendered
    assert not prompt.parse_tools and prompt.prefill == "" and prompt.extra_stop == []


def test_tool_aware_template_gets_structured_tools(tokenizer) -> None:
    tokenizer.chat_template = TOOL_TEMPLATE
    tokenizer.chat_templates = {"default": TOOL_TEMPLATE}
    prompt = render_chat_prompt(tokenizer, HISTORY, [WEATHER], ToolChoice("auto"))
    text = tokenizer.decode(prompt.token_ids, skip_special_tokens=False)
    assert "TOOLS:get_weather;" in text and "CALL get_weather Paris" in text and "<tools>" not in text
    assert prompt.parse_tools and prompt.prefill == ""


def test_template_refusal_is_422_naming_messages(tokenizer) -> None:
    tokenizer.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    tokenizer.chat_templates = {"default": tokenizer.chat_template}
    with pytest.raises(APIError) as raised:
        render_chat_prompt(tokenizer, HISTORY[:1], None, ToolChoice("none"))
    assert raised.value.status == 422 and raised.value.param == "messages"
    assert "alternate" in raised.value.message


def test_reserved_template_kwargs_are_refused(tokenizer) -> None:
    with pytest.raises(APIError) as raised:
        render_chat_prompt(tokenizer, HISTORY[:1], None, ToolChoice("none"), {"chat_template": "{{ 1 }}"})
    assert raised.value.param == "chat_template_kwargs"


def test_resolve_tool_choice() -> None:
    assert resolve_tool_choice(None, None, [], "tool_choice") == ToolChoice("none")
    assert resolve_tool_choice(None, None, ["a"], "tool_choice") == ToolChoice("auto")
    assert resolve_tool_choice("required", None, ["a"], "tool_choice") == ToolChoice("function", "a")
    assert resolve_tool_choice("required", None, ["a", "b"], "tool_choice") == ToolChoice("required")
    assert resolve_tool_choice("function", "b", ["a", "b"], "tool_choice") == ToolChoice("function", "b")
    for mode, name, tools in (("function", "c", ["a"]), ("required", None, []), ("function", "a", [])):
        with pytest.raises(APIError) as raised:
            resolve_tool_choice(mode, name, tools, "tool_choice")
        assert raised.value.status == 400 and raised.value.param == "tool_choice"
