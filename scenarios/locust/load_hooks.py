"""The Locust side of the load scenarios: command-line options, run state, samples on disk.

Imported by the locustfiles only (importing Locust monkey-patches the process with gevent, so
nothing that tests import in-process may import this module).

Options added to Locust's command line (all have defaults; `locust --help` lists them):
  --api-key KEY            sent as a bearer token (default: $DRAFTGATE_API_KEY)
  --model NAME             the model to ask for (default: the first of GET /v1/models)
  --mix agent=4,ide=3,...  scenario weights (default agent=4,ide=3,rag=2,chat=1; 0 leaves one out)
  --run-seed N             seeds every workload (default 0): the same requests reach every system
  --prompt-scale X         scales the long texts: agent prompts, code files, documents (default 1)
  --tool-seconds LO,HI     an agent's tool time between turns (default 0.5,1.5)
  --subagent-share X       share of agent turns that spawn a subagent (default 0.2)
  --max-tokens-cap N       caps every scenario's max_tokens (default 0: the scenarios' own)
  --ide-cancel-share X     share of IDE completions cancelled after the first tokens (default 0.3)
  --ide-fim auto|on|off    send `suffix` (FIM): auto probes the server once (default auto)
  --samples-out PATH       write every request's sample as JSON lines (the benchmark reads them)
  --arrival-rate R         open loop (open_loop.py): requests per second, Poisson arrivals
  --max-in-flight N        open loop: most requests outstanding; arrivals beyond are dropped
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import gevent.lock
from locust import events
from locust.env import Environment

from scenarios.locust.options import DEFAULT_MIX, parse_range
from scenarios.locust.samples import RequestSample, write_samples
from scenarios.locust.workloads import COMPLETIONS_PATH, AgentApp, Document, make_documents

logger = logging.getLogger("draftgate.load")


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    group = parser.add_argument_group("draftgate scenarios")
    group.add_argument("--api-key", default=os.environ.get("DRAFTGATE_API_KEY", ""), help="bearer token")
    group.add_argument("--model", default="", help="model name (default: the first of GET /v1/models)")
    group.add_argument("--mix", default=DEFAULT_MIX,
                       help="scenario weights, e.g. agent=1 for agents only (weight 0 leaves one out)")
    group.add_argument("--run-seed", type=int, default=0, help="seed of every workload")
    group.add_argument("--prompt-scale", type=float, default=1.0, help="scale of agent prompts, code files, documents")
    group.add_argument("--tool-seconds", default="0.5,1.5", help="agent tool time between turns: LO,HI seconds")
    group.add_argument("--subagent-share", type=float, default=0.2, help="share of agent turns spawning a subagent")
    group.add_argument("--max-tokens-cap", type=int, default=0, help="cap on every scenario's max_tokens (0: none)")
    group.add_argument("--ide-cancel-share", type=float, default=0.3, help="share of IDE completions cancelled")
    group.add_argument("--ide-fim", default="auto", choices=["auto", "on", "off"],
                       help="send suffix (fill-in-the-middle): auto probes the server")
    group.add_argument("--samples-out", default="", help="write per-request samples here (JSON lines)")
    group.add_argument("--arrival-rate", type=float, default=1.0, help="open loop: requests per second")
    group.add_argument("--max-in-flight", type=int, default=64, help="open loop: most outstanding requests")


@dataclass
class RunState:
    """What every simulated user of one run shares; resolved once, on the first user's start."""

    ready: bool = False
    model: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    use_suffix: bool = False
    seed: int = 0
    prompt_scale: float = 1.0
    tool_seconds: tuple[float, float] = (0.5, 1.5)
    subagent_share: float = 0.2
    ide_cancel_share: float = 0.3
    max_tokens_cap: int = 0
    app: AgentApp | None = None
    documents: list[Document] = field(default_factory=list)
    samples: list[RequestSample] = field(default_factory=list)
    window_start: float = 0.0
    num_users: int = 0
    _lock: gevent.lock.Semaphore = field(default_factory=gevent.lock.Semaphore)

    def next_user_key(self) -> str:
        self.num_users += 1
        return f"u{self.num_users}"

    def ensure_ready(self, environment: Environment) -> None:
        with self._lock:
            if not self.ready:
                self._resolve(environment)
                self.ready = True

    def _resolve(self, environment: Environment) -> None:
        options = environment.parsed_options
        host = (environment.host or "").rstrip("/")
        if not host:
            raise ValueError("no --host given: the server's base URL, e.g. http://127.0.0.1:8000")
        self.headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
        self.seed, self.prompt_scale = options.run_seed, options.prompt_scale
        self.tool_seconds = parse_range(options.tool_seconds, "--tool-seconds")
        self.subagent_share, self.ide_cancel_share = options.subagent_share, options.ide_cancel_share
        if options.max_tokens_cap < 0:
            raise ValueError(f"--max-tokens-cap must be >= 0, got {options.max_tokens_cap}")
        self.max_tokens_cap = options.max_tokens_cap
        self.model = options.model or self._first_model(host)
        self.use_suffix = options.ide_fim == "on" or (options.ide_fim == "auto" and self._accepts_suffix(host))
        self.app = AgentApp.make(self.seed, self.prompt_scale)
        self.documents = make_documents(self.seed, prompt_scale=self.prompt_scale)
        logger.info("model %s, IDE completions %s", self.model, "with suffix (FIM)" if self.use_suffix else "prefix only")

    def _call(self, host: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self.headers, **({"Content-Type": "application/json"} if data else {})}
        request = urllib.request.Request(host + path, data=data, headers=headers, method="POST" if data else "GET")
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def _first_model(self, host: str) -> str:
        status, body = self._call(host, "/v1/models")
        if status != 200:
            raise RuntimeError(f"GET {host}/v1/models answered {status}: {body[:300]!r}")
        return json.loads(body)["data"][0]["id"]

    def _accepts_suffix(self, host: str) -> bool:
        """FIM support, as the server states it: does a one-token completion with `suffix` succeed?

        draftgate answers 400 naming `suffix` for a model without FIM tokens (SmolLM2), and
        llama.cpp's server refuses `suffix` on /v1/completions; a server that answers 200 gets
        FIM requests.
        """
        status, _ = self._call(host, COMPLETIONS_PATH, {"model": self.model, "prompt": "def add(a, b):\n    return",
                                                        "suffix": "\n", "max_tokens": 1, "temperature": 0})
        return status == 200

    def max_tokens(self, default: int) -> int:
        return min(default, self.max_tokens_cap) if self.max_tokens_cap else default

    def record(self, sample: RequestSample) -> None:
        self.samples.append(sample)


RUN = RunState()


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_: Any) -> None:
    RUN.window_start = time.time()


@events.test_stop.add_listener
def _on_test_stop(environment: Environment, **_: Any) -> None:
    window = (RUN.window_start, time.time())
    path = environment.parsed_options.samples_out if environment.parsed_options else ""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_samples(path, RUN.samples, window)
    completed = [sample for sample in RUN.samples if sample.completed]
    failed = [sample for sample in RUN.samples if sample.error is not None]
    logger.info("%d requests completed, %d cancelled, %d failed, %d cut by the end of the run", len(completed),
                sum(sample.cancelled for sample in RUN.samples), len(failed),
                sum(sample.interrupted for sample in RUN.samples))
