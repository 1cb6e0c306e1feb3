"""Admission control: a bounded waiting queue, and the drain on shutdown.

A request is *waiting* from admission until its first output arrives (it sits in the engine's
queue or in its prefill), then *running*. The bound is on waiting work only, in requests and in
prompt tokens, because that is what grows without limit under overload: running requests are
already bounded by the engine's batch. Beyond the bound a request is refused at once with 429
and a Retry-After estimated from how long recent requests waited, instead of queueing into a
timeout. One request larger than the token bound is still admitted when nothing else waits, or
it could never run.

The controller also knows every admitted request, which is what a graceful shutdown needs:
`close()` refuses new work with 503, `wait_idle()` waits for the admitted requests to finish,
and whatever is left after the timeout is aborted through the engine request ids on its ticket.
"""

from __future__ import annotations

import math
import time

import anyio

from gateway.errors import APIError, service_unavailable

# Weight of the newest observation in the moving average of queue waits.
_WAIT_EMA_WEIGHT = 0.2


class Ticket:
    """One admitted HTTP request: n engine requests sharing one prompt."""

    __slots__ = ("_controller", "admitted_at", "engine_request_ids", "num_prompt_tokens", "num_started",
                 "num_waiting", "released")

    def __init__(self, controller: AdmissionController, num_requests: int, num_prompt_tokens: int) -> None:
        self._controller = controller
        self.num_waiting = num_requests
        self.num_started = 0
        self.num_prompt_tokens = num_prompt_tokens
        self.admitted_at = time.monotonic()
        self.engine_request_ids: list[str] = []
        self.released = False

    def started(self) -> None:
        """One of the ticket's engine requests produced its first output."""
        if self.num_waiting > 0 and not self.released:
            self.num_waiting -= 1
            self.num_started += 1
            self._controller._on_started(self, first=self.num_started == 1)

    def release(self) -> None:
        """The HTTP request is over (finished, failed, aborted, or the client left). Idempotent."""
        if not self.released:
            self.released = True
            self._controller._on_released(self)


class AdmissionController:
    def __init__(self, max_waiting_requests: int, max_waiting_tokens: int) -> None:
        self.max_waiting_requests = max_waiting_requests
        self.max_waiting_tokens = max_waiting_tokens
        self.num_waiting_requests = 0
        self.num_waiting_tokens = 0
        self.num_rejected = 0
        self.closed_reason: str | None = None
        self._tickets: set[Ticket] = set()
        self._idle = anyio.Event()
        self._idle.set()
        self._mean_wait_seconds = 1.0

    @property
    def num_admitted(self) -> int:
        return len(self._tickets)

    @property
    def tickets(self) -> list[Ticket]:
        return list(self._tickets)

    def admit(self, num_requests: int, num_prompt_tokens: int) -> Ticket:
        """Admits a request of `num_requests` engine requests, or raises 429 (full) / 503 (closed)."""
        if self.closed_reason is not None:
            raise service_unavailable(self.closed_reason)
        over_requests = self.num_waiting_requests + num_requests > self.max_waiting_requests
        over_tokens = self.num_waiting_tokens + num_prompt_tokens > self.max_waiting_tokens
        if self.num_waiting_requests > 0 and (over_requests or over_tokens):
            self.num_rejected += 1
            retry_after = self.retry_after_seconds()
            raise APIError(
                429,
                f"The server is at capacity: {self.num_waiting_requests} requests with "
                f"{self.num_waiting_tokens} prompt tokens are waiting (limits: {self.max_waiting_requests} "
                f"requests, {self.max_waiting_tokens} tokens). Retry after {retry_after} s.",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(retry_after)},
            )
        ticket = Ticket(self, num_requests, num_prompt_tokens)
        self.num_waiting_requests += num_requests
        self.num_waiting_tokens += num_prompt_tokens
        self._tickets.add(ticket)
        if self._idle.is_set():
            self._idle = anyio.Event()
        return ticket

    def retry_after_seconds(self) -> int:
        """Whole seconds until a slot is likely free: the recent mean time a request waited."""
        return max(1, math.ceil(self._mean_wait_seconds))

    def close(self, reason: str) -> None:
        """Refuses every new request with 503 from now on (shutdown)."""
        self.closed_reason = reason

    async def wait_idle(self, timeout: float) -> bool:
        """Waits until no admitted request is left; False when the timeout came first."""
        with anyio.move_on_after(timeout):
            await self._idle.wait()
            return True
        return not self._tickets

    # ---- ticket callbacks --------------------------------------------------------------------
    def _on_started(self, ticket: Ticket, first: bool) -> None:
        self.num_waiting_requests -= 1
        if first:
            self.num_waiting_tokens -= ticket.num_prompt_tokens
            waited = time.monotonic() - ticket.admitted_at
            self._mean_wait_seconds += _WAIT_EMA_WEIGHT * (waited - self._mean_wait_seconds)

    def _on_released(self, ticket: Ticket) -> None:
        self.num_waiting_requests -= ticket.num_waiting
        if ticket.num_started == 0:
            self.num_waiting_tokens -= ticket.num_prompt_tokens
        ticket.num_waiting = 0
        self._tickets.discard(ticket)
        if not self._tickets:
            self._idle.set()
