"""Optional API keys, checked by an ASGI middleware before any route runs.

When at least one key is configured, every route except /health needs one, given either as
`Authorization: Bearer <key>` (OpenAI clients) or as `x-api-key: <key>` (Anthropic clients).
Keys are compared as SHA-256 digests with `hmac.compare_digest`, against every configured key
without stopping at a match, so the time taken tells nothing about any key or its length.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from litestar.types import ASGIApp, Receive, Scope, Send

from gateway.errors import APIError
from gateway.schemas.errors import error_body

UNAUTHENTICATED_PATHS = frozenset({"/health"})


class KeyChecker:
    def __init__(self, keys: Sequence[str]) -> None:
        self._digests = [hashlib.sha256(key.encode()).digest() for key in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def check(self, candidate: bytes | None) -> bool:
        if candidate is None:
            return False
        digest = hashlib.sha256(candidate).digest()
        matched = False
        for known in self._digests:
            matched |= hmac.compare_digest(digest, known)
        return matched


def presented_key(headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
    """The key a request presents: a Bearer token, else an x-api-key header."""
    api_key = None
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
        elif name == b"x-api-key":
            api_key = value.strip()
    return api_key


def auth_middleware(checker: KeyChecker):
    """An ASGI middleware factory (Litestar calls it with the app it wraps)."""

    def wrap(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http" or scope["path"] in UNAUTHENTICATED_PATHS or checker.check(
                presented_key(scope["headers"])
            ):
                await app(scope, receive, send)
                return
            error = APIError(401, "Invalid or missing API key: send 'Authorization: Bearer <key>' or "
                             "'x-api-key: <key>'", code="invalid_api_key")
            body = error_body(error, anthropic=scope["path"].startswith("/v1/messages"))
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b"Bearer"),
            ]})
            await send({"type": "http.response.body", "body": body})

        return middleware

    return wrap
