"""API keys: Bearer and x-api-key accepted, everything but /health refused without a valid key."""

from __future__ import annotations

import httpx
import pytest

from gateway.auth import KeyChecker, presented_key
from tests.gateway.conftest import API_KEY, Server


def test_key_checker_matches_only_configured_keys() -> None:
    checker = KeyChecker(["alpha", "beta-longer-key"])
    assert checker.enabled
    assert checker.check(b"alpha") and checker.check(b"beta-longer-key")
    assert not checker.check(b"alph") and not checker.check(b"alphaa") and not checker.check(b"")
    assert not checker.check(None)
    assert not KeyChecker([]).enabled and not KeyChecker([]).check(b"alpha")


def test_presented_key_prefers_bearer_then_x_api_key() -> None:
    assert presented_key([(b"authorization", b"Bearer abc")]) == b"abc"
    assert presented_key([(b"authorization", b"bearer  abc ")]) == b"abc"
    assert presented_key([(b"x-api-key", b"xyz")]) == b"xyz"
    assert presented_key([(b"x-api-key", b"xyz"), (b"authorization", b"Bearer abc")]) == b"abc"
    assert presented_key([(b"authorization", b"Basic abc")]) is None
    assert presented_key([]) is None


@pytest.mark.parametrize("path", ["/ready", "/metrics", "/v1/models"])
def test_routes_refuse_missing_or_wrong_keys(server: Server, path: str) -> None:
    assert httpx.get(server.base_url + path).status_code == 401
    wrong = httpx.get(server.base_url + path, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.base_url + path, headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
    assert httpx.get(server.base_url + path, headers={"x-api-key": API_KEY}).status_code == 200


def test_health_needs_no_key(server: Server) -> None:
    assert httpx.get(server.base_url + "/health").status_code == 200


def test_generation_routes_refuse_without_key(server: Server) -> None:
    chat = httpx.post(server.base_url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert chat.status_code == 401 and chat.json()["error"]["type"] == "authentication_error"
    anthropic = httpx.post(server.base_url + "/v1/messages", headers={"x-api-key": "wrong"},
                           json={"model": "m", "max_tokens": 1, "messages": []})
    assert anthropic.status_code == 401
    body = anthropic.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error" and body["error"]["message"]
