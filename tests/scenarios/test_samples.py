"""Per-request samples and the run summary the benchmark reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from scenarios.locust.samples import RequestSample, percentile, read_samples, summarize, write_samples


def _sample(scenario: str = "agent", turn: int = 1, ttft: float | None = 1.0, tokens: int = 10, **fields) -> RequestSample:
    return RequestSample(scenario=scenario, label=f"{scenario} t{turn}", turn=turn, started=100.0, ended=103.0,
                         ttft=ttft, output_tokens=tokens, **fields)


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert percentile([float(v) for v in range(101)], 0.99) == pytest.approx(99.0)


def test_summary_counts_window_throughput_and_later_turns() -> None:
    samples = [
        _sample(turn=1, ttft=2.0, tokens=20, prompt_tokens=1000, cached_tokens=0, chunk_gaps=[0.1, 0.3], tpot=0.2),
        _sample(turn=2, ttft=0.4, tokens=20, prompt_tokens=1100, cached_tokens=1000, chunk_gaps=[0.1]),
        _sample(turn=3, ttft=0.2, tokens=5, interrupted=True),  # cut by the end: its tokens still count
        _sample("subagent", turn=1, ttft=1.5, tokens=5),
        _sample("ide", ttft=0.3, tokens=2, cancelled=True),
        _sample("chat", ttft=None, tokens=0, error="HTTP 500: boom"),
    ]
    summary = summarize(samples, (100.0, 110.0))
    assert (summary.num_completed, summary.num_failed, summary.num_cancelled) == (3, 1, 1)
    assert summary.requests_per_second == pytest.approx(0.3)
    assert summary.output_tokens_per_second == pytest.approx((20 + 20 + 5 + 5 + 2) / 10)
    assert summary.ttft_p50 == pytest.approx(0.4)  # of 2.0, 0.4, 0.2, 1.5, 0.3
    assert summary.itl_p50 == pytest.approx(0.1) and summary.tpot_p50 == pytest.approx(0.2)
    assert summary.prefix_hit_rate == pytest.approx(1000 / 2100)
    assert summary.ttft_by_turn == {1: 2.0, 2: 0.4, 3: 0.2}  # the subagent's turn is not an agent turn
    assert summary.later_turn_ttft_p50 == pytest.approx(0.3)
    assert summary.errors == ["HTTP 500: boom"]
    agent = summarize(samples, (100.0, 110.0), "agent")  # agent covers its subagents
    assert agent.num_completed == 3 and agent.num_failed == 0 and agent.output_tokens_per_second == pytest.approx(5.0)


def test_samples_round_trip_through_json_lines(tmp_path: Path) -> None:
    samples = [_sample(chunk_gaps=[0.25], prompt_tokens=7, cached_tokens=3), _sample("ide", cancelled=True)]
    write_samples(tmp_path / "s.jsonl", samples, (1.5, 2.5))
    again, window = read_samples(tmp_path / "s.jsonl")
    assert again == samples and window == (1.5, 2.5)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no samples"):
        read_samples(tmp_path / "empty.jsonl")
