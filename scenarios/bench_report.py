"""The results of `make bench`: stored as JSON, rendered as docs/benchmarks.md's section and plots.

Kept apart from the driver (scenarios/bench.py) so a report can be redrawn from a stored run
(`--report-only`) and tested without servers.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scenarios.locust.samples import RunSummary

DOCS_BEGIN = "<!-- load-benchmark:begin -->"
DOCS_END = "<!-- load-benchmark:end -->"
FRONTIER_PNG = "bench_frontier.png"
TTFT_BY_TURN_PNG = "bench_ttft_by_turn.png"
PEER = "llama.cpp"


@dataclass
class LevelResult:
    system: str
    label: str  # "agent" (the concurrency sweep) or "mix"
    users: int
    seconds: int
    seed: int
    summary: RunSummary
    by_scenario: dict[str, RunSummary] = field(default_factory=dict)
    acceptance: float | None = None  # accepted / drafted tokens over the run (speculation only)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LevelResult:
        return cls(**{**data, "summary": _summary(data["summary"]),
                      "by_scenario": {name: _summary(value) for name, value in data["by_scenario"].items()}})


def _summary(data: dict[str, Any]) -> RunSummary:
    # JSON object keys are strings; the turns are ints.
    return RunSummary(**{**data, "ttft_by_turn": {int(turn): value for turn, value in data["ttft_by_turn"].items()}})


@dataclass
class BenchResults:
    command: str
    machine: str
    started: float
    finished: float
    load_average: tuple[float, float, float] | list[float]  # 1/5/15-minute load when the run ended
    systems: dict[str, str]  # name -> how it was started
    levels: list[LevelResult]
    out: str  # the folder with raw samples and Locust's reports

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> BenchResults:
        data = json.loads(path.read_text())
        return cls(**{**data, "levels": [LevelResult.from_json(level) for level in data["levels"]]})

    def sweep(self, system: str) -> list[LevelResult]:
        return sorted((level for level in self.levels if level.system == system and level.label == "agent"),
                      key=lambda level: level.users)

    def mix(self, system: str) -> LevelResult | None:
        return next((level for level in self.levels if level.system == system and level.label == "mix"), None)

    def system_names(self) -> list[str]:
        return list(dict.fromkeys(level.system for level in self.levels))


def machine_description(threads: int) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory = 0.0
    versions = []
    for package in ("torch", "locust"):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return (f"{cpu}, {os.cpu_count()} CPU threads, {memory:.0f} GiB, {platform.system()} {platform.release()}; "
            f"every server limited to {threads} threads; load generator on the same machine; {', '.join(versions)}")


def llama_server_version(binary: str) -> str:
    try:
        completed = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    for line in (completed.stdout + completed.stderr).splitlines():
        if line.startswith("version"):
            return line.strip()
    return "unknown"


# ---- markdown ------------------------------------------------------------------------------------

def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _ratio(ours: float | None, peer: float | None) -> float | None:
    return ours / peer if ours is not None and peer else None


def sweep_table(results: BenchResults) -> list[str]:
    lines = ["| system | sessions | requests/s | output tok/s | TTFT p50 ms | TTFT p99 ms | TTFT p50 turns >= 2 ms "
             "| ITL p50 ms | ITL p99 ms | TPOT p50 ms | prefix hit rate | acceptance | failed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for system in results.system_names():
        for level in results.sweep(system):
            s = level.summary
            lines.append(f"| {system} | {level.users} | {s.requests_per_second:.2f} | {s.output_tokens_per_second:.1f} | "
                         f"{_ms(s.ttft_p50)} | {_ms(s.ttft_p99)} | {_ms(s.later_turn_ttft_p50)} | {_ms(s.itl_p50)} | "
                         f"{_ms(s.itl_p99)} | {_ms(s.tpot_p50)} | {_pct(s.prefix_hit_rate)} | {_pct(level.acceptance)} "
                         f"| {s.num_failed} |")
    return lines


def mix_table(results: BenchResults) -> list[str]:
    scenarios = ("agent", "ide", "rag", "chat")
    lines = ["| system | users | completed | cancelled (IDE) | failed | output tok/s | "
             + " | ".join(f"TTFT p50 {name} ms" for name in scenarios) + " |",
             "|---|---:|---:|---:|---:|---:|" + "---:|" * len(scenarios)]
    for system in results.system_names():
        level = results.mix(system)
        if level is None:
            continue
        s = level.summary
        ttfts = [_ms(level.by_scenario[name].ttft_p50) if name in level.by_scenario else "-" for name in scenarios]
        lines.append(f"| {system} | {level.users} | {s.num_completed} | {s.num_cancelled} | {s.num_failed} | "
                     f"{s.output_tokens_per_second:.1f} | " + " | ".join(ttfts) + " |")
    return lines


def goal_lines(results: BenchResults) -> list[str]:
    """The issue's goals, checked on the highest sweep level (8 sessions by default)."""
    peer = results.sweep(PEER)
    if not peer:
        return ["Goals need the llama.cpp peer in the same run: not checked."]
    peer_top = peer[-1]
    lines = [f"Goals, at {peer_top.users} concurrent agent sessions, against llama.cpp measured in the same run:", ""]
    for system in results.system_names():
        if system == PEER:
            continue
        ours = next((level for level in results.sweep(system) if level.users == peer_top.users), None)
        if ours is None:
            continue
        throughput = _ratio(ours.summary.output_tokens_per_second, peer_top.summary.output_tokens_per_second)
        ttft = _ratio(ours.summary.later_turn_ttft_p50, peer_top.summary.later_turn_ttft_p50)
        lines.append(f"- {system}: output tokens/s {ours.summary.output_tokens_per_second:.1f} vs "
                     f"{peer_top.summary.output_tokens_per_second:.1f} = **{_x(throughput)}** (goal >= 2x: "
                     f"{_met(throughput is not None and throughput >= 2)}); TTFT p50 of turns >= 2 "
                     f"{_ms(ours.summary.later_turn_ttft_p50)} ms vs {_ms(peer_top.summary.later_turn_ttft_p50)} ms = "
                     f"**{_x(ttft)}** (goal <= 0.33x: {_met(ttft is not None and ttft <= 1 / 3)})")
    for system in results.system_names():
        level = results.mix(system)
        if level is not None:
            lines.append(f"- {system}, scenario mix: {level.summary.num_failed} failed requests with "
                         f"{level.summary.num_cancelled} IDE completions cancelled mid-stream (goal: no failures: "
                         f"{_met(level.summary.num_failed == 0)})")
    return lines


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _met(condition: bool) -> str:
    return "met" if condition else "not met"


def render(results: BenchResults, docs_dir: Path) -> str:
    """The markdown section; draws the plots into docs_dir/img/."""
    images = draw_plots(results, docs_dir / "img")
    minutes = (results.finished - results.started) / 60
    one, five, fifteen = results.load_average
    lines = [
        "## Load: draftgate vs llama.cpp's server (Locust scenarios)", "",
        f"Command: `{results.command}` (what `make bench` runs; raw samples and Locust's HTML/CSV reports in "
        f"`{os.path.relpath(results.out, Path(__file__).resolve().parents[1])}`)", "",
        f"Machine: {results.machine}. Measured {time.strftime('%Y-%m-%d %H:%M', time.localtime(results.started))}, "
        f"{minutes:.0f} min; load average when it ended {one:.1f} / {five:.1f} / {fifteen:.1f} (1/5/15 min: other "
        "work on the machine makes every figure slower and noisier).", "",
        "Systems, on the same GGUF (the embedded SmolLM2-135M-Instruct, Q4_1), never two at once; level by level "
        "each system in turn, the order rotating from level to level:", "",
    ]
    lines += [f"- **{name}**: `{how}`" for name, how in results.systems.items()]
    lines += [
        "", "Workload (scenarios/locust/, closed loop, streaming): each agent session is a tool loop of 3-6 turns "
        "(48 max tokens, tool_choice required, greedy) with 0.5-1.5 s of tool time between turns; all sessions share "
        "one agent system prompt and tool list, stamped per request the way agent frameworks do (billing-header "
        "nonce, timestamp, request id, tools and JSON keys reshuffled); a fifth of the turns hand a sub-task to a "
        "subagent (its own shared prompt, 1-2 turns). Each level runs its own seed. Output tokens/s counts every "
        "token streamed within the run's window; TTFT is taken at the first output-carrying frame; ITL is the gap "
        "between output frames (one frame can carry several tokens under speculation); TPOT is a request's "
        "(last frame - first frame) / (tokens - 1); the prefix hit rate is cached / prompt tokens from each "
        "response's usage; acceptance is accepted / drafted tokens from draftgate's /metrics. Agent turns force a "
        "tool call (tool_choice required), which a grammar constrains; a constrained request's drafts are cut to "
        "what its grammar accepts and verified under one grammar mask per position.", "",
        "### Agent sessions across concurrency", "", *sweep_table(results), "",
    ]
    lines += [f"![{title}](img/{name})" for name, title in images]
    lines += ["", "### Scenario mix", "",
              "Agent sessions, IDE completions (prefix only: neither server offers FIM for this model; 30% cancelled "
              "after 1-3 tokens), RAG over 3 shared documents, chat; weights 4:3:2:1.", "", *mix_table(results), "",
              "### Goals", "", *goal_lines(results)]
    return "\n".join(lines)


def draw_plots(results: BenchResults, image_dir: Path) -> list[tuple[str, str]]:
    """The latency-throughput frontier and TTFT by agent turn; returns (file name, title) pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    image_dir.mkdir(parents=True, exist_ok=True)
    figure, (ttft_axis, tpot_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    for system in results.system_names():
        sweep = results.sweep(system)
        throughput = [level.summary.output_tokens_per_second for level in sweep]
        for axis, values in ((ttft_axis, [level.summary.ttft_p50 for level in sweep]),
                             (tpot_axis, [level.summary.tpot_p50 for level in sweep])):
            points = [(x, y * 1000, level.users) for x, y, level in zip(throughput, values, sweep) if y is not None]
            if not points:
                continue
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=system)
            for x, y, users in points:
                axis.annotate(str(users), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ttft_axis.set(xlabel="output tokens/s (all sessions)", ylabel="TTFT p50 (ms, log)", yscale="log",
                  title="TTFT vs throughput (labels: sessions)")
    tpot_axis.set(xlabel="output tokens/s (all sessions)", ylabel="time per output token p50 (ms)",
                  title="Per-token latency vs throughput")
    for axis in (ttft_axis, tpot_axis):
        axis.grid(True, alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(image_dir / FRONTIER_PNG, dpi=110)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(6.5, 4.2))
    for system in results.system_names():
        sweep = results.sweep(system)
        if not sweep or not sweep[-1].summary.ttft_by_turn:
            continue
        by_turn = sweep[-1].summary.ttft_by_turn
        axis.plot(list(by_turn), [value * 1000 for value in by_turn.values()], marker="o",
                  label=f"{system} ({sweep[-1].users} sessions)")
    axis.set(xlabel="agent turn", ylabel="TTFT median (ms, log)", yscale="log", title="TTFT by agent turn")
    axis.grid(True, alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(image_dir / TTFT_BY_TURN_PNG, dpi=110)
    plt.close(figure)
    return [(FRONTIER_PNG, "latency-throughput frontier"), (TTFT_BY_TURN_PNG, "TTFT by agent turn")]


def write_docs_section(section: str, path: Path, begin: str = DOCS_BEGIN, end: str = DOCS_END) -> None:
    """Replaces only the text between a benchmark's markers (appends them when absent); every
    scenarios/ benchmark writes its docs section through here."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{begin}\n{section}\n{end}"
    if begin in text and end in text:
        start, stop = text.index(begin), text.index(end) + len(end)
        text = text[:start] + block + text[stop:]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)
