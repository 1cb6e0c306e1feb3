"""msgspec failures and ValueErrors become 400s naming the parameter."""

from __future__ import annotations

import msgspec
import pytest

from gateway.errors import decode_failure, value_error
from gateway.schemas import anthropic as an
from gateway.schemas import openai_chat as oc
from gateway.schemas.errors import anthropic_error_body, openai_error_body


def failure(body: bytes, decoder=oc.request_decoder):
    with pytest.raises(msgspec.DecodeError) as raised:
        decoder.decode(body)
    return decode_failure(raised.value, body)


def test_validation_errors_name_the_path() -> None:
    assert failure(b'{"messages": [{"role": "user", "content": 5}]}').param == "messages[0].content"
    assert failure(b'{"messages": [{"content": "x"}]}').param == "messages[0].role"
    assert failure(b'{"max_tokens": 1}').param == "messages"
    assert failure(b'{"model": "m", "messages": []}', an.request_decoder).param == "max_tokens"


def test_decode_errors() -> None:
    assert failure(b"").code == "invalid_json" and "empty" in failure(b"").message
    assert "not valid JSON" in failure(b"{").message
    assert "surrogate" in failure(b'{"messages": "\\udc00"}').message
    assert "surrogate" in failure(b'{"messages": "\\ud83d x"}').message
    # A proper pair is an emoji, not a decode failure.
    request = oc.request_decoder.decode(b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}')
    assert request.messages[0].content == "\U0001f600"


def test_unknown_fields_and_tool_choice_forms_decode() -> None:
    request = oc.request_decoder.decode(
        b'{"messages": [], "vendor_extra": {"a": 1}, "tool_choice": {"type": "function", "function": {"name": "f"}}}')
    assert request.tool_choice == oc.NamedToolChoice(oc.NamedFunction("f"))
    assert oc.request_decoder.decode(b'{"messages": [], "tool_choice": "required"}').tool_choice == "required"


def test_value_error_renames_the_parameter() -> None:
    fields = ("logprobs", "seed")
    error = value_error(ValueError("logprobs must be an integer in [0, 20], got 30"), fields,
                        {"logprobs": "top_logprobs"})
    assert error.param == "top_logprobs" and error.message.startswith("top_logprobs must")
    assert value_error(ValueError("seed must be an integer"), fields).param == "seed"
    assert value_error(ValueError("something odd happened"), fields).param is None


def test_error_bodies() -> None:
    error = failure(b'{"max_tokens": 1}')
    assert msgspec.json.decode(openai_error_body(error)) == {"error": {
        "message": error.message, "type": "invalid_request_error", "param": "messages", "code": "invalid_type"}}
    body = msgspec.json.decode(anthropic_error_body(error))
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
