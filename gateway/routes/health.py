"""Operations endpoints: GET /health (liveness), GET /ready (readiness), GET /metrics."""

from __future__ import annotations

import contextlib

import anyio
from litestar import Controller, Request, Response, get

from gateway.metrics import CONTENT_TYPE
from gateway.routes.common import gateway_state

_STATS_TIMEOUT_SECONDS = 2.0


class HealthController(Controller):
    path = "/"

    @get("/health")
    async def health(self, request: Request) -> Response:
        """200 while the process can serve (also while the model loads); 503 once the engine died."""
        state = gateway_state(request)
        if state.engine_died():
            return _status(503, "engine_dead", state.failure)
        return _status(200, "ok")

    @get("/ready")
    async def ready(self, request: Request) -> Response:
        """200 only after a real generation succeeded and while not draining."""
        state = gateway_state(request)
        if state.draining:
            return _status(503, "draining")
        if state.failure is not None:
            return _status(503, "failed", state.failure)
        if not state.ready or state.engine is None or not state.engine.is_alive:
            return _status(503, "starting")
        return _status(200, "ready")

    @get("/metrics")
    async def metrics(self, request: Request) -> Response:
        state = gateway_state(request)
        stats = None
        engine = state.engine
        if engine is not None and state.ready and engine.is_alive:
            # A dying engine must not turn a scrape into a 500: its figures are just left out.
            with anyio.move_on_after(_STATS_TIMEOUT_SECONDS), contextlib.suppress(Exception):
                stats = await engine.get_stats()
        body = state.metrics.render(stats, state.admission.num_waiting_requests)
        return Response(body, media_type=CONTENT_TYPE)


def _status(status_code: int, status: str, detail: str | None = None) -> Response:
    content: dict[str, str] = {"status": status}
    if detail:
        content["detail"] = detail
    return Response(content, status_code=status_code)
