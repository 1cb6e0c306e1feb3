"""Sessions, canonicalization, prefix diagnostics, retention and constrained decoding through a
real `draftgate serve` (the embedded model), as agent frameworks use them."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator

import httpx
import jsonschema
import pytest

from engine.structured_output.grammars import close_objects
from tests.gateway.conftest import MODEL, Server, start_server, stop_server

RETENTION_TTL_SECONDS = 2.0
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
SEARCH = {"type": "object", "properties": {"query": {"type": "string", "maxLength": 40}}, "required": ["query"]}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    started = start_server("--session-retention-ttl", str(RETENTION_TTL_SECONDS))
    try:
        yield started
    finally:
        stop_server(started)


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def tools(rng: random.Random) -> list[dict]:
    """The two tools in a random order, with their schema keys shuffled (as frameworks send them)."""
    def shuffled(value: object) -> object:
        if isinstance(value, dict):
            items = list(value.items())
            rng.shuffle(items)
            return {key: shuffled(item) for key, item in items}
        return value

    result = [{"type": "function", "function": shuffled({"name": "get_weather", "description": "Weather in a city.",
                                                         "parameters": WEATHER})},
              {"type": "function", "function": shuffled({"name": "search_web", "description": "Search the web.",
                                                         "parameters": SEARCH})}]
    rng.shuffle(result)
    return result


def system_prompt(rng: random.Random) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(1_790_000_000 + rng.randrange(10**6))) + "Z"
    return (f"You are a careful assistant. The current time is {stamp}. request_id: req_{rng.getrandbits(48):012x}\n"
            + "Use the tools when they help. " * 20)


def agent_turns(http: httpx.Client, session_id: str, policy: str | None, num_turns: int) -> list[httpx.Response]:
    rng = random.Random(session_id)
    messages = [{"role": "system", "content": ""}, {"role": "user", "content": "What's the weather in Oslo?"}]
    headers = {"x-session-id": session_id}
    if policy is not None:
        headers["x-draftgate-canonicalization"] = policy
    responses = []
    for turn in range(num_turns):
        messages[0]["content"] = system_prompt(rng)
        response = http.post("/v1/chat/completions", headers=headers, json={
            "model": MODEL, "messages": messages, "tools": tools(rng), "tool_choice": "required",
            "max_tokens": 48, "temperature": 0})
        assert response.status_code == 200, response.text
        responses.append(response)
        message = response.json()["choices"][0]["message"]
        [call] = message["tool_calls"]
        messages.append({"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]})
        messages.append({"role": "tool", "tool_call_id": call["id"],
                         "content": json.dumps({"temperature": 3 + turn, "sky": "overcast"})})
    return responses


def test_safe_sessions_reuse_their_prefix_and_the_report_agrees_with_the_engine(http: httpx.Client) -> None:
    first, second, third = agent_turns(http, "session-safe", None, 3)
    for response in (first, second, third):
        body = response.json()
        report = body["draftgate"]
        assert response.headers["x-draftgate-session-id"] == report["session_id"] == "session-safe"
        assert report["session_source"] == "header"
        assert response.headers["x-draftgate-canonicalization"] == report["canonicalization"] == "safe"
        assert response.headers["x-draftgate-prefix-diverged"] == report["prefix"]["diverged_segment"]
        assert int(response.headers["x-draftgate-prefix-reusable-tokens"]) == report["prefix"]["reusable_tokens"]
        assert report["prefix"]["prompt_tokens"] == body["usage"]["prompt_tokens"]
    assert first.json()["draftgate"]["prefix"]["diverged_segment"] == "new-session"
    for earlier, later in ((first, second), (second, third)):
        report = later.json()["draftgate"]
        # Shuffled tools, shuffled keys and a new timestamp and id, yet the request extends the
        # previous one exactly: the previous note is pinned where it was, and the previous output
        # renders as it was generated.
        assert report["prefix"]["diverged_segment"] == "none"
        assert "volatile_spans" in report["rules_applied"]
        # One hash space: the gateway's prediction is what the engine served from its cache.
        cached = later.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert report["prefix"]["reusable_tokens"] == cached
        # The whole previous prompt (full blocks) and more: its note and output included.
        assert cached >= earlier.json()["usage"]["prompt_tokens"] // 16 * 16


def test_with_canonicalization_off_the_report_names_what_broke_the_prefix(http: httpx.Client) -> None:
    first, second = agent_turns(http, "session-off", "off", 2)
    report = second.json()["draftgate"]
    assert report["canonicalization"] == "off" and report["rules_applied"] == []
    assert report["prefix"]["diverged_segment"] in ("tools", "system")
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] < 0.2 * report["prefix"]["prompt_tokens"]


def test_a_bad_policy_header_is_a_400_naming_it(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", headers={"x-draftgate-canonicalization": "max"},
                         json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "x-draftgate-canonicalization"


def test_a_session_without_an_id_is_derived_from_its_prefix(http: httpx.Client) -> None:
    body = {"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "system", "content": "Derived-session test prompt."}, {"role": "user", "content": "Hello there"}]}
    first = http.post("/v1/chat/completions", json=body)
    body["messages"] += [{"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "How are you?"}]
    second = http.post("/v1/chat/completions", json=body)
    session_id = first.headers["x-draftgate-session-id"]
    assert session_id == second.headers["x-draftgate-session-id"] and session_id.startswith("prefix-")
    assert second.headers["x-draftgate-prefix-diverged"] == "output"  # "Hi!" is not what the model said
    # Plain chat in a derived session keeps OpenAI's exact body; a named session gets the extension.
    assert "draftgate" not in first.json() and "draftgate" not in second.json()
    body["user"] = "user-7"
    assert http.post("/v1/chat/completions", json=body).json()["draftgate"]["session_id"] == "user-7"


def test_a_tool_turn_is_retained_until_the_ttl(server: Server, http: httpx.Client) -> None:
    agent_turns(http, "session-retained", None, 1)
    stats = server.engine_stats()
    metrics = httpx.get(f"{server.base_url}/metrics", headers=server.headers).text
    retained = [line for line in metrics.splitlines() if line.startswith("draftgate:retained_sessions{")]
    assert retained and float(retained[0].rsplit(" ", 1)[1]) >= 1
    # Retained blocks are reclaimable, so they do not count as used.
    assert stats["vllm:kv_cache_usage_perc"] == 0
    time.sleep(RETENTION_TTL_SECONDS + 0.5)
    metrics = httpx.get(f"{server.base_url}/metrics", headers=server.headers).text
    retained = [line for line in metrics.splitlines() if line.startswith("draftgate:retained_sessions{")]
    assert float(retained[0].rsplit(" ", 1)[1]) == 0
    assert 'draftgate:prefix_divergence_total{model_name="SmolLM2-135M-Instruct",segment="none"}' in metrics


@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_required_returns_a_schema_valid_call(http: httpx.Client, stream: bool) -> None:
    rng = random.Random(5)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Search the web for llama facts."}],
            "tools": tools(rng), "tool_choice": "required", "max_tokens": 60, "temperature": 0.7, "seed": 11,
            "stream": stream}
    if not stream:
        [call] = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["tool_calls"]
        name, arguments = call["function"]["name"], call["function"]["arguments"]
    else:
        name, arguments = None, ""
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                for choice in json.loads(line[6:])["choices"]:
                    for delta in choice["delta"].get("tool_calls") or ():
                        name = delta["function"].get("name") or name
                        arguments += delta["function"].get("arguments") or ""
    schema = {"get_weather": WEATHER, "search_web": SEARCH}[name]
    jsonschema.validate(json.loads(arguments), close_objects(schema))


def test_json_schema_response_format(http: httpx.Client) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 40},
                                               "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
              "required": ["answer", "confidence"]}
    response = http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}},
        "max_tokens": 80, "temperature": 0})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), close_objects(schema))
    response = http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Reply with a JSON object with keys name and age "
                                                                "for Alice, 30."}],
        "response_format": {"type": "json_object"}, "max_tokens": 60, "temperature": 0})
    assert json.loads(response.json()["choices"][0]["message"]["content"]) == {"name": "Alice", "age": 30}


@pytest.mark.parametrize(("response_format", "param"), [
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "objectx"}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "yaml"}, "response_format.type"),
])
def test_a_response_format_that_cannot_be_enforced_is_a_400(http: httpx.Client, response_format: dict,
                                                            param: str) -> None:
    response = http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "response_format": response_format})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_anthropic_messages_carry_the_report_and_a_valid_tool_use(http: httpx.Client) -> None:
    body = {"model": MODEL, "max_tokens": 60, "temperature": 0, "metadata": {"user_id": "claude-session-1"},
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1.0.1; cch=abc12;"},
                       {"type": "text", "text": "You are a coding agent."}],
            "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": WEATHER}],
            "tool_choice": {"type": "any"},
            "messages": [{"role": "user", "content": "Weather in Rome?"}]}
    response = http.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    message = response.json()
    assert response.headers["x-draftgate-session-id"] == "claude-session-1"
    assert message["draftgate"]["session_source"] == "metadata"
    assert "volatile_spans" in message["draftgate"]["rules_applied"]
    [tool_use] = [block for block in message["content"] if block["type"] == "tool_use"]
    jsonschema.validate(tool_use["input"], close_objects(WEATHER))
    assert message["stop_reason"] == "tool_use"
