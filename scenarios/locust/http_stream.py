"""Sends one scenario request as a stream from a Locust FastHttpUser and reports what it measured.

Locust's own row for the POST (named `POST <label>`) is rewritten to the end-to-end time of the
stream and its length to the output tokens; the streaming figures go through Locust's request
event as rows of their own, so they land in its CSV and HTML reports:

    request_type  name        response_time column means        one event per
    TTFT          <label>     ms to the first output frame      request
    ITL           <scenario>  ms between output frames          gap between frames
    TOKENS/S      <scenario>  output tokens per second (not ms) request with >= 2 output frames
    CANCEL        <scenario>  ms until the client closed it     cancelled request

Each request also becomes a RequestSample in the run state (the benchmark's raw data).
"""

from __future__ import annotations

import time

from gevent import GreenletExit
from locust.contrib.fasthttp import FastHttpUser

from scenarios.locust.load_hooks import RUN
from scenarios.locust.samples import RequestSample
from scenarios.locust.sse_meter import SSEMeter, StreamMeasurement
from scenarios.locust.workloads import WorkRequest


def _fire(user: FastHttpUser, request_type: str, name: str, value: float, length: int = 0) -> None:
    user.environment.events.request.fire(request_type=request_type, name=name, response_time=value,
                                         response_length=length, exception=None, context={})


def send_streamed(user: FastHttpUser, request: WorkRequest) -> StreamMeasurement:
    """POSTs `request` with stream=True, reads the SSE body line by line as it arrives.

    A request with `cancel_after_chunks` is closed by the client after that many output frames:
    the socket is closed, which is how an IDE drops a completion a keystroke made stale. Errors
    (a status other than 200, an error frame, a stream without `[DONE]`) mark the POST failed.
    """
    started_wall, started = time.time(), time.perf_counter()
    meter = SSEMeter(started)
    cancelled = False
    error: str | None = None
    # identity: Locust asks for gzip by default, and a compressed stream could not be read by line.
    headers = {"Accept-Encoding": "identity", **RUN.headers, **request.headers}
    try:
        with user.client.request("POST", request.path, name=f"POST {request.label}", json=request.body,
                                 headers=headers, stream=True, catch_response=True) as response:
            try:
                if response.status_code != 200:
                    error = f"HTTP {response.status_code}: {(response.text or '')[:300]}"
                else:
                    raw = response._response  # geventhttpclient's response: readline() returns per line
                    while True:
                        line = raw.readline(b"\n")
                        now = time.perf_counter()
                        if not line:
                            break
                        meter.feed(line, now)
                        if (request.cancel_after_chunks is not None
                                and len(meter.measurement.output_times) >= request.cancel_after_chunks):
                            cancelled = True
                            raw.release()  # body unread: the socket is closed, not pooled
                            break
                    measurement = meter.close(time.perf_counter())
                    error = measurement.error or (None if cancelled or measurement.done
                                                  else "stream ended without data: [DONE]")
            except (OSError, ValueError) as failure:  # connection reset or closed mid-stream
                error = f"{type(failure).__name__}: {failure}"
            elapsed = time.perf_counter() - started
            response.request_meta["response_time"] = elapsed * 1000
            response.request_meta["response_length"] = meter.measurement.output_tokens
            if error:
                response.failure(error)
            else:
                response.success()
    except GreenletExit:
        # The run ended under this request: keep what arrived, then let the kill proceed.
        _record(request, meter.measurement, started_wall, started, cancelled=False, interrupted=True, error=None)
        raise
    measurement = meter.measurement
    _record(request, measurement, started_wall, started, cancelled, False, error)
    if error is None:
        _report_stream(user, request, measurement, cancelled, time.perf_counter() - started)
    return measurement


def _record(request: WorkRequest, measurement: StreamMeasurement, started_wall: float, started: float,
            cancelled: bool, interrupted: bool, error: str | None) -> None:
    RUN.record(RequestSample(
        scenario=request.scenario, label=request.label, turn=request.turn, started=started_wall,
        ended=started_wall + (time.perf_counter() - started), ttft=measurement.ttft,
        chunk_gaps=measurement.chunk_gaps,
        # Cut or cancelled streams have no usage frame: their output frames are the count.
        output_tokens=measurement.output_tokens if not (cancelled or interrupted) else len(measurement.output_times),
        prompt_tokens=measurement.prompt_tokens, cached_tokens=measurement.cached_tokens,
        tpot=measurement.time_per_output_token, cancelled=cancelled, interrupted=interrupted, error=error))


def _report_stream(user: FastHttpUser, request: WorkRequest, measurement: StreamMeasurement, cancelled: bool,
                   elapsed: float) -> None:
    if measurement.ttft is not None:
        _fire(user, "TTFT", request.label, measurement.ttft * 1000)
    for gap in measurement.chunk_gaps:
        _fire(user, "ITL", request.scenario, gap * 1000)
    if cancelled:
        _fire(user, "CANCEL", request.scenario, elapsed * 1000, len(measurement.output_times))
    elif measurement.time_per_output_token:
        _fire(user, "TOKENS/S", request.scenario, 1.0 / measurement.time_per_output_token, measurement.output_tokens)
