"""Admission control: the waiting bound in requests and tokens, Retry-After, and the drain."""

from __future__ import annotations

import anyio
import pytest

from gateway.admission import AdmissionController
from gateway.errors import APIError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_request_bound() -> None:
    controller = AdmissionController(max_waiting_requests=3, max_waiting_tokens=10_000)
    first = controller.admit(2, 100)
    controller.admit(1, 100)
    with pytest.raises(APIError) as raised:
        controller.admit(1, 100)
    assert raised.value.status == 429 and int(raised.value.headers["Retry-After"]) >= 1
    assert controller.num_rejected == 1
    first.started()  # one of first's two requests produced output: one slot frees
    assert controller.num_waiting_requests == 2
    controller.admit(1, 100)


def test_token_bound_and_oversized_request_alone() -> None:
    controller = AdmissionController(max_waiting_requests=10, max_waiting_tokens=1000)
    big = controller.admit(1, 5000)  # alone: admitted, or it could never run
    with pytest.raises(APIError):
        controller.admit(1, 10)
    big.started()
    assert controller.num_waiting_tokens == 0
    controller.admit(1, 900)
    with pytest.raises(APIError):
        controller.admit(1, 200)


def test_release_returns_everything_once() -> None:
    controller = AdmissionController(max_waiting_requests=4, max_waiting_tokens=1000)
    ticket = controller.admit(3, 300)
    ticket.started()
    ticket.release()
    ticket.release()
    ticket.started()
    assert (controller.num_waiting_requests, controller.num_waiting_tokens, controller.num_admitted) == (0, 0, 0)


def test_retry_after_follows_observed_waits(monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("gateway.admission.time.monotonic", lambda: clock[0])
    controller = AdmissionController(max_waiting_requests=1, max_waiting_tokens=1000)
    for _ in range(30):
        ticket = controller.admit(1, 10)
        clock[0] += 6.0
        ticket.started()
        ticket.release()
    assert controller.retry_after_seconds() == 6


async def test_close_and_wait_idle() -> None:
    controller = AdmissionController(max_waiting_requests=4, max_waiting_tokens=1000)
    assert await controller.wait_idle(0.01)
    ticket = controller.admit(1, 10)
    controller.close("shutting down")
    with pytest.raises(APIError) as raised:
        controller.admit(1, 10)
    assert raised.value.status == 503
    assert not await controller.wait_idle(0.05)

    async def finish_later() -> None:
        await anyio.sleep(0.05)
        ticket.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(finish_later)
        assert await controller.wait_idle(5.0)
