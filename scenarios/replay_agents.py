"""Replays agent tool-loop sessions through a real `draftgate serve`, once per canonicalization
policy, and reports the prefix-cache hit rate of turns >= 2 and their time to first token.

    python -m scenarios.replay_agents                 # starts a server per policy, prints the table
    python -m scenarios.replay_agents --write-docs    # ... and records it in docs/benchmarks.md
    python -m scenarios.replay_agents --url http://127.0.0.1:8000 --policies safe   # a running server

Sessions (scenarios/agent_trace.py) run concurrently, each turn after the previous one's tool
"ran" for --tool-seconds, so their turns are multiplexed into the same engine batches. Every
request streams (stream_options.include_usage): time to first token is taken at the first
frame after the opening role frame, i.e. the first generated tokens; the hit rate is
cached_tokens / prompt_tokens from usage, summed over turns >= 2. Only HTTP reaches the product.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from scenarios.agent_trace import AgentSession, make_sessions
from scenarios.bench_report import write_docs_section

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS_BEGIN = "<!-- canonical-benchmark:begin -->"
DOCS_END = "<!-- canonical-benchmark:end -->"
POLICIES = ("off", "safe", "aggressive")


@dataclass
class TurnResult:
    session_id: str
    turn: int
    prompt_tokens: int
    cached_tokens: int
    ttft_seconds: float
    diverged: str
    calls: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass
class PolicyReport:
    policy: str
    turns: list[TurnResult]

    def later(self) -> list[TurnResult]:
        return [turn for turn in self.turns if turn.turn >= 2]

    @property
    def hit_rate(self) -> float:
        later = self.later()
        prompt = sum(turn.prompt_tokens for turn in later)
        return sum(turn.cached_tokens for turn in later) / prompt if prompt else 0.0

    @property
    def first_ttft(self) -> float:
        return statistics.median(turn.ttft_seconds for turn in self.turns if turn.turn == 1)

    @property
    def later_ttft(self) -> float:
        return statistics.median(turn.ttft_seconds for turn in self.later())

    def diverged_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for turn in self.later():
            kind = turn.diverged.split("[", 1)[0]
            counts[kind] = counts.get(kind, 0) + 1
        return counts


def stream_turn(client: httpx.Client, session: AgentSession, turn: int, model: str, max_tokens: int) -> TurnResult:
    body = session.request_body(model, max_tokens)
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    started = time.perf_counter()
    ttft: float | None = None
    frames = 0
    usage: dict = {}
    calls: dict[int, list[str]] = {}
    with client.stream("POST", "/v1/chat/completions", json=body,
                       headers={"x-session-id": session.session_id}) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {response.read().decode(errors='replace')}")
        diverged = response.headers.get("x-draftgate-prefix-diverged", "?")
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            frames += 1
            if frames == 2 and ttft is None:
                ttft = time.perf_counter() - started
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", ()):
                for delta in choice["delta"].get("tool_calls") or ():
                    entry = calls.setdefault(delta["index"], ["", "", ""])
                    entry[0] = delta.get("id") or entry[0]
                    entry[1] = delta["function"].get("name") or entry[1]
                    entry[2] += delta["function"].get("arguments") or ""
    result = TurnResult(session.session_id, turn, usage.get("prompt_tokens", 0),
                        (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                        ttft if ttft is not None else time.perf_counter() - started, diverged,
                        [tuple(entry) for _, entry in sorted(calls.items())])  # type: ignore[misc]
    session.record_turn(result.calls or [(f"call_{turn}", "read_file", "{}")])
    return result


def replay(base_url: str, sessions: list[AgentSession], num_turns: int, tool_seconds: float, model: str,
           max_tokens: int, api_key: str | None = None) -> list[TurnResult]:
    """Runs every session's turns (sessions concurrently, turns in order); all results."""
    results: list[TurnResult] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def run(session: AgentSession, stagger: float) -> None:
        try:
            time.sleep(stagger)
            with httpx.Client(base_url=base_url, headers=headers, timeout=600.0) as client:
                for turn in range(1, num_turns + 1):
                    result = stream_turn(client, session, turn, model, max_tokens)
                    with lock:
                        results.append(result)
                    time.sleep(tool_seconds)  # the tool runs
        except BaseException as error:  # noqa: BLE001 - re-raised in the main thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(session, 0.2 * index), daemon=True)
               for index, session in enumerate(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return sorted(results, key=lambda r: (r.session_id, r.turn))


# ---- a server per policy --------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`draftgate serve` on a free local port, as a user starts it."""

    def __init__(self, policy: str, server_args: list[str]) -> None:
        self.port = _free_port()
        self.log = tempfile.NamedTemporaryFile(prefix=f"draftgate-{policy}-", suffix=".log", delete=False)
        command = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(self.port),
                   "--canonicalization", policy, *server_args]
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        self.base_url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {Path(self.log.name).read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.base_url}/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("server not ready in time")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def run_policies(policies: list[str], args: argparse.Namespace) -> list[PolicyReport]:
    reports = []
    for policy in policies:
        sessions = make_sessions(args.sessions, seed=args.seed, brief_sentences=args.brief_sentences)
        if args.url:
            results = replay(args.url, sessions, args.turns, args.tool_seconds, args.model, args.max_tokens,
                             args.api_key)
        else:
            server = ServerProcess(policy, args.server_arg)
            try:
                server.wait_ready()
                results = replay(server.base_url, sessions, args.turns, args.tool_seconds, args.model,
                                 args.max_tokens)
            finally:
                server.stop()
        report = PolicyReport(policy, results)
        reports.append(report)
        print(f"{policy}: hit rate (turns >= 2) {report.hit_rate:.1%}, TTFT first {report.first_ttft * 1000:.0f} ms, "
              f"later {report.later_ttft * 1000:.0f} ms", flush=True)
    return reports


# ---- output -------------------------------------------------------------------------------------

def markdown(reports: list[PolicyReport], args: argparse.Namespace, command: str) -> str:
    turns = reports[0].turns if reports else []
    prompt_sizes = [turn.prompt_tokens for turn in turns]
    lines = [
        "## Agent tool loops: canonicalization and prefix reuse",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU threads. Measured {time.strftime('%Y-%m-%d')}.",
        "",
        f"Workload (scenarios/agent_trace.py, seed {args.seed}): {args.sessions} concurrent agent sessions x "
        f"{args.turns} turns against the embedded SmolLM2-135M-Instruct, each session with its own ~"
        f"{statistics.median(prompt_sizes[:args.sessions] or [0]):.0f}-token system prompt and 4 tools; every request "
        "is stamped the way agent frameworks stamp them (billing-header nonce, ISO timestamp, request UUID), its tools "
        "reordered and every schema's keys shuffled, earlier tool-call arguments re-serialized with shuffled keys; "
        f"tool_choice required, {args.max_tokens} max tokens, greedy; {args.tool_seconds:g} s of tool time between "
        f"turns. Prompts grow from {min(prompt_sizes or [0])} to {max(prompt_sizes or [0])} tokens. Server: "
        f"`draftgate serve --canonicalization POLICY {' '.join(args.server_arg)}`, one fresh server per policy.",
        "",
        "| policy | cached / prompt tokens, turns >= 2 | TTFT turn 1 (median) | TTFT turns >= 2 (median) | later / first "
        "| where turns >= 2 diverged (x-draftgate-prefix-diverged) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for report in reports:
        counts = ", ".join(f"{name} {count}" for name, count in sorted(report.diverged_counts().items()))
        lines.append(f"| {report.policy} | **{report.hit_rate:.1%}** | {report.first_ttft * 1000:.0f} ms | "
                     f"{report.later_ttft * 1000:.0f} ms | {report.later_ttft / report.first_ttft:.2f} | {counts} |")
    by_policy = {report.policy: report for report in reports}
    if "safe" in by_policy and "off" in by_policy:
        safe, off = by_policy["safe"].hit_rate, by_policy["off"].hit_rate
        met = "met" if safe >= 0.9 and off < 0.2 else "not met"
        lines += ["", f"Goal: safe >= 90% where off stays under 20%: safe {safe:.1%}, off {off:.1%} ({met})."]
    lines += ["", "TTFT is the time to the first streamed frame after the opening role frame (the first "
              "generated tokens of the forced tool call). Under `safe` a later turn extends the previous prompt "
              "and output (the earlier notes stay pinned where they were), so it computes its tool result and "
              "new note, plus any output that did not render back as generated; under `aggressive` the same "
              "without a note; under `off` the billing-header nonce on the "
              "first line breaks every prompt at its first block."]
    return "\n".join(lines)


def write_docs(section: str, path: Path = REPO_ROOT / "docs" / "benchmarks.md") -> None:
    write_docs_section(section, path, DOCS_BEGIN, DOCS_END)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="replay against this running server instead of starting one")
    parser.add_argument("--api-key", default=None, help="API key for --url")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policies to replay")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tool-seconds", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="room for a whole tool call: a call cut short is sent back changed")
    parser.add_argument("--brief-sentences", type=int, default=130, help="length of each session's system prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--server-arg", action="append", default=None,
                        help="extra argument for draftgate serve (repeatable)")
    parser.add_argument("--write-docs", action="store_true", help="record the table in docs/benchmarks.md")
    args = parser.parse_args(argv)
    if args.server_arg is None:
        args.server_arg = ["--kv-cache-memory", "768MiB", "--num-threads", "2"]
    reports = run_policies([p.strip() for p in args.policies.split(",") if p.strip()], args)
    command = "python -m scenarios.replay_agents" + (" " + " ".join(argv) if argv else " " + " ".join(sys.argv[1:]))
    section = markdown(reports, args, command.strip())
    print(section)
    if args.write_docs:
        write_docs(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
