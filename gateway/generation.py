"""One HTTP request's engine work: admission, the merged choice streams, and their results.

Routes build the prompt and the sampling parameters, then call `start_generation`, which admits
the request (429 when the waiting queue is full) and returns a `Generation`. A streamed response
iterates `generation.deltas()`; a non-streamed one awaits `generation.collect()`. Either way
`generation.close()` must run when the response is over: it releases the admission ticket and
records the end-to-end latency.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
from litestar import Request

from engine.protocol import RequestDelta, TokenLogprobs
from engine.sampling_params import SamplingParams
from gateway.admission import Ticket
from gateway.engine_client import EngineClient, EngineDeadError, RequestRejectedError, stream_choices
from gateway.errors import APIError, bad_request, service_unavailable
from gateway.state import GatewayState

T = TypeVar("T")


@dataclass
class ChoiceResult:
    """One completed choice of a non-streamed request."""

    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)


class Generation:
    def __init__(self, state: GatewayState, engine: EngineClient, prompts: list[list[int]], params: SamplingParams,
                 ticket: Ticket, *, request_id: str, arrival: float, priority: int, cache_salt: str | None,
                 extras: Mapping[str, Any] | None = None) -> None:
        self.state = state
        self.engine = engine
        self.prompts = prompts
        self.params = params
        self.ticket = ticket
        self.request_id = request_id
        self.arrival = arrival
        self.priority = priority
        self.cache_salt = cache_salt
        self.num_cached_tokens = 0
        self.num_generated_tokens = 0
        # Engine request options beyond the basics (session_id, retention, structured_output).
        self.extras = {key: value for key, value in (extras or {}).items() if value is not None}
        # The first choice's generated token ids (the session records them for its next turn).
        self.first_choice_token_ids: list[int] = []

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(prompt) for prompt in self.prompts)

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.params.n

    def deltas(self) -> AsyncIterator[tuple[int, RequestDelta]]:
        """(choice index, delta) as they come; raises APIError for engine refusals and failures."""
        return self._deltas()

    async def _deltas(self) -> AsyncIterator[tuple[int, RequestDelta]]:
        stream = stream_choices(
            self.engine, self.prompts, self.params, request_id=self.request_id, ticket=self.ticket,
            metrics=self.state.metrics, arrival=self.arrival, priority=self.priority, cache_salt=self.cache_salt,
            extras=self.extras,
        )
        try:
            async with contextlib.aclosing(stream):
                async for index, delta in stream:
                    if delta.num_cached_tokens > self.num_cached_tokens:
                        self.num_cached_tokens = delta.num_cached_tokens
                    self.num_generated_tokens += len(delta.new_token_ids)
                    if index == 0:
                        self.first_choice_token_ids.extend(delta.new_token_ids)
                    if delta.finish_reason == "abort":
                        raise service_unavailable("The request was aborted: the server is shutting down")
                    yield index, delta
        except RequestRejectedError as error:
            raise bad_request(str(error), param=_param_of(str(error))) from None
        except EngineDeadError as error:
            raise service_unavailable(f"The engine stopped: {error}") from None

    async def collect(self) -> list[ChoiceResult]:
        results = [ChoiceResult() for _ in range(self.num_choices)]
        async with contextlib.aclosing(self.deltas()) as stream:
            async for index, delta in stream:
                result = results[index]
                result.text += delta.text
                result.num_tokens += len(delta.new_token_ids)
                if delta.logprobs:
                    result.logprobs.extend(delta.logprobs)
                if delta.finish_reason is not None:
                    result.finish_reason = delta.finish_reason
                    result.stop_reason = delta.stop_reason
        return results

    def close(self) -> None:
        if not self.ticket.released:
            self.ticket.release()
            self.state.metrics.e2e.observe(time.monotonic() - self.arrival)


def start_generation(state: GatewayState, engine: EngineClient, prompts: list[list[int]], params: SamplingParams, *,
                     request_id: str, arrival: float, priority: int = 0, cache_salt: str | None = None,
                     extras: Mapping[str, Any] | None = None) -> Generation:
    """Admits the request (429 / 503 when it cannot be) and prepares its engine requests.

    `prompts` holds one token list per prompt (several only for /v1/completions batches).
    extras: engine request options (session_id, retention, structured_output); None values are
    left out.
    """
    try:
        ticket = state.admission.admit(len(prompts) * params.n, sum(len(prompt) for prompt in prompts))
    except APIError as error:
        if error.status == 429:
            state.metrics.rejected.inc()
        raise
    return Generation(state, engine, prompts, params, ticket, request_id=request_id, arrival=arrival,
                      priority=priority, cache_salt=cache_salt, extras=extras)


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


async def until_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """Runs `work`, cancelling it if the client disconnects first (non-streamed responses).

    The request body has been read already, so the next ASGI message can only be the disconnect.
    Cancelling `work` unwinds its engine streams, which aborts their requests.
    """
    outcome: list[T] = []
    failure: list[BaseException] = []

    async with anyio.create_task_group() as tg:

        async def run() -> None:
            try:
                outcome.append(await work())
            except Exception as error:  # noqa: BLE001 - re-raised below, outside the task group
                failure.append(error)
            tg.cancel_scope.cancel()

        async def watch() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(run)
        tg.start_soon(watch)
    if failure:
        raise failure[0]
    if not outcome:
        raise ClientDisconnected
    return outcome[0]


def _param_of(message: str) -> str | None:
    """The parameter an engine refusal is about, from its wording."""
    if "max_model_len" in message or "context" in message:
        return "messages"
    for name in ("logit_bias", "stop_token_ids"):
        if name in message:
            return name
    return None
