"""Disconnects abort engine work, overload gets 429 + Retry-After, SIGTERM drains and exits cleanly.

One server with a small waiting queue and a short shutdown timeout; the last test stops it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import httpx
import pytest

from tests.gateway.conftest import Server, start_server, stop_server
from tests.gateway.sse import parse_sse

LONG_PROMPT = [{"role": "user", "content": "Tell me a long story. " + "Once upon a time there was a village. " * 90}]
ENDLESS = {"max_tokens": 600, "ignore_eos": True, "temperature": 0}
MAX_WAITING_REQUESTS = 3
SHUTDOWN_TIMEOUT_SECONDS = 4


@pytest.fixture(scope="module")
def server() -> Server:
    # No speculation: the abort checks count tokens, and on this repetitive prompt suffix drafts
    # make dozens of tokens per step.
    started = start_server("--max-waiting-requests", str(MAX_WAITING_REQUESTS), "--max-num-seqs", "2",
                           "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_SECONDS), "--speculative", "none")
    yield started
    stop_server(started)


def generated_tokens(server: Server) -> float:
    return server.engine_stats().get("vllm:generation_tokens_total", 0.0)


def test_disconnect_before_the_first_token_aborts(server: Server) -> None:
    before = generated_tokens(server)
    with server.client() as client, client.stream(
        "POST", "/v1/chat/completions", json={"messages": LONG_PROMPT, "stream": True, **ENDLESS}
    ) as response:
        assert response.status_code == 200
        first = next(response.iter_raw())  # the role chunk, sent before the prompt is even computed
        assert b'"role":"assistant"' in first
    server.wait_idle(timeout=30)
    assert generated_tokens(server) - before < 50  # aborted long before its 600 tokens


def test_disconnect_during_decode_aborts(server: Server) -> None:
    before = generated_tokens(server)
    with server.client() as client, client.stream(
        "POST", "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Count to 100."}],
                                              "stream": True, **ENDLESS}
    ) as response:
        contents = 0
        for line in response.iter_lines():
            if '"content":"' in line and '"role"' not in line:
                contents += 1
                if contents == 3:
                    break
    server.wait_idle(timeout=30)
    assert 3 <= generated_tokens(server) - before < 100


def test_non_streamed_disconnect_aborts(server: Server) -> None:
    with server.client() as client, pytest.raises(httpx.ReadTimeout):
        client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Count to 100."}],
                                                  **ENDLESS}, timeout=httpx.Timeout(60, read=1.5))
    server.wait_idle(timeout=30)


def test_burst_beyond_the_queue_gets_429_and_admitted_requests_complete(server: Server) -> None:
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.base_url, headers=server.headers, timeout=120) as client:
            payload = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}
            return await asyncio.gather(*[client.post("/v1/chat/completions", json=payload) for _ in range(16)])

    started = time.monotonic()
    responses = asyncio.run(burst())
    assert time.monotonic() - started < 120  # nothing hangs
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    rejected = [r for r in responses if r.status_code == 429]
    assert rejected and statuses.count(200) >= MAX_WAITING_REQUESTS
    for response in rejected:
        assert int(response.headers["retry-after"]) >= 1
        assert response.json()["error"]["code"] == "rate_limit_exceeded"
    for response in responses:
        if response.status_code == 200:
            assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
    server.wait_idle(timeout=30)
    metrics = httpx.get(f"{server.base_url}/metrics", headers=server.headers).text
    assert "draftgate:admission_rejected_total" in metrics


def _children(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as file:
                    fields = file.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                children.append(int(entry))
    return children


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as file:
        return file.read()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_drains_then_exits_without_orphans(server: Server) -> None:
    children = _children(server.process.pid)
    assert children, "the engine runs in a child process"
    results: dict[str, bytes] = {}

    def stream(name: str, payload: dict) -> None:
        with server.client() as client:
            results[name] = client.post("/v1/chat/completions", json={"stream": True, **payload}).content

    short = threading.Thread(target=stream, args=("short", {
        "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3, "temperature": 0}))
    endless = threading.Thread(target=stream, args=("endless", {
        "messages": [{"role": "user", "content": "Count to 1000."}], **ENDLESS}))
    endless.start()
    short.start()
    time.sleep(1.0)
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with server.client() as client:
        assert client.get("/ready").status_code == 503
        refused = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                            "max_tokens": 1})
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "service_unavailable_error"
        assert httpx.get(f"{server.base_url}/health").status_code == 200
    short.join(60)
    endless.join(60)
    # The short request finished normally; the endless one was aborted at the timeout, with an error.
    short_events = parse_sse(results["short"])
    assert short_events[-1].data == "[DONE]" and '"finish_reason":"length"' in short_events[-2].data
    endless_events = parse_sse(results["endless"])
    assert endless_events[-1].data == "[DONE]" and "shutting down" in endless_events[-2].data
    assert server.process.wait(60) == 0
    for pid in children:
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), f"process {pid} outlived the server"


def test_engine_death_fails_health_and_stops_the_server() -> None:
    crashed = start_server("--shutdown-timeout", "1")
    try:
        [engine_pid] = [pid for pid in _children(crashed.process.pid) if b"spawn_main" in _cmdline(pid)]
        os.kill(engine_pid, signal.SIGKILL)
        assert crashed.process.wait(60) == 1  # a gateway without an engine exits, so a supervisor restarts it
        assert "engine" in crashed.log()
    finally:
        stop_server(crashed)
