"""Gateway overhead: draftgate's gateway vs calling the engine directly vs LiteLLM proxy.

All three serve the same instant engine stand-in (instant_engine.py), so what is measured is the
cost of the HTTP path: parsing, chat template and tokenization, admission, the engine client,
response encoding. In the same run:

- direct: `InstantEngineClient.generate` called in this process (the floor);
- draftgate: `python -m gateway.benchmarks.instant_engine` (uvicorn + uvloop + Litestar);
- LiteLLM: `litellm` proxy with the instant engine as a custom provider (litellm_handler.py),
  started from a separate Python environment that has `litellm[proxy]` (its dependency pins
  clash with this project's), given by --litellm-python.

Each server gets a latency run (1 connection: p50/p99, minus the direct call = added latency)
and a throughput run (--concurrency connections: maximum requests/s), alternating servers over
--rounds rounds; the table shows medians over rounds. The driver's load generator is load.py.

    python -m gateway.benchmarks.overhead --litellm-python /path/to/litellm-env/bin/python --write-docs
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from engine.model.resolve import embedded_gguf_path
from engine.model.tokenizer import load_tokenizer
from engine.sampling_params import SamplingParams
from gateway.benchmarks.instant_engine import INSTANT_MODEL_NAME, InstantEngineClient
from gateway.benchmarks.load import LoadResult, build_request, run_load

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS_PATH = os.path.join(REPO_ROOT, "docs", "benchmarks.md")
BEGIN, END = "<!-- gateway-benchmark:begin -->", "<!-- gateway-benchmark:end -->"
MAX_TOKENS = 16
# Both servers check an API key on every request, as deployed ones do (LiteLLM refuses to run without).
API_KEY = "sk-draftgate-bench-0123456789abcdef0123456789abcdef"
BODY = json.dumps({"model": INSTANT_MODEL_NAME, "max_tokens": MAX_TOKENS,
                   "messages": [{"role": "user", "content": "Hello! What is the weather like today?"}]}).encode()


@dataclass
class ServerFigures:
    name: str
    p50: float  # seconds, one connection
    p99: float
    requests_per_second: float  # at --concurrency connections
    num_errors: int


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(url: str, timeout: float, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: server exited with {process.returncode}")
        try:
            if httpx.get(url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{url} not ready after {timeout} s")


@contextmanager
def running(args: list[str], ready_url: str, env: dict[str, str] | None = None, cwd: str | None = None,
            timeout: float = 180.0) -> Iterator[None]:
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                               start_new_session=True)
    try:
        try:
            wait_until(ready_url, timeout, process)
        except RuntimeError:
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace")[-4000:])
            raise
        yield
    finally:
        # The server's whole process group: LiteLLM may start helpers of its own.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        log.close()


@contextmanager
def gateway_server() -> Iterator[int]:
    port = free_port()
    with running([sys.executable, "-m", "gateway.benchmarks.instant_engine", "--port", str(port), "--api-key", API_KEY],
                 f"http://127.0.0.1:{port}/ready", cwd=REPO_ROOT):
        yield port


@contextmanager
def litellm_server(python: str) -> Iterator[int]:
    port = free_port()
    folder = tempfile.mkdtemp(prefix="draftgate-litellm-")
    try:
        with open(os.path.join(folder, "instant_handler.py"), "w") as file:
            file.write("from gateway.benchmarks.litellm_handler import instant_llm  # noqa: F401\n")
        with open(os.path.join(folder, "config.yaml"), "w") as file:
            file.write(
                "model_list:\n"
                f"  - model_name: {INSTANT_MODEL_NAME}\n"
                "    litellm_params:\n"
                f"      model: instant/{INSTANT_MODEL_NAME}\n"
                "litellm_settings:\n"
                "  custom_provider_map:\n"
                '    - {"provider": "instant", "custom_handler": instant_handler.instant_llm}\n'
            )
        litellm_cli = os.path.join(os.path.dirname(python), "litellm")
        env = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + folder, "LITELLM_LOG": "ERROR",
               "DRAFTGATE_BENCH_GGUF": embedded_gguf_path(), "LITELLM_MASTER_KEY": API_KEY}
        with running([litellm_cli, "--config", os.path.join(folder, "config.yaml"), "--host", "127.0.0.1", "--port",
                      str(port), "--num_workers", "1"], f"http://127.0.0.1:{port}/health/liveliness", env=env,
                     cwd=folder, timeout=300):
            yield port
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure_direct(num_calls: int) -> tuple[float, float, float]:
    """(p50, p99, calls/s) of collecting one instant completion in-process."""
    engine = InstantEngineClient(load_tokenizer(None))
    prompt = engine.tokenizer.encode("Hello! What is the weather like today?")
    params = SamplingParams(max_tokens=MAX_TOKENS)

    async def run() -> list[float]:
        latencies = []
        for _ in range(num_calls):
            started = time.perf_counter()
            async for _delta in engine.generate(prompt, params, request_id="direct"):
                pass
            latencies.append(time.perf_counter() - started)
        return latencies

    latencies = sorted(asyncio.run(run()))
    return latencies[len(latencies) // 2], latencies[int(0.99 * len(latencies))], len(latencies) / sum(latencies)


def measure_server(name: str, port: int, seconds: float, concurrency: int) -> ServerFigures:
    request = build_request("127.0.0.1", port, "/v1/chat/completions", BODY,
                            {"Authorization": f"Bearer {API_KEY}"})
    latency: LoadResult = asyncio.run(run_load("127.0.0.1", port, request, concurrency=1, seconds=seconds))
    throughput: LoadResult = asyncio.run(run_load("127.0.0.1", port, request, concurrency=concurrency,
                                                  seconds=seconds))
    return ServerFigures(name, latency.percentile(0.5), latency.percentile(0.99), throughput.requests_per_second,
                         latency.num_errors + throughput.num_errors)


def median_figures(rounds: list[ServerFigures]) -> ServerFigures:
    return ServerFigures(rounds[0].name, statistics.median(r.p50 for r in rounds),
                         statistics.median(r.p99 for r in rounds),
                         statistics.median(r.requests_per_second for r in rounds), sum(r.num_errors for r in rounds))


def litellm_version(python: str) -> str:
    return subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def render_table(direct: tuple[float, float, float], servers: list[ServerFigures], args: argparse.Namespace) -> str:
    direct_p50, direct_p99, direct_rps = direct
    peer = (f" LiteLLM {litellm_version(args.litellm_python)} proxy (1 worker, master key set, the instant engine "
            "as a custom provider doing the same template + tokenize work)." if args.litellm_python else "")
    lines = [
        "## Gateway overhead (instant engine stand-in)",
        "",
        f"`python -m gateway.benchmarks.overhead`: non-streamed chat completion, {MAX_TOKENS} output tokens, "
        f"{os.cpu_count()} CPU cores shared by server and load generator. Latency: 1 connection; requests/s: "
        f"{args.concurrency} keep-alive connections; {args.seconds:.0f} s per run, medians over {args.rounds} "
        "alternating rounds. Added latency = server latency minus the direct call. Both servers check an API "
        f"key.{peer}",
        "",
        "| path | p50 ms | p99 ms | added p50 ms | added p99 ms | max requests/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| engine called directly | {direct_p50 * 1e3:.3f} | {direct_p99 * 1e3:.3f} | - | - | {direct_rps:,.0f} |",
    ]
    for figures in servers:
        lines.append(
            f"| {figures.name} | {figures.p50 * 1e3:.2f} | {figures.p99 * 1e3:.2f} | "
            f"{(figures.p50 - direct_p50) * 1e3:.2f} | {(figures.p99 - direct_p99) * 1e3:.2f} | "
            f"{figures.requests_per_second:,.0f} |"
        )
    by_name = {figures.name: figures for figures in servers}
    if "draftgate" in by_name and "LiteLLM proxy" in by_name:
        ours, theirs = by_name["draftgate"], by_name["LiteLLM proxy"]
        lines += ["", f"draftgate / LiteLLM: {ours.requests_per_second / theirs.requests_per_second:.1f}x the "
                      f"requests/s, p99 {ours.p99 * 1e3:.2f} ms vs {theirs.p99 * 1e3:.2f} ms "
                      "(goal: at least 2x the requests/s at a lower p99)."]
    errors = sum(figures.num_errors for figures in servers)
    if errors:
        lines += ["", f"Non-200 responses during the runs: {errors}."]
    return "\n".join(lines) + "\n"


def write_docs(section: str, path: str = DOCS_PATH) -> None:
    """Replaces the text between this benchmark's markers, leaving every other section alone."""
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Benchmarks\n"
    block = f"{BEGIN}\n{section}{END}"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w", encoding="utf-8") as file:
        file.write(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--litellm-python", default=None,
                        help="python of an environment with litellm[proxy], msgspec, anyio and gguf installed "
                             "(without it LiteLLM is left out)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each measured run")
    parser.add_argument("--concurrency", type=int, default=32, help="connections of the throughput runs")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per server")
    parser.add_argument("--direct-calls", type=int, default=5000, help="calls of the direct measurement")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    direct = measure_direct(args.direct_calls)
    rounds: dict[str, list[ServerFigures]] = {}
    with contextlib.ExitStack() as stack:
        ports = {"draftgate": stack.enter_context(gateway_server())}
        if args.litellm_python:
            ports["LiteLLM proxy"] = stack.enter_context(litellm_server(args.litellm_python))
        for round_index in range(args.rounds):
            for name, port in ports.items():
                figures = measure_server(name, port, args.seconds, args.concurrency)
                rounds.setdefault(name, []).append(figures)
                print(f"round {round_index + 1} {name}: p50 {figures.p50 * 1e3:.2f} ms, p99 {figures.p99 * 1e3:.2f} "
                      f"ms, {figures.requests_per_second:,.0f} req/s", flush=True)
    table = render_table(direct, [median_figures(r) for r in rounds.values()], args)
    print(table)
    if args.write_docs:
        write_docs(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
