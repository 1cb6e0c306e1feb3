"""The official `anthropic` SDK against a real server: messages, streaming, tools, count_tokens."""

from __future__ import annotations

import anthropic
import pytest

from tests.gateway.conftest import MODEL, Server

# This SDK version no longer has sampling keywords; the API still takes them in the body.
GREEDY = {"temperature": 0}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def client(server: Server) -> anthropic.Anthropic:
    # The SDK sends the key as x-api-key, which the gateway accepts.
    return anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0, timeout=120)


def test_message_non_streamed(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model=MODEL, max_tokens=8, messages=QUESTION, extra_body=GREEDY,
                                     system="You are a geography expert.")
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    [block] = message.content
    assert block.type == "text" and block.text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.output_tokens <= 8 and message.usage.input_tokens > 10


def test_message_streamed_matches_non_streamed(client: anthropic.Anthropic) -> None:
    whole = client.messages.create(model=MODEL, max_tokens=6, messages=QUESTION, extra_body=GREEDY)
    with client.messages.stream(model=MODEL, max_tokens=6, messages=QUESTION, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert "Paris" in text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_stop_sequence(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model=MODEL, max_tokens=12, messages=QUESTION, extra_body=GREEDY,
                                     stop_sequences=[" of"])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == " of"


def test_forced_tool_use_is_well_formed_streamed_and_not(client: anthropic.Anthropic) -> None:
    messages = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    choice = {"type": "tool", "name": "get_weather"}
    message = client.messages.create(model=MODEL, max_tokens=48, messages=messages, tools=[WEATHER_TOOL],
                                     tool_choice=choice, extra_body=GREEDY)
    tool_uses = [block for block in message.content if block.type == "tool_use"]
    assert len(tool_uses) == 1
    assert tool_uses[0].name == "get_weather" and tool_uses[0].id.startswith("toolu_")
    assert isinstance(tool_uses[0].input, dict)
    if message.stop_reason != "max_tokens":
        assert message.stop_reason == "tool_use"
    with client.messages.stream(model=MODEL, max_tokens=48, messages=messages, tools=[WEATHER_TOOL],
                                tool_choice=choice, extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    streamed = [block for block in final.content if block.type == "tool_use"]
    assert [(b.name, b.input) for b in streamed] == [(b.name, b.input) for b in tool_uses]


def test_tool_result_history(client: anthropic.Anthropic) -> None:
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C and sunny"},
            {"type": "text", "text": "Summarize that."}]},
    ]
    message = client.messages.create(model=MODEL, max_tokens=8, messages=messages, tools=[WEATHER_TOOL],
                                     tool_choice={"type": "none"}, extra_body=GREEDY)
    assert message.content and message.content[0].type == "text"


def test_count_tokens_matches_usage(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model=MODEL, messages=QUESTION, system="Be brief.")
    message = client.messages.create(model=MODEL, max_tokens=1, messages=QUESTION, system="Be brief.",
                                     extra_body=GREEDY)
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_errors_use_the_anthropic_format(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(model=MODEL, max_tokens=0, messages=QUESTION)
    assert raised.value.body["type"] == "error"
    assert raised.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in raised.value.body["error"]["message"]
