"""A few seconds of the Locust scenario mix against a real `draftgate serve`: no failures.

Locust runs as its own process (`python -m locust`, headless), as `make load` runs it: importing
Locust here would monkey-patch the test process with gevent. Small prompts and short answers keep
the run short on 2 shared cores; every scenario gets one user, and half the IDE completions are
cancelled after their first tokens, the case the server must survive without a failure.

The run is 15 s, then up to STOP_GRACE_SECONDS for the requests in flight to finish
(`--stop-timeout`): the first turns' prefill alone takes about 10 s at one float32 thread here,
and a busier machine must make the test slower, not failed (a CI run on a loaded machine once
ended the window before any turn had finished).
"""

from __future__ import annotations

import csv
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scenarios.bench import parse_counters
from scenarios.locust.samples import read_samples, summarize
from tests.gateway.conftest import Server, start_server, stop_server

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = REPO_ROOT / "scenarios" / "locust" / "locustfile.py"
RUN_SECONDS = 15
STOP_GRACE_SECONDS = 120


@pytest.fixture(scope="module")
def load_server() -> Iterator[Server]:
    server = start_server("--kv-cache-memory", "128MiB")
    try:
        yield server
    finally:
        stop_server(server)


def test_a_short_scenario_mix_runs_without_failures(load_server: Server, tmp_path: Path) -> None:
    prefix = tmp_path / "smoke"
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", "4", "-r", "4",
               "-t", f"{RUN_SECONDS}s", "--stop-timeout", str(STOP_GRACE_SECONDS),
               "--host", load_server.base_url, "--api-key", load_server.api_key or "",
               "--mix", "agent=1,ide=1,rag=1,chat=1", "--prompt-scale", "0.25", "--max-tokens-cap", "12",
               "--tool-seconds", "0.1,0.3", "--ide-cancel-share", "0.5", "--csv", str(prefix),
               "--html", f"{prefix}.html", "--samples-out", f"{prefix}.jsonl", "--only-summary",
               "--loglevel", "WARNING"]
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=RUN_SECONDS + STOP_GRACE_SECONDS + 90)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output  # Locust exits 1 on any failed request or user exception

    samples, window = read_samples(f"{prefix}.jsonl")
    assert [sample.error for sample in samples if sample.error] == []
    assert {sample.scenario for sample in samples} >= {"agent", "ide", "rag", "chat"}, output
    summary = summarize(samples, window)
    assert summary.num_completed >= 1 and summary.num_cancelled >= 1, samples
    assert summary.ttft_p50 is not None and summary.output_tokens_per_second > 0

    with open(f"{prefix}_stats.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    aggregated = next(row for row in rows if row["Name"] == "Aggregated")
    assert aggregated["Failure Count"] == "0"
    # The streaming figures are Locust rows of their own.
    assert {"TTFT", "ITL", "CANCEL"} <= {row["Type"] for row in rows}, rows
    assert Path(f"{prefix}.html").stat().st_size > 0

    # Cancelled and cut-off streams were aborted in the engine: nothing keeps running or holds KV.
    load_server.wait_idle(timeout=90)
    metrics = httpx.get(f"{load_server.base_url}/metrics", headers=load_server.headers, timeout=30).text
    counters = parse_counters(metrics)
    assert counters["vllm:prefix_cache_hits_total"] > 0  # shared prefixes were reused
