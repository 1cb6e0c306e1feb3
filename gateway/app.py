"""The Litestar application: `create_app(config)`.

The lifespan starts the engine in the background (its own process, unless the config asks for
in-process mode) and stops it when the server shuts down; routes reach it through the
GatewayState in `app.state.gateway`. Every error leaves as an OpenAI error body, or as an
Anthropic one under /v1/messages, with the status the exception carries; anything unexpected is
logged and becomes a 500 in the same format, never a bare traceback.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from litestar import Litestar, Request, Response
from litestar.datastructures import State
from litestar.exceptions import HTTPException

from gateway.auth import KeyChecker, auth_middleware
from gateway.config import GatewayConfig
from gateway.errors import APIError
from gateway.routes import CONTROLLERS
from gateway.schemas.errors import error_body
from gateway.state import EngineFactory, GatewayState

logger = logging.getLogger("draftgate.gateway")

_HTTP_MESSAGES = {
    404: "Not found: {method} {path} is not an endpoint of this server",
    405: "Method {method} is not allowed on {path}",
    413: "The request body is larger than the server accepts ({limit} bytes)",
}


def create_app(config: GatewayConfig, *, engine_factory: EngineFactory | None = None) -> Litestar:
    """The HTTP app; engine_factory replaces the real engine (the gateway benchmark's stand-in)."""
    state = GatewayState(config, engine_factory)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(state.run_engine)
            try:
                yield
            finally:
                await state.stop()

    def api_error_handler(request: Request, error: APIError) -> Response:
        return _error_response(request, error)

    def http_error_handler(request: Request, error: HTTPException) -> Response:
        template = _HTTP_MESSAGES.get(error.status_code)
        message = (template.format(method=request.method, path=request.url.path, limit=config.max_body_bytes)
                   if template else str(error.detail))
        code = "request_too_large" if error.status_code == 413 else None
        headers = dict(error.headers or {})
        return _error_response(request, APIError(error.status_code, message, code=code, headers=headers))

    def unexpected_error_handler(request: Request, error: Exception) -> Response:
        logger.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=error)
        return _error_response(request, APIError(500, f"Internal server error: {type(error).__name__}"))

    middleware = []
    if config.api_keys:
        middleware.append(auth_middleware(KeyChecker(config.api_keys)))
    return Litestar(
        route_handlers=CONTROLLERS,
        lifespan=[lifespan],
        middleware=middleware,
        exception_handlers={
            APIError: api_error_handler,
            HTTPException: http_error_handler,
            Exception: unexpected_error_handler,
        },
        request_max_body_size=config.max_body_bytes,
        state=State({"gateway": state}),
        openapi_config=None,
        logging_config=None,
    )


def _error_response(request: Request, error: APIError) -> Response:
    anthropic = request.url.path.startswith("/v1/messages")
    return Response(error_body(error, anthropic), status_code=error.status, media_type="application/json",
                    headers=error.headers or None)
