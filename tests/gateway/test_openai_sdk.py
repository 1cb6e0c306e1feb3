"""The official `openai` SDK against a real server: chat, completions, streaming, tools, FIM, usage."""

from __future__ import annotations

import json

import openai
import pytest

from engine.model.resolve import resolve_model
from engine.model.tokenizer import load_tokenizer
from tests.gateway.conftest import MODEL, Server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "Get the local time in a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0, timeout=120)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    [card] = models.data
    assert card.id == MODEL and card.owned_by == "draftgate"
    assert card.model_extra["max_model_len"] > 100


def test_chat_non_streamed_greedy(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0)
    [choice] = response.choices
    assert choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert response.usage.completion_tokens <= 8
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens
    assert response.usage.prompt_tokens_details.cached_tokens >= 0
    assert response.id.startswith("chatcmpl-") and response.object == "chat.completion"


def test_chat_streamed_matches_non_streamed(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=0)
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_content_parts_system_and_developer_roles(client: openai.OpenAI) -> None:
    messages = [
        {"role": "developer", "content": "Answer in one word."},
        {"role": "user", "content": [{"type": "text", "text": "What is the capital"},
                                     {"type": "text", "text": "of France?"}]},
    ]
    response = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=4, temperature=0)
    assert response.choices[0].message.content
    assert response.usage.completion_tokens <= 4


def test_chat_n_seed_and_logprobs(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, n=3, seed=7,
                                              temperature=1.0, logprobs=True, top_logprobs=2)
    assert [c.index for c in response.choices] == [0, 1, 2]
    for choice in response.choices:
        entries = choice.logprobs.content
        assert 1 <= len(entries) <= 4
        for entry in entries:
            assert entry.logprob <= 0.0 and len(entry.top_logprobs) == 2
            assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    again = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, n=3, seed=7, temperature=1.0)
    assert [c.message.content for c in again.choices] == [c.message.content for c in response.choices]


def test_chat_stop_string(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0,
                                              stop=[" of"])
    assert response.choices[0].finish_reason == "stop"
    assert " of" not in response.choices[0].message.content


def test_named_tool_choice_returns_a_well_formed_call(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    response = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL, TIME_TOOL],
                                              tool_choice=choice, max_tokens=48, temperature=0)
    [call] = response.choices[0].message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    if response.choices[0].finish_reason == "tool_calls":
        assert isinstance(json.loads(call.function.arguments), dict)

    stream = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL, TIME_TOOL],
                                            tool_choice=choice, max_tokens=48, temperature=0, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices and c.choices[0].delta.tool_calls]
    first, *rest = [d.tool_calls[0] for d in deltas]
    assert first.index == 0 and first.id.startswith("call_") and first.function.name == "get_weather"
    assert all(d.id is None and d.function.name is None and d.index == 0 for d in rest)
    arguments = first.function.arguments + "".join(d.function.arguments for d in rest)
    assert arguments == call.function.arguments  # greedy: same call, streamed piecewise


def test_required_tool_choice_with_history(client: openai.OpenAI) -> None:
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 21}'},
        {"role": "user", "content": "And in Rome?"},
    ]
    response = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                              tool_choice="required", max_tokens=40, temperature=0)
    [call] = response.choices[0].message.tool_calls
    assert call.function.name == "get_weather"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model(None))


def test_completions_string_batch_and_token_prompts(client: openai.OpenAI, tokenizer) -> None:
    single = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0)
    assert single.choices[0].text.startswith(" Paris") and single.object == "text_completion"
    batch = client.completions.create(model=MODEL, prompt=["The capital of France is", "One, two,"], max_tokens=3,
                                      temperature=0, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[0].text == batch.choices[1].text == single.choices[0].text
    assert batch.usage.completion_tokens <= 12
    assert batch.usage.prompt_tokens == single.usage.prompt_tokens + len(tokenizer.encode("One, two,", True))
    token_ids = tokenizer.encode("The capital of France is", add_special_tokens=True)
    by_ids = client.completions.create(model=MODEL, prompt=token_ids, max_tokens=3, temperature=0)
    assert by_ids.usage.prompt_tokens == len(token_ids)
    assert by_ids.choices[0].text == single.choices[0].text


def test_completions_echo_logprobs_and_stream(client: openai.OpenAI) -> None:
    echoed = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0,
                                       echo=True)
    assert echoed.choices[0].text.startswith("The capital of France is Paris")
    scored = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0,
                                       logprobs=2)
    logprobs = scored.choices[0].logprobs
    assert "".join(logprobs.tokens) == scored.choices[0].text
    assert logprobs.text_offset[0] == 0 and len(logprobs.top_logprobs[0]) >= 1
    chunks = list(client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == scored.choices[0].text
    assert chunks[-1].choices[0].finish_reason == scored.choices[0].finish_reason


def test_fim_suffix_is_refused_clearly_for_a_model_without_fim_tokens(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=MODEL, prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))",
                                  max_tokens=4)
    assert raised.value.body["param"] == "suffix"
    assert "fill-in-the-middle" in raised.value.body["message"]


def test_cached_tokens_when_a_long_prompt_repeats(client: openai.OpenAI) -> None:
    rules = " ".join(f"Rule {i}: answer briefly and precisely." for i in range(30))
    system = "You are a meticulous assistant. " + rules
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Say hi."}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, temperature=0)
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, temperature=0)
    assert first.usage.prompt_tokens > 200
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 32


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model="gpt-nonexistent", messages=QUESTION, max_tokens=1)
    assert raised.value.body["code"] == "model_not_found"
