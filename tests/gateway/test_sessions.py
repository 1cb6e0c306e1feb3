"""Session identity and the registry of previous turns (no server needed)."""

from __future__ import annotations

import json
import time

import pytest

from gateway.sessions import SessionRegistry, _Turn, explicit_session


def body(**fields: object) -> bytes:
    return json.dumps({"messages": [], **fields}).encode()


@pytest.mark.parametrize(("headers", "fields", "expected"), [
    ({"x-session-id": " abc "}, {"user": "u1", "metadata": {"session_id": "m1"}}, ("abc", "header")),
    ({}, {"user": "u1", "metadata": {"session_id": "m1"}}, ("m1", "metadata")),
    ({}, {"metadata": {"user_id": "user_x_account_y_session_z"}}, ("user_x_account_y_session_z", "metadata")),
    ({}, {"metadata": {"trace": 3, "conversation_id": "c7"}}, ("c7", "metadata")),
    ({}, {"user": "u1", "metadata": {"trace": "x"}}, ("u1", "user")),
    ({"x-session-id": "  "}, {}, None),
    ({}, {"user": 42}, None),  # not a string: ignored here (the route's schema decides its fate)
    ({}, {}, None),
])
def test_a_session_is_named_by_header_then_metadata_then_user(headers: dict, fields: dict,
                                                              expected: tuple[str, str] | None) -> None:
    assert explicit_session(headers, body(**fields)) == expected


def test_long_session_ids_are_cut() -> None:
    session_id, _ = explicit_session({"x-session-id": "x" * 1000}, b"{}")
    assert len(session_id) == 256


def test_the_registry_keeps_the_latest_turns_of_the_most_recent_sessions() -> None:
    registry = SessionRegistry(max_sessions=2, idle_seconds=3600)
    for name in ("a", "b", "c"):
        registry.record(name, _Turn([], [], time.monotonic()))
    assert registry.previous("a") is None and registry.previous("b") is not None and len(registry) == 2
    registry.record("b", _Turn([("tools", b"x")], [], time.monotonic()))
    assert registry.previous("b").segments == [("tools", b"x")]


def test_idle_sessions_are_forgotten() -> None:
    registry = SessionRegistry(max_sessions=8, idle_seconds=10)
    registry.record("old", _Turn([], [], time.monotonic() - 11))
    assert registry.previous("old") is None and len(registry) == 0


def test_the_serve_flags_reach_the_config_and_bad_values_name_the_field() -> None:
    from gateway.cli import build_parser, config_from_args
    from gateway.config import GatewayConfig

    args = build_parser().parse_args(["serve", "--canonicalization", "aggressive", "--session-retention-ttl", "5",
                                      "--session-retention-cap", "0.5"])
    config = config_from_args(args, environ={})
    assert (config.canonicalization, config.session_retention_seconds, config.session_retention_max_fraction) == (
        "aggressive", 5.0, 0.5)
    assert build_parser().parse_args(["serve"]).canonicalization == "safe"
    for field, value in (("canonicalization", "strict"), ("session_retention_seconds", -1.0),
                         ("session_retention_max_fraction", 1.5), ("max_sessions", 0)):
        with pytest.raises(ValueError, match=field):
            GatewayConfig(**{field: value})
