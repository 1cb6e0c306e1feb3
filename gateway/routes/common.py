"""Helpers every controller uses: the gateway state, body decoding, JSON responses, ids."""

from __future__ import annotations

import secrets
import time
from typing import TypeVar

import msgspec
from litestar import Request, Response

from gateway.errors import decode_failure
from gateway.state import GatewayState

T = TypeVar("T")

_encoder = msgspec.json.Encoder()
JSON = "application/json"


def gateway_state(request: Request) -> GatewayState:
    return request.app.state.gateway


async def decode_body(request: Request, decoder: msgspec.json.Decoder[T]) -> T:
    """The request body decoded into its Struct; 400 naming the parameter when it cannot be.

    Litestar enforces the body size limit while reading (413 beyond it).
    """
    body = await request.body()
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as error:
        raise decode_failure(error, body) from None


def json_response(payload: msgspec.Struct, status_code: int = 200) -> Response:
    return Response(_encoder.encode(payload), status_code=status_code, media_type=JSON)


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def unix_time() -> int:
    return int(time.time())
