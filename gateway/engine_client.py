"""The engine as the routes see it: an `EngineClient`, and n-way fan-out of its streams.

`EngineClient` is the whole interface the gateway uses. `AsyncEngineClient` puts the real engine
behind it (engine/async_engine.py, the engine core in its own process, plus a tokenizer loaded in
this process for templates and token counting); the gateway benchmark puts an instant stand-in
behind the same interface to measure the gateway alone.

`stream_choices` runs the n engine requests of one HTTP request and merges their deltas, tagged
with the choice index. Leaving it early (client gone, handler cancelled, shutdown) aborts every
engine request still running: each stream is consumed inside `contextlib.aclosing`, so the abort
is sent at once rather than when a generator is garbage collected.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Protocol, runtime_checkable

import anyio

from engine.async_engine import AsyncEngine, EngineDeadError, RequestRejectedError
from engine.config import EngineConfig
from engine.model.resolve import resolve_model
from engine.model.tokenizer import Tokenizer, load_tokenizer
from engine.protocol import EngineStats, RequestDelta
from engine.sampling_params import SamplingParams
from gateway.admission import Ticket
from gateway.metrics import GatewayMetrics, RequestTimer

__all__ = [
    "AsyncEngineClient",
    "EngineClient",
    "EngineDeadError",
    "RequestRejectedError",
    "stream_choices",
]


@runtime_checkable
class EngineClient(Protocol):
    """What the gateway needs from an engine.

    `generate` streams one request's deltas (n must be 1); the last delta has finish_reason set.
    `extras` (session_id, retention, structured_output) are passed only when a request uses them,
    so an engine without agent sessions or grammars serves everything else. Engines may also
    expose `block_size` and `block_hash_seed` (their prefix-cache keys, for the gateway's
    session and prefix diagnostics).
    It raises RequestRejectedError when the engine refuses the request and EngineDeadError when
    the engine is gone. Closing the iterator early must abort the request.
    """

    model_name: str
    max_model_len: int
    vocab_size: int
    tokenizer: Tokenizer

    @property
    def is_alive(self) -> bool: ...

    def generate(self, prompt_token_ids: list[int], params: SamplingParams, *, request_id: str,
                 priority: int = 0, cache_salt: str | None = None, **extras: Any) -> AsyncIterator[RequestDelta]: ...

    async def abort(self, request_ids: list[str]) -> None: ...

    async def get_stats(self) -> EngineStats: ...


class AsyncEngineClient:
    """The real engine: AsyncEngine plus the model's tokenizer."""

    def __init__(self, engine: AsyncEngine, tokenizer: Tokenizer) -> None:
        self._engine = engine
        self.tokenizer = tokenizer
        self.model_name = engine.info.model_name
        self.max_model_len = engine.info.max_model_len
        self.vocab_size = engine.info.vocab_size
        self.block_size = engine.info.block_size
        self.block_hash_seed = engine.info.block_hash_seed

    @classmethod
    @asynccontextmanager
    async def start(cls, config: EngineConfig, *, in_process: bool = False,
                    startup_timeout: float = 600.0) -> AsyncIterator[AsyncEngineClient]:
        """Starts the engine (its own process unless in_process) and loads the tokenizer meanwhile."""
        resolved = resolve_model(config.model.model)
        # The tokenizer loads in a thread of this process while the engine process loads the model.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="draftgate-tokenizer") as pool:
            tokenizer_future = pool.submit(load_tokenizer, resolved)
            async with AsyncEngine.start(config, in_process=in_process, startup_timeout=startup_timeout) as engine:
                tokenizer = await anyio.to_thread.run_sync(tokenizer_future.result)
                yield cls(engine, tokenizer)

    @property
    def is_alive(self) -> bool:
        return self._engine.is_alive

    def generate(self, prompt_token_ids: list[int], params: SamplingParams, *, request_id: str,
                 priority: int = 0, cache_salt: str | None = None, **extras: Any) -> AsyncIterator[RequestDelta]:
        return self._engine.generate(prompt_token_ids, params, request_id=request_id, priority=priority,
                                     cache_salt=cache_salt, **extras)

    async def abort(self, request_ids: list[str]) -> None:
        await self._engine.abort(request_ids)

    async def get_stats(self) -> EngineStats:
        return await self._engine.get_stats()


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """The sampling parameters of the index-th of n completions (distinct seeds when seeded)."""
    if params.n == 1:
        return params
    seed = None if params.seed is None else params.seed + index
    return params.clone(n=1, seed=seed)


async def stream_choices(
    engine: EngineClient,
    prompts: list[list[int]],
    params: SamplingParams,
    *,
    request_id: str,
    ticket: Ticket,
    metrics: GatewayMetrics,
    arrival: float,
    priority: int = 0,
    cache_salt: str | None = None,
    extras: Mapping[str, Any] | None = None,
) -> AsyncIterator[tuple[int, RequestDelta]]:
    """Yields (choice index, delta) for params.n completions of each prompt, as they come.

    Choice `p * n + j` is the j-th completion of prompt p. Each choice's last delta has
    finish_reason set. Errors (RequestRejectedError, EngineDeadError) propagate after the other
    choices are aborted. extras: keyword arguments for every engine request (see EngineClient).
    """
    extras = dict(extras or {})
    num_per_prompt = params.n
    num_choices = len(prompts) * num_per_prompt
    metrics.prompt_tokens.inc(sum(len(prompt) for prompt in prompts) * num_per_prompt)
    if num_choices == 1:
        child_id = f"{request_id}-0"
        ticket.engine_request_ids.append(child_id)
        timer = RequestTimer(metrics, arrival)
        stream = engine.generate(prompts[0], params, request_id=child_id, priority=priority, cache_salt=cache_salt,
                                 **extras)
        started = False
        async with contextlib.aclosing(stream):
            async for delta in stream:
                timer.on_delta(delta)
                if not started:
                    started = True
                    ticket.started()
                yield 0, delta
        return

    # Several choices: one task each, feeding one channel. A task never raises (it forwards its
    # error as an item), so a failing choice cannot cancel the consumer at an arbitrary point.
    send, receive = anyio.create_memory_object_stream[tuple[int, RequestDelta | Exception]](math.inf)

    async def run_choice(choice: int) -> None:
        child_id = f"{request_id}-{choice}"
        ticket.engine_request_ids.append(child_id)
        timer = RequestTimer(metrics, arrival)
        try:
            stream = engine.generate(prompts[choice // num_per_prompt], child_params(params, choice % num_per_prompt),
                                     request_id=child_id, priority=priority, cache_salt=cache_salt, **extras)
            started = False
            async with contextlib.aclosing(stream):
                async for delta in stream:
                    timer.on_delta(delta)
                    if not started:  # the first output of this choice, whatever it is
                        started = True
                        ticket.started()
                    send.send_nowait((choice, delta))
        except Exception as error:  # noqa: BLE001 - forwarded to the consumer, which raises it
            send.send_nowait((choice, error))

    async with anyio.create_task_group() as tg, receive:
        for choice in range(num_choices):
            tg.start_soon(run_choice, choice)
        remaining = num_choices
        try:
            while remaining:
                choice, item = await receive.receive()
                if isinstance(item, Exception):
                    raise item
                if item.finish_reason is not None:
                    remaining -= 1
                yield choice, item
        finally:
            tg.cancel_scope.cancel()  # abort the choices still running
