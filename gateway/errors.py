"""Errors a client can read: one exception type, raised anywhere in the gateway.

`APIError` carries what both wire formats need (status, message, the offending parameter, a
code); gateway/schemas/errors.py turns it into an OpenAI or an Anthropic error body. Helpers here
translate msgspec decode failures and SamplingParams' ValueErrors into errors that name the
request's parameter, so bad input is always a 4xx the client can act on, never a 500.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

import msgspec

# OpenAI's error "type" per HTTP status; Anthropic's differ and live in schemas/errors.py.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """An error response: HTTP status, a message for humans, the parameter at fault, a code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    @property
    def openai_type(self) -> str:
        return _OPENAI_TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "internal_server_error")

    def __repr__(self) -> str:
        return f"APIError({self.status}, {self.message!r}, param={self.param!r})"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unprocessable(message: str, param: str | None = None) -> APIError:
    """422: the request is well-formed but this model cannot serve it (template refusal, images)."""
    return APIError(422, message, param=param, code="unprocessable_entity")


def service_unavailable(message: str) -> APIError:
    return APIError(503, message, code="service_unavailable")


# msgspec reports locations as "$.messages[0].content"; clients know "messages[0].content".
_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]*)`")
# A JSON \uD800-\uDFFF escape not part of a high+low pair: msgspec refuses it with a vague message.
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def decode_failure(error: msgspec.DecodeError, body: bytes) -> APIError:
    """A request body msgspec could not decode or validate -> 400 naming the parameter."""
    text = str(error)
    if isinstance(error, msgspec.ValidationError):
        param = None
        located = _PATH.search(text)
        if located:
            param = located.group(1) or None
            text = text[: located.start()]
        missing = _MISSING.match(text)
        if missing:
            param = f"{param}.{missing.group(1)}" if param else missing.group(1)
        where = f" at '{param}'" if param else ""
        return bad_request(f"Invalid request{where}: {text}", param=param, code="invalid_type")
    if not body.strip():
        return bad_request("The request body is empty; expected a JSON object", code="invalid_json")
    if _LONE_SURROGATE.search(body):
        return bad_request("The request body contains a lone UTF-16 surrogate escape (\\ud800-\\udfff); "
                           "strings must be valid Unicode", code="invalid_json")
    return bad_request(f"The request body is not valid JSON: {text}", code="invalid_json")


def value_error(error: ValueError, fields: Collection[str], renames: Mapping[str, str] | None = None) -> APIError:
    """A ValueError whose message starts with a field's name (SamplingParams' convention).

    The first word is the parameter only when it is one of `fields`; `renames` maps it to the name
    the client used (max_tokens -> max_completion_tokens).
    """
    message = str(error)
    name = message.split(" ", 1)[0]
    param = name if name in fields else None
    if param is not None and renames and param in renames:
        param = renames[param]
        message = param + message[len(name):]
    return bad_request(message, param=param)
