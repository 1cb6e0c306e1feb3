"""`make bench`: draftgate and llama.cpp's server side by side, one run, same GGUF, same machine.

    python -m scenarios.bench                      # all systems, levels 1,2,4,8; prints the table
    python -m scenarios.bench --write-docs         # ... and regenerates docs/benchmarks.md's section
    python -m scenarios.bench --systems llama.cpp --levels 1,2 --durations 20,20   # a quick look
    python -m scenarios.bench --report-only runs/bench/20261129-2300 --write-docs  # redraw from results

Systems, never two at once (each has the machine's cores), taking turns level by level:
  draftgate            `draftgate serve --speculative none`
  draftgate+spec       `--speculative hybrid`: what `draftgate serve` runs by default for the embedded
                       model (the shipped EAGLE head and suffix drafting, per request and step
                       whichever expects more; engine.benchmarks.speculative)
  llama.cpp            C++ `llama-server` built from the llama-cpp-python sdist (scenarios/llama_cpp.py),
                       restarted per level with --parallel = the level's users

For each level, every system in turn (the order rotates from level to level, so nobody always
goes first), Locust runs the agent tool-loop scenario closed-loop with that many users
(sessions) for the level's duration; then one run of the whole scenario mix (agent, IDE with
cancellations, RAG, chat), again every system in turn. The systems of one level thus run within
minutes of each other: this machine's speed drifts by tens of percent over tens of minutes, and
running each system through all its levels before the next made that drift part of the
comparison. draftgate's servers stay up (idle, they use no CPU) and keep their caches across
levels; llama.cpp's is restarted per level (its slots are fixed at start). Every level uses its
own seed, so no level is served from the cache of another, and each system sees the same request
sequences. Raw samples, Locust's CSV and
HTML reports and results.json land in runs/bench/<timestamp>/; the table and plots are made by
scenarios/bench_report.py. Only HTTP and processes: nothing of engine/ or gateway/ is imported.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from scenarios import llama_cpp
from scenarios.bench_report import (BenchResults, LevelResult, llama_server_version, machine_description, render,
                                    write_docs_section)
from scenarios.locust.samples import read_samples, summarize

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = REPO_ROOT / "scenarios" / "locust" / "locustfile.py"
SYSTEMS = ("draftgate", "draftgate+spec", "llama.cpp")
MIX_LABEL = "mix"


@dataclass(frozen=True)
class SystemSpec:
    name: str
    kind: str  # "draftgate" or "llama.cpp"
    server_args: tuple[str, ...]


def system_specs(names: list[str], threads: int, extra_draftgate: list[str], extra_llama: list[str]) -> list[SystemSpec]:
    common = ("--num-threads", str(threads), "--kv-cache-memory", "2GiB", *extra_draftgate)
    speculative = ("--speculative", "hybrid")  # the default (auto) for the embedded model
    table = {
        "draftgate": SystemSpec("draftgate", "draftgate", ("--speculative", "none", *common)),
        "draftgate+spec": SystemSpec("draftgate+spec", "draftgate", (*speculative, *common)),
        "llama.cpp": SystemSpec("llama.cpp", "llama.cpp", tuple(extra_llama)),
    }
    unknown = [name for name in names if name not in table]
    if unknown:
        raise ValueError(f"--systems: unknown {', '.join(unknown)} (known: {', '.join(SYSTEMS)})")
    return [table[name] for name in names]


def describe(spec: SystemSpec, threads: int) -> str:
    """How a system is started, for the report."""
    if spec.kind == "draftgate":
        return "draftgate serve " + " ".join(spec.server_args)
    binary = llama_cpp.ensure_llama_server(build_if_missing=False)
    example = llama_cpp.llama_server_command(Path("llama-server"), "SmolLM2-135M-Instruct.Q4_1.gguf", 0, parallel=1,
                                             threads=threads)
    flags = " ".join(example[1:]).replace("--port 0 ", "").replace("--parallel 1 --ctx-size 4096",
                                                                   "--parallel USERS --ctx-size 4096*USERS")
    return f"llama-server {flags} {' '.join(spec.server_args)}".rstrip() + f" ({llama_server_version(str(binary))})"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A server process on a free local port, its log in the results folder."""

    def __init__(self, command: list[str], log_path: Path, port: int, ready_path: str) -> None:
        self.command, self.port, self.base_url = command, port, f"http://127.0.0.1:{port}"
        self.log = log_path.open("ab")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        self.ready_path = ready_path

    def wait_ready(self, timeout_seconds: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.command[0]} exited with {self.process.returncode}; log: {self.log.name}")
            try:
                if httpx.get(self.base_url + self.ready_path, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.base_url}{self.ready_path} not ready after {timeout_seconds:.0f} s; log: {self.log.name}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()


def start_server(spec: SystemSpec, users: int, threads: int, gguf: str, out: Path) -> Server:
    port = _free_port()
    log_path = out / f"{spec.name}.server.log"
    if spec.kind == "draftgate":
        command = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), *spec.server_args]
        server = Server(command, log_path, port, "/ready")
    else:
        binary = llama_cpp.ensure_llama_server()
        command = [*llama_cpp.llama_server_command(binary, gguf, port, parallel=users, threads=threads),
                   *spec.server_args]
        server = Server(command, log_path, port, "/health")
    try:
        server.wait_ready()
        # One small request first: lazy initialisation is not part of any measurement.
        httpx.post(server.base_url + "/v1/chat/completions", timeout=300.0, json={
            "model": _first_model(server.base_url), "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}]}).raise_for_status()
    except BaseException:
        server.stop()
        raise
    return server


def _first_model(base_url: str) -> str:
    return httpx.get(base_url + "/v1/models", timeout=30.0).json()["data"][0]["id"]


def scrape_counters(base_url: str) -> dict[str, float]:
    """Prometheus counters of the server; empty when it has no /metrics."""
    try:
        response = httpx.get(base_url + "/metrics", timeout=30.0)
    except httpx.HTTPError:
        return {}
    return parse_counters(response.text) if response.status_code == 200 else {}


def parse_counters(text: str) -> dict[str, float]:
    """Prometheus text format -> {metric name: value summed over its label sets}."""
    counters: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            counters[name] = counters.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        except (ValueError, IndexError):
            continue
    return counters


def acceptance_rate(before: dict[str, float], after: dict[str, float]) -> float | None:
    drafted = after.get("vllm:spec_decode_num_draft_tokens_total", 0.0) - before.get(
        "vllm:spec_decode_num_draft_tokens_total", 0.0)
    accepted = after.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) - before.get(
        "vllm:spec_decode_num_accepted_tokens_total", 0.0)
    return accepted / drafted if drafted > 0 else None


def run_locust(base_url: str, users: int, seconds: int, mix: str, seed: int, prefix: Path,
               extra: list[str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", str(users), "-r", str(users),
               "-t", f"{seconds}s", "--host", base_url, "--mix", mix, "--run-seed", str(seed),
               "--csv", str(prefix), "--html", f"{prefix}.html", "--samples-out", f"{prefix}.samples.jsonl",
               "--only-summary", "--loglevel", "WARNING", "--exit-code-on-error", "0", *extra]
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=seconds + 300)
    Path(f"{prefix}.locust.log").write_text(completed.stdout + completed.stderr)
    if completed.returncode != 0:
        raise RuntimeError(f"locust exited with {completed.returncode}; log: {prefix}.locust.log")
    return completed


def measure(spec: SystemSpec, server: Server, label: str, users: int, seconds: int, mix: str, seed: int,
            out: Path, extra: list[str]) -> LevelResult:
    prefix = out / f"{spec.name}.{label}.u{users}"
    before = scrape_counters(server.base_url)
    run_locust(server.base_url, users, seconds, mix, seed, prefix, extra)
    after = scrape_counters(server.base_url)
    samples, window = read_samples(f"{prefix}.samples.jsonl")
    scenarios = sorted({sample.scenario for sample in samples} - {"subagent"})
    result = LevelResult(
        system=spec.name, label=label, users=users, seconds=seconds, seed=seed,
        summary=summarize(samples, window, "agent" if label == "agent" else None),
        by_scenario={name: summarize(samples, window, name) for name in scenarios},
        acceptance=acceptance_rate(before, after))
    summary = result.summary
    print(f"  {spec.name:15s} {label:5s} u={users}: {summary.output_tokens_per_second:6.1f} tok/s, "
          f"{summary.requests_per_second:5.2f} req/s, TTFT p50 {_ms(summary.ttft_p50)}, later turns "
          f"{_ms(summary.later_turn_ttft_p50)}, failed {summary.num_failed}", flush=True)
    return result


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


class Servers:
    """The systems' servers: a draftgate server is started once and kept (its caches warm across
    levels, like a real server's); llama.cpp's is started per level with --parallel = the users."""

    def __init__(self, args: argparse.Namespace, gguf: str, out: Path) -> None:
        self.args, self.gguf, self.out = args, gguf, out
        self.running: dict[str, tuple[Server, int]] = {}  # system -> (server, the users it was started for)

    def get(self, spec: SystemSpec, users: int) -> Server:
        have = self.running.get(spec.name)
        if have is not None and (spec.kind == "draftgate" or have[1] == users):
            return have[0]
        if have is not None:
            have[0].stop()
            del self.running[spec.name]
        server = start_server(spec, users, self.args.threads, self.gguf, self.out)
        self.running[spec.name] = (server, users)
        return server

    def release(self, spec: SystemSpec) -> None:
        """llama.cpp's server is not kept past its level (its memory and threads are its level's)."""
        if spec.kind == "llama.cpp" and spec.name in self.running:
            self.running.pop(spec.name)[0].stop()

    def stop_all(self) -> None:
        for server, _ in self.running.values():
            server.stop()
        self.running.clear()


def rotated(specs: list[SystemSpec], turn: int) -> list[SystemSpec]:
    """The systems in this turn's order: each level starts with the next system."""
    shift = turn % len(specs)
    return specs[shift:] + specs[:shift]


def run_levels(specs: list[SystemSpec], args: argparse.Namespace, gguf: str, out: Path) -> list[LevelResult]:
    """Every level, then the mix, each run by every system in turn."""
    results: list[LevelResult] = []
    extra = [*args.locust_arg]
    servers = Servers(args, gguf, out)
    try:
        turn = 0
        for users, seconds in zip(args.levels, args.durations):
            for spec in rotated(specs, turn):
                server = servers.get(spec, users)
                results.append(measure(spec, server, "agent", users, seconds, "agent=1", args.seed + users, out, extra))
                servers.release(spec)
            turn += 1
        if args.mix_seconds > 0:
            for spec in rotated(specs, turn):
                server = servers.get(spec, args.mix_users)
                results.append(measure(spec, server, MIX_LABEL, args.mix_users, args.mix_seconds, args.mix,
                                       args.seed + 1000, out, extra))
                servers.release(spec)
    finally:
        servers.stop_all()
    return results


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"{name} must be positive integers, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m scenarios.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, from: " + ", ".join(SYSTEMS))
    parser.add_argument("--levels", type=lambda t: _int_list(t, "--levels"), default=[1, 2, 4, 8],
                        help="concurrent agent sessions per level (default 1,2,4,8)")
    parser.add_argument("--durations", type=lambda t: _int_list(t, "--durations"), default=[45, 45, 60, 150],
                        help="seconds per level (default 45,45,60,150: llama.cpp needs long runs at 8 to reach turn 2)")
    parser.add_argument("--mix", default="agent=4,ide=3,rag=2,chat=1", help="scenario weights of the mix run")
    parser.add_argument("--mix-users", type=int, default=8)
    parser.add_argument("--mix-seconds", type=int, default=60, help="0 skips the mix run")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of every system (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gguf", default=None, help="GGUF for llama.cpp (default: draftgate's embedded model)")
    parser.add_argument("--draftgate-arg", action="append", default=[], help="extra `draftgate serve` argument")
    parser.add_argument("--llama-server-arg", action="append", default=[], help="extra llama-server argument")
    parser.add_argument("--locust-arg", action="append", default=[], help="extra Locust argument (scenario options)")
    parser.add_argument("--out", default=None, help="results folder (default runs/bench/<timestamp>)")
    parser.add_argument("--write-docs", action="store_true", help="regenerate the section of docs/benchmarks.md")
    parser.add_argument("--report-only", default=None, metavar="DIR", help="redraw the report from DIR/results.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.report_only:
        results = BenchResults.load(Path(args.report_only) / "results.json")
    else:
        if len(args.durations) != len(args.levels):
            raise SystemExit(f"--durations needs one value per level ({len(args.levels)}), got {len(args.durations)}")
        specs = system_specs([name.strip() for name in args.systems.split(",") if name.strip()], args.threads,
                             args.draftgate_arg, args.llama_server_arg)
        out = Path(args.out or REPO_ROOT / "runs" / "bench" / time.strftime("%Y%m%d-%H%M%S"))
        out.mkdir(parents=True, exist_ok=True)
        gguf = args.gguf or llama_cpp.embedded_gguf_path()
        if any(spec.kind == "llama.cpp" for spec in specs):
            llama_cpp.ensure_llama_server()  # build first (long) so no system waits on it mid-run
        command = "python -m scenarios.bench" + (" " + shlex.join(argv) if argv else "")
        machine = machine_description(args.threads)
        started = time.time()
        for spec in specs:
            print(f"{spec.name}: {' '.join(spec.server_args) or '(defaults)'}", flush=True)
        levels = run_levels(specs, args, gguf, out)
        results = BenchResults(command=command, machine=machine, started=started, finished=time.time(),
                               load_average=os.getloadavg(),
                               systems={spec.name: describe(spec, args.threads) for spec in specs},
                               levels=levels, out=str(out))
        results.save(out / "results.json")
    # The plots go with the section: into docs/ only when it is rewritten, else into the run's
    # folder (a run without --write-docs used to redraw docs/img over the published plots).
    section = render(results, REPO_ROOT / "docs" if args.write_docs else Path(args.report_only or results.out))
    print(section)
    if args.write_docs:
        write_docs_section(section, REPO_ROOT / "docs" / "benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
