"""Per-request samples of a load run and the summary a benchmark reports from them.

Every streamed request becomes one `RequestSample` (written as a JSON line by the Locust hooks);
`summarize()` turns a run's samples into the figures of docs/benchmarks.md. Throughput is
measured over the run's window: a request cut by the end of the run still counts the output
frames it received (one token each, a lower bound with speculation), so a slow system is not
flattered by dropping its unfinished work, nor a fast one by counting work after the window.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class RequestSample:
    scenario: str  # "agent", "subagent", "ide", "rag", "chat"
    label: str
    turn: int
    started: float  # wall-clock seconds (time.time()) at send
    ended: float  # at the end of the stream, the cancellation or the interruption
    ttft: float | None  # seconds to the first output-carrying frame
    chunk_gaps: list[float] = field(default_factory=list)  # seconds between output frames
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    tpot: float | None = None  # seconds per output token after the first
    cancelled: bool = False  # closed by the client on purpose (IDE keystrokes)
    interrupted: bool = False  # cut by the end of the run
    error: str | None = None

    @property
    def completed(self) -> bool:
        return self.error is None and not self.cancelled and not self.interrupted


def write_samples(path: str | Path, samples: list[RequestSample], window: tuple[float, float]) -> None:
    """One JSON object per line: the window first, then the samples."""
    with open(path, "w", encoding="utf-8") as sink:
        sink.write(json.dumps({"window": list(window)}) + "\n")
        for sample in samples:
            sink.write(json.dumps(asdict(sample)) + "\n")


def read_samples(path: str | Path) -> tuple[list[RequestSample], tuple[float, float]]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    if not lines:
        raise ValueError(f"{path} is empty: the load run wrote no samples")
    start, end = json.loads(lines[0])["window"]
    return [RequestSample(**json.loads(line)) for line in lines[1:] if line.strip()], (start, end)


def percentile(values: list[float], fraction: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class RunSummary:
    duration_seconds: float
    num_completed: int
    num_failed: int
    num_cancelled: int
    requests_per_second: float  # completed requests
    output_tokens_per_second: float  # every output token received in the window
    ttft_p50: float | None
    ttft_p99: float | None
    itl_p50: float | None  # gaps between output frames
    itl_p99: float | None
    tpot_p50: float | None
    prefix_hit_rate: float | None  # cached / prompt tokens over requests that reported both
    ttft_by_turn: dict[int, float]  # median TTFT of agent turn n (main sessions, not subagents)
    later_turn_ttft_p50: float | None  # agent turns >= 2: what prefix reuse should make cheap
    errors: list[str]


def summarize(samples: list[RequestSample], window: tuple[float, float], scenario: str | None = None) -> RunSummary:
    """Figures of one run, over all scenarios or one ("agent" also covers its subagents)."""
    if scenario is not None:
        wanted = {scenario, "subagent"} if scenario == "agent" else {scenario}
        samples = [sample for sample in samples if sample.scenario in wanted]
    duration = max(window[1] - window[0], 1e-9)
    completed = [sample for sample in samples if sample.completed]
    failed = [sample for sample in samples if sample.error is not None]
    ttfts = [sample.ttft for sample in samples if sample.ttft is not None and sample.error is None]
    gaps = [gap for sample in samples if sample.error is None for gap in sample.chunk_gaps]
    tpots = [sample.tpot for sample in completed if sample.tpot is not None]
    reported = [sample for sample in samples if sample.prompt_tokens and sample.cached_tokens is not None]
    prompt_total = sum(sample.prompt_tokens or 0 for sample in reported)
    by_turn: dict[int, list[float]] = {}
    for sample in samples:
        if sample.scenario == "agent" and sample.ttft is not None and sample.error is None:
            by_turn.setdefault(sample.turn, []).append(sample.ttft)
    return RunSummary(
        duration_seconds=duration,
        num_completed=len(completed),
        num_failed=len(failed),
        num_cancelled=sum(sample.cancelled for sample in samples),
        requests_per_second=len(completed) / duration,
        output_tokens_per_second=sum(sample.output_tokens for sample in samples if sample.error is None) / duration,
        ttft_p50=percentile(ttfts, 0.5), ttft_p99=percentile(ttfts, 0.99),
        itl_p50=percentile(gaps, 0.5), itl_p99=percentile(gaps, 0.99),
        tpot_p50=percentile(tpots, 0.5),
        prefix_hit_rate=sum(sample.cached_tokens or 0 for sample in reported) / prompt_total if prompt_total else None,
        ttft_by_turn={turn: statistics.median(values) for turn, values in sorted(by_turn.items())},
        later_turn_ttft_p50=percentile([ttft for turn, values in by_turn.items() if turn >= 2 for ttft in values], 0.5),
        errors=sorted({sample.error for sample in failed if sample.error})[:5],
    )
