"""The gateway's runtime state: the engine's lifecycle, readiness, and the drain on shutdown.

The engine starts in the background of the app's lifespan so that /health answers while the
model loads. Readiness needs more than a started engine: a real one-token generation has to
succeed first (it proves the model, the socket and the sampler work end to end). While the
engine is not ready, and from the moment a drain begins, API routes answer 503.

Shutdown (`drain`): /ready turns 503 and new requests get 503 at once; admitted requests get up
to the shutdown timeout to finish; the rest are aborted in the engine, which ends their streams;
then the lifespan exits and stops the engine process.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import anyio

from engine.sampling_params import SamplingParams
from gateway.admission import AdmissionController
from gateway.config import GatewayConfig
from gateway.engine_client import AsyncEngineClient, EngineClient
from gateway.errors import APIError, service_unavailable
from gateway.metrics import GatewayMetrics

logger = logging.getLogger("draftgate.gateway")

# How often a serving gateway checks that its engine is still there (a dead engine stops the server).
_LIVENESS_POLL_SECONDS = 1.0

EngineFactory = Callable[[GatewayConfig], AbstractAsyncContextManager[EngineClient]]


def default_engine_factory(config: GatewayConfig) -> AbstractAsyncContextManager[EngineClient]:
    return AsyncEngineClient.start(config.engine, in_process=config.engine_in_process,
                                   startup_timeout=config.engine_startup_timeout)


class GatewayState:
    def __init__(self, config: GatewayConfig, engine_factory: EngineFactory | None = None) -> None:
        self.config = config
        self._engine_factory = engine_factory or default_engine_factory
        self.engine: EngineClient | None = None
        self.ready = False
        self.draining = False
        self.failure: str | None = None  # why the engine is gone (None while fine)
        self.admission = AdmissionController(config.max_waiting_requests, config.max_waiting_tokens)
        self.metrics = GatewayMetrics()
        self.served_model_names: tuple[str, ...] = config.served_model_names
        self.on_fatal: Callable[[str], None] | None = None  # set by the CLI: stop the server
        self._stop = anyio.Event()

    # ---- what routes call --------------------------------------------------------------------
    def serving_engine(self) -> EngineClient:
        """The engine, or 503 while starting, draining or after an engine failure."""
        engine = self.engine
        if self.draining:
            raise service_unavailable("The server is shutting down; retry on another replica")
        if engine is None or not self.ready:
            raise service_unavailable(self.failure or "The model is still loading; retry shortly")
        if not engine.is_alive:
            raise service_unavailable("The engine has stopped")
        return engine

    def check_model(self, model: str | None, param: str = "model") -> str:
        """The name to answer with; 404 for a model this server does not serve."""
        names = self.served_model_names
        if model is None or self.config.accept_any_model or model in names:
            return model or names[0]
        raise APIError(404, f"The model {model!r} does not exist; this server serves {', '.join(names)}",
                       param=param, code="model_not_found")

    @property
    def model_name(self) -> str:
        return self.served_model_names[0] if self.served_model_names else ""

    # ---- lifecycle ---------------------------------------------------------------------------
    async def run_engine(self) -> None:
        """Starts the engine, warms it up, and holds it until `stop()`; the lifespan runs this."""
        try:
            async with self._engine_factory(self.config) as engine:
                self.engine = engine
                if not self.served_model_names:
                    self.served_model_names = (engine.model_name,)
                self.metrics.set_model_name(self.model_name)
                await self._warm_up(engine)
                self.ready = True
                logger.info("ready: serving %s (context %d tokens)", self.model_name, engine.max_model_len)
                while not self._stop.is_set():
                    with anyio.move_on_after(_LIVENESS_POLL_SECONDS):
                        await self._stop.wait()
                    if not engine.is_alive:
                        raise RuntimeError("the engine process stopped unexpectedly")
                self.ready = False
        except Exception as error:  # noqa: BLE001 - reported through /health and on_fatal
            self._fail(f"the engine failed: {type(error).__name__}: {error}")
        finally:
            self.ready = False
            self.engine = None

    async def _warm_up(self, engine: EngineClient) -> None:
        prompt = engine.tokenizer.encode("Hello", add_special_tokens=True) or [0]
        stream = engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0.0),
                                 request_id=f"warmup-{uuid.uuid4().hex}")
        async with contextlib.aclosing(stream):
            async for delta in stream:
                if delta.finish_reason is not None and delta.error is not None:
                    raise RuntimeError(f"warm-up generation failed: {delta.error}")

    def _fail(self, message: str) -> None:
        logger.error(message)
        self.failure = message
        self.ready = False
        if self.on_fatal is not None:
            self.on_fatal(message)

    def engine_died(self) -> bool:
        """True when the engine ran and is gone (liveness fails)."""
        if self.failure is not None:
            return True
        return self.engine is not None and self.ready and not self.engine.is_alive

    async def stop(self) -> None:
        """Ends `run_engine` (lifespan shutdown); in-flight requests are aborted first."""
        await self._abort_admitted()
        self._stop.set()

    async def drain(self, timeout: float) -> None:
        """Graceful shutdown: refuse new work, let admitted requests finish, abort the rest."""
        if self.draining:
            return
        self.draining = True
        self.admission.close("The server is shutting down; retry on another replica")
        count = self.admission.num_admitted
        logger.info("draining: %d requests in flight, up to %.1f s", count, timeout)
        if not await self.admission.wait_idle(timeout):
            logger.warning("drain timeout: aborting %d requests", self.admission.num_admitted)
            await self._abort_admitted()
            await self.admission.wait_idle(5.0)

    async def _abort_admitted(self) -> None:
        engine = self.engine
        request_ids = [rid for ticket in self.admission.tickets for rid in ticket.engine_request_ids]
        if engine is not None and request_ids and engine.is_alive:
            with contextlib.suppress(Exception):
                await engine.abort(request_ids)

