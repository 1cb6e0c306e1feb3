"""Error bodies in the OpenAI and the Anthropic formats."""

from __future__ import annotations

import msgspec

from gateway.errors import APIError


class OpenAIErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(msgspec.Struct):
    error: OpenAIErrorDetail


class AnthropicErrorDetail(msgspec.Struct):
    type: str
    message: str


class AnthropicErrorBody(msgspec.Struct):
    error: AnthropicErrorDetail
    type: str = "error"


# https://docs.anthropic.com/en/api/errors
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}

_encoder = msgspec.json.Encoder()


def openai_error_body(error: APIError) -> bytes:
    detail = OpenAIErrorDetail(error.message, error.openai_type, error.param, error.code)
    return _encoder.encode(OpenAIErrorBody(detail))


def anthropic_error_body(error: APIError) -> bytes:
    kind = _ANTHROPIC_TYPES.get(error.status, "invalid_request_error" if error.status < 500 else "api_error")
    # Anthropic bodies have no "param": name it in the message when the message does not.
    message = error.message
    if error.param is not None and error.param not in message:
        message = f"{error.param}: {message}"
    return _encoder.encode(AnthropicErrorBody(AnthropicErrorDetail(kind, message)))


def error_body(error: APIError, anthropic: bool) -> bytes:
    return anthropic_error_body(error) if anthropic else openai_error_body(error)
