"""Real servers for the gateway's end-to-end tests.

`draftgate serve` runs as a subprocess on a free 127.0.0.1 port with the embedded model and a
small KV cache, exactly as a user starts it, in float32 so that greedy outputs do not depend on
whether a prompt's prefix was cached (bf16 rounding differs between the two paths). The session server (`server`) is shared by the
modules that need a plain server; modules that need special limits or kill their server start
their own with `start_server`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

API_KEY = "test-key-1"
MODEL = "SmolLM2-135M-Instruct"
STARTUP_TIMEOUT_SECONDS = 240.0


@dataclass
class Server:
    process: subprocess.Popen
    base_url: str
    log_path: str
    api_key: str | None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **options) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=120.0, **options)

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as file:
            return file.read()

    def engine_stats(self) -> dict[str, float]:
        """The engine's figures from /metrics (running, waiting, KV usage)."""
        text = httpx.get(f"{self.base_url}/metrics", headers=self.headers, timeout=30).text
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("vllm:") and "{" in line:
                name = line.split("{", 1)[0]
                values[name] = float(line.rsplit(" ", 1)[1])
        return values

    def wait_idle(self, timeout: float = 60.0) -> dict[str, float]:
        """Waits until the engine runs nothing and holds no KV blocks."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.engine_stats()
            if (stats.get("vllm:num_requests_running") == 0 and stats.get("vllm:num_requests_waiting") == 0
                    and stats.get("vllm:kv_cache_usage_perc") == 0):
                return stats
            if time.monotonic() > deadline:
                raise AssertionError(f"engine not idle after {timeout} s: {stats}")
            time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(*extra_args: str, api_key: str | None = API_KEY) -> Server:
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="draftgate-server-", suffix=".log", delete=False)
    args = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--kv-cache-memory", "64MiB",
            "--num-threads", "1", "--dtype", "float32", *extra_args]
    if api_key:
        args += ["--api-key", api_key]
    env = {key: value for key, value in os.environ.items() if key != "DRAFTGATE_API_KEYS"}
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                               cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    server = Server(process, f"http://127.0.0.1:{port}", log.name, api_key)
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.log()[-4000:]}")
        try:
            if httpx.get(f"{server.base_url}/ready", headers=server.headers, timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop_server(server)
            raise RuntimeError(f"server not ready after {STARTUP_TIMEOUT_SECONDS} s:\n{server.log()[-4000:]}")
        time.sleep(0.25)


def stop_server(server: Server, timeout: float = 60.0) -> int:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(10)
    return server.process.returncode


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    started = start_server("--max-body-size", "1MiB")
    try:
        yield started
    finally:
        stop_server(started)
