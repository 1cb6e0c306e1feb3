"""Golden wire-format tests over raw HTTP: exact keys, chunk sequences, event order, error bodies."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.gateway.conftest import MODEL, Server
from tests.gateway.sse import parse_sse

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

CHUNK_KEYS = {"id", "object", "created", "model", "choices", "system_fingerprint"}
CHUNK_CHOICE_KEYS = {"index", "delta", "finish_reason", "logprobs"}


@pytest.fixture(scope="module")
def http(server: Server) -> httpx.Client:
    with server.client() as client:
        yield client


def _stream(http: httpx.Client, path: str, payload: dict) -> list:
    response = http.post(path, json=payload)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return parse_sse(response.content)


def test_chat_completion_body_keys(http: httpx.Client) -> None:
    body = http.post("/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 2, "temperature": 0}).json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage", "system_fingerprint"}
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    [choice] = body["choices"]
    assert set(choice) == {"index", "message", "finish_reason", "logprobs"}
    assert set(choice["message"]) == {"role", "content", "refusal", "tool_calls"}
    assert set(body["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}
    assert set(body["usage"]["prompt_tokens_details"]) == {"cached_tokens"}


def test_chat_chunk_shapes_without_usage(http: httpx.Client) -> None:
    events = _stream(http, "/v1/chat/completions",
                     {"messages": QUESTION, "max_tokens": 3, "temperature": 0, "stream": True})
    assert events[-1].data == "[DONE]" and all(e.event is None for e in events)
    chunks = [e.json() for e in events[:-1]]
    assert {c["id"] for c in chunks} == {chunks[0]["id"]} and {c["created"] for c in chunks} == {chunks[0]["created"]}
    for chunk in chunks:
        assert set(chunk) == CHUNK_KEYS and chunk["object"] == "chat.completion.chunk"
        [choice] = chunk["choices"]
        assert set(choice) == CHUNK_CHOICE_KEYS
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    middle = [c["choices"][0] for c in chunks[1:-1]]
    assert middle and all(set(c["delta"]) == {"content"} and c["finish_reason"] is None for c in middle)
    last = chunks[-1]["choices"][0]
    assert last["delta"] == {} and last["finish_reason"] in ("stop", "length")


def test_include_usage_chunk(http: httpx.Client) -> None:
    events = _stream(http, "/v1/chat/completions", {
        "messages": QUESTION, "max_tokens": 3, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}})
    chunks = [e.json() for e in events[:-1]]
    assert events[-1].data == "[DONE]"
    for chunk in chunks[:-1]:
        assert set(chunk) == CHUNK_KEYS | {"usage"} and chunk["usage"] is None and len(chunk["choices"]) == 1
    final = chunks[-1]
    assert final["choices"] == []
    usage = final["usage"]
    # The same greedy request unstreamed counts the same tokens. Chunks are one per engine step
    # (role chunk, content chunks, finish chunk), and a step emits one token or, when a draft is
    # accepted, several: so at least one content chunk and at most one per token.
    plain = http.post("/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 3, "temperature": 0})
    assert usage["completion_tokens"] == plain.json()["usage"]["completion_tokens"]
    assert 1 <= len(chunks) - 3 <= usage["completion_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert "cached_tokens" in usage["prompt_tokens_details"]


def test_n_streams_are_keyed_by_index(http: httpx.Client) -> None:
    events = _stream(http, "/v1/chat/completions", {
        "messages": QUESTION, "max_tokens": 3, "temperature": 1.0, "seed": 3, "n": 2, "stream": True})
    chunks = [e.json() for e in events[:-1]]
    finishes = sorted(c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"])
    assert finishes == [0, 1]
    roles = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["delta"].get("role")]
    assert roles == [0, 1]
    # Admission accounting: both choices started and the request released, nothing left waiting.
    metrics = http.get("/metrics").text
    assert re.search(r'^draftgate:gateway_waiting_requests\{model_name="[^"]+"\} 0\.0$', metrics, re.M), metrics


def test_tool_call_delta_sequence(http: httpx.Client) -> None:
    events = _stream(http, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 40,
        "temperature": 0, "stream": True})
    chunks = [e.json() for e in events[:-1]]
    tool_deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", [])]
    first, *rest = tool_deltas
    assert set(first) == {"index", "id", "type", "function"} and first["type"] == "function"
    assert first["index"] == 0 and first["function"]["name"] == "get_weather"
    assert re.fullmatch(r"call_[0-9a-f]{24}", first["id"])
    for delta in rest:
        assert set(delta) == {"index", "function"} and set(delta["function"]) == {"arguments"}
    arguments = first["function"].get("arguments", "") + "".join(d["function"]["arguments"] for d in rest)
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] in ("tool_calls", "length")
    if last["finish_reason"] == "tool_calls":
        assert isinstance(json.loads(arguments), dict)
    assert all(c["choices"][0]["delta"].get("content") in (None, "") for c in chunks)


def test_completion_chunks(http: httpx.Client) -> None:
    events = _stream(http, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 2,
                                                "temperature": 0, "stream": True})
    chunks = [e.json() for e in events[:-1]]
    assert events[-1].data == "[DONE]"
    for chunk in chunks:
        assert set(chunk) == {"id", "object", "created", "model", "choices", "system_fingerprint"}
        assert chunk["object"] == "text_completion"
        assert set(chunk["choices"][0]) == {"index", "text", "finish_reason", "logprobs"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_anthropic_event_order(http: httpx.Client) -> None:
    events = _stream(http, "/v1/messages", {"model": MODEL, "max_tokens": 3, "messages": QUESTION,
                                             "temperature": 0, "stream": True})
    names = [e.event for e in events]
    assert all(e.json()["type"] == e.event for e in events)
    assert re.fullmatch(r"message_start ping (content_block_start (content_block_delta )+content_block_stop )+"
                        r"message_delta message_stop ", "".join(f"{n} " for n in names)), names
    start = events[0].json()["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["role"] == "assistant"
    assert set(start["usage"]) >= {"input_tokens", "output_tokens"}
    delta = events[-2].json()
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 3
    blocks = [e.json() for e in events if e.event == "content_block_start"]
    assert blocks[0] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}


def test_anthropic_tool_use_events(http: httpx.Client) -> None:
    events = _stream(http, "/v1/messages", {
        "model": MODEL, "max_tokens": 40, "temperature": 0, "stream": True,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [{"name": "get_weather", "description": "weather",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "tool", "name": "get_weather"}})
    starts = [e.json() for e in events if e.event == "content_block_start"]
    tool_start = [s for s in starts if s["content_block"]["type"] == "tool_use"][0]
    assert tool_start["content_block"]["name"] == "get_weather" and tool_start["content_block"]["input"] == {}
    assert tool_start["content_block"]["id"].startswith("toolu_")
    deltas = [e.json()["delta"] for e in events if e.event == "content_block_delta"
              and e.json()["index"] == tool_start["index"]]
    assert all(d["type"] == "input_json_delta" for d in deltas)
    stop_reason = events[-2].json()["delta"]["stop_reason"]
    assert stop_reason in ("tool_use", "max_tokens")
    if stop_reason == "tool_use":
        assert isinstance(json.loads("".join(d["partial_json"] for d in deltas)), dict)


def test_openai_error_body(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json={"messages": QUESTION, "max_tokens": -1})
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == "max_tokens"


def test_anthropic_error_body(http: httpx.Client) -> None:
    response = http.post("/v1/messages", json={"model": MODEL, "messages": QUESTION})
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == "invalid_request_error" and "max_tokens" in body["error"]["message"]


def test_not_found_and_method_not_allowed_use_the_error_format(http: httpx.Client) -> None:
    missing = http.get("/v1/nothing-here")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    wrong_method = http.get("/v1/chat/completions")
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
