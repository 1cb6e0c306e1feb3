"""Bad input never gives a 5xx or a hang: a 4xx naming the parameter, and the server stays healthy."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.gateway.conftest import MODEL, Server

OK_MESSAGES = [{"role": "user", "content": "Hi"}]


def chat(**fields) -> bytes:
    return json.dumps({"messages": OK_MESSAGES, "max_tokens": 1, **fields}).encode()


def raw_chat(fragment: str) -> bytes:
    """A chat body with a raw JSON fragment spliced in (values json.dumps cannot produce)."""
    return b'{"messages": [{"role": "user", "content": "Hi"}], ' + fragment.encode() + b"}"


# (case id, path, body bytes, expected status, expected param or None)
CASES = [
    ("malformed-json", "/v1/chat/completions", b'{"messages": [', 400, None),
    ("empty-body", "/v1/chat/completions", b"", 400, None),
    ("not-an-object", "/v1/chat/completions", b"[1, 2]", 400, None),
    ("messages-missing", "/v1/chat/completions", b'{"max_tokens": 1}', 400, "messages"),
    ("messages-wrong-type", "/v1/chat/completions", b'{"messages": "hello"}', 400, "messages"),
    ("messages-empty", "/v1/chat/completions", json.dumps({"messages": []}).encode(), 400, "messages"),
    ("role-unknown", "/v1/chat/completions", json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(),
     400, "messages[0].role"),
    ("content-missing", "/v1/chat/completions", json.dumps({"messages": [{"role": "user"}]}).encode(), 400,
     "messages[0].content"),
    ("max-tokens-string", "/v1/chat/completions", chat(max_tokens="10"), 400, "max_tokens"),
    ("max-tokens-negative", "/v1/chat/completions", chat(max_tokens=-1), 400, "max_tokens"),
    ("max-tokens-zero", "/v1/chat/completions", chat(max_tokens=0), 400, "max_tokens"),
    ("max-tokens-huge", "/v1/chat/completions", chat(max_tokens=10**12), 400, "max_tokens"),
    ("max-tokens-beyond-int64", "/v1/chat/completions", chat(max_tokens=10**30), 400, "max_tokens"),
    ("max-tokens-beyond-context", "/v1/chat/completions", chat(max_tokens=5000), 400, "max_tokens"),
    ("max-completion-tokens-beyond-context", "/v1/chat/completions", chat(max_completion_tokens=5000), 400,
     "max_completion_tokens"),
    ("prompt-beyond-context", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": "word " * 3000}], "max_tokens": 1}).encode(), 400,
     "messages"),
    ("temperature-nan", "/v1/chat/completions", raw_chat('"temperature": NaN'), 400, None),
    ("temperature-infinite", "/v1/chat/completions", raw_chat('"temperature": 1e999'), 400, "temperature"),
    ("temperature-negative", "/v1/chat/completions", chat(temperature=-1), 400, "temperature"),
    ("temperature-string", "/v1/chat/completions", chat(temperature="hot"), 400, "temperature"),
    ("top-p-zero", "/v1/chat/completions", chat(top_p=0), 400, "top_p"),
    ("presence-penalty-large", "/v1/chat/completions", chat(presence_penalty=5), 400, "presence_penalty"),
    ("n-huge", "/v1/chat/completions", chat(n=100000), 400, "n"),
    ("n-zero", "/v1/chat/completions", chat(n=0), 400, "n"),
    ("n-float", "/v1/chat/completions", chat(n=1.5), 400, "n"),
    ("seed-huge", "/v1/chat/completions", chat(seed=2**70), 400, "seed"),
    ("stream-not-bool", "/v1/chat/completions", chat(stream="yes"), 400, "stream"),
    ("stop-empty-string", "/v1/chat/completions", chat(stop=[""]), 400, "stop"),
    ("logit-bias-bad-key", "/v1/chat/completions", chat(logit_bias={"abc": 1}), 400, "logit_bias"),
    ("logit-bias-out-of-vocab", "/v1/chat/completions", chat(logit_bias={"99999999": 1}), 400, "logit_bias"),
    ("logit-bias-too-large", "/v1/chat/completions", chat(logit_bias={"5": 1000}), 400, "logit_bias"),
    ("top-logprobs-without-logprobs", "/v1/chat/completions", chat(top_logprobs=2), 400, "top_logprobs"),
    ("top-logprobs-too-many", "/v1/chat/completions", chat(logprobs=True, top_logprobs=50), 400, "top_logprobs"),
    ("tool-choice-unknown-function", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f"}}],
          tool_choice={"type": "function", "function": {"name": "g"}}), 400, "tool_choice"),
    ("tool-choice-required-without-tools", "/v1/chat/completions", chat(tool_choice="required"), 400, "tool_choice"),
    ("image-content", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": [
         {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}).encode(), 422, "messages[0].content[0]"),
    ("content-part-unknown-type", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": [{"type": "video", "x": 1}]}]}).encode(), 400,
     "messages[0].content[0].type"),
    ("invalid-utf8", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None),
    ("lone-surrogate", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', 400,
     None),
    ("completions-prompt-empty-list", "/v1/completions", json.dumps({"prompt": []}).encode(), 400, "prompt"),
    ("completions-prompt-mixed", "/v1/completions", json.dumps({"prompt": [1, "a"]}).encode(), 400, "prompt"),
    ("completions-token-out-of-vocab", "/v1/completions", json.dumps({"prompt": [10**9]}).encode(), 400, "prompt"),
    ("completions-empty-string", "/v1/completions", json.dumps({"prompt": ""}).encode(), 400, "prompt"),
    ("completions-logprobs-too-many", "/v1/completions", json.dumps({"prompt": "a", "logprobs": 10}).encode(), 400,
     "logprobs"),
    ("completions-echo-with-logprobs", "/v1/completions",
     json.dumps({"prompt": "a", "echo": True, "logprobs": 1}).encode(), 400, "echo"),
    ("completions-best-of", "/v1/completions", json.dumps({"prompt": "a", "best_of": 3}).encode(), 400, "best_of"),
    ("messages-max-tokens-missing", "/v1/messages", json.dumps({"model": MODEL, "messages": OK_MESSAGES}).encode(),
     400, None),
    ("messages-max-tokens-negative", "/v1/messages",
     json.dumps({"model": MODEL, "max_tokens": -5, "messages": OK_MESSAGES}).encode(), 400, None),
    ("messages-bad-block", "/v1/messages",
     json.dumps({"model": MODEL, "max_tokens": 1,
                 "messages": [{"role": "user", "content": [{"type": "nope"}]}]}).encode(), 400, None),
]


@pytest.fixture(scope="module")
def http(server: Server) -> httpx.Client:
    with server.client() as client:
        yield client


@pytest.mark.parametrize(("path", "body", "status", "param"), [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_a_4xx_naming_the_parameter(http: httpx.Client, path: str, body: bytes, status: int,
                                                  param: str | None) -> None:
    response = http.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()
    if path == "/v1/messages":
        assert error["type"] == "error" and error["error"]["message"]
        return
    assert error["error"]["message"]
    if param is not None:
        assert error["error"]["param"] == param, error


def test_oversized_body_is_413(http: httpx.Client) -> None:
    body = chat(messages=[{"role": "user", "content": "x" * (2 << 20)}])
    response = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_unknown_fields_are_ignored(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", content=chat(temperature=0, some_vendor_field={"a": [1, 2]},
                                                              metadata={"trace": "x"}))
    assert response.status_code == 200, response.text


def test_server_stays_healthy_after_bad_input(server: Server, http: httpx.Client) -> None:
    for _, path, body, _, _ in CASES:
        assert http.post(path, content=body).status_code < 500
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert http.get("/ready").status_code == 200
    response = http.post("/v1/chat/completions", content=chat(temperature=0, max_tokens=2))
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"]
    server.wait_idle()
