"""`make bench`'s report (table, goals, plots, docs section) and the driver's pure parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from scenarios import bench
from scenarios.bench_report import DOCS_BEGIN, DOCS_END, BenchResults, LevelResult, render, write_docs_section
from scenarios.locust.samples import RunSummary


def _summary(tokens_per_second: float, later_ttft: float, num_failed: int = 0, num_cancelled: int = 0) -> RunSummary:
    return RunSummary(duration_seconds=60.0, num_completed=30, num_failed=num_failed, num_cancelled=num_cancelled,
                      requests_per_second=0.5, output_tokens_per_second=tokens_per_second, ttft_p50=later_ttft * 2,
                      ttft_p99=later_ttft * 5, itl_p50=0.03, itl_p99=0.2, tpot_p50=0.04, prefix_hit_rate=0.9,
                      ttft_by_turn={1: later_ttft * 3, 2: later_ttft, 3: later_ttft * 1.1},
                      later_turn_ttft_p50=later_ttft, errors=[])


def _results(tmp_path: Path) -> BenchResults:
    levels = []
    for system, tokens, ttft in (("draftgate", 100.0, 0.2), ("llama.cpp", 40.0, 3.0)):
        for users in (1, 8):
            levels.append(LevelResult(system, "agent", users, 60, users, _summary(tokens * users / 8, ttft),
                                      {"agent": _summary(tokens, ttft)}, 0.6 if system == "draftgate" else None))
        levels.append(LevelResult(system, "mix", 8, 60, 1000, _summary(tokens, ttft, num_cancelled=7),
                                  {"ide": _summary(tokens, 0.1), "agent": _summary(tokens, ttft)}))
    return BenchResults(command="python -m scenarios.bench --write-docs", machine="test machine", started=0.0,
                        finished=600.0, load_average=[0.5, 0.4, 0.3],
                        systems={"draftgate": "draftgate serve --speculative none", "llama.cpp": "llama-server ..."},
                        levels=levels, out=str(tmp_path / "run"))


def test_report_has_the_table_the_goals_and_the_plots(tmp_path: Path) -> None:
    text = render(_results(tmp_path), tmp_path / "docs")
    assert "Command: `python -m scenarios.bench --write-docs`" in text and "Machine: test machine" in text
    assert "| draftgate | 8 | 0.50 | 100.0 | 400 | 1,000 | 200 | 30 | 200 | 40 | 90% | 60% | 0 |" in text
    assert "| llama.cpp | 1 | 0.50 | 5.0 |" in text
    # 100 vs 40 tokens/s = 2.5x; 0.2 s vs 3 s = 0.07x: both goals met; the mix had no failures.
    assert "= **2.50x** (goal >= 2x: met)" in text and "= **0.07x** (goal <= 0.33x: met)" in text
    assert "draftgate, scenario mix: 0 failed requests with 7 IDE completions cancelled" in text
    for image in ("bench_frontier.png", "bench_ttft_by_turn.png"):
        assert f"(img/{image})" in text
        assert (tmp_path / "docs" / "img" / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_goals_say_not_met_and_without_the_peer_say_so(tmp_path: Path) -> None:
    results = _results(tmp_path)
    for level in results.levels:
        if level.system == "draftgate" and level.label == "agent":
            level.summary = _summary(60.0, 1.5)
    text = render(results, tmp_path / "docs")
    assert "= **1.50x** (goal >= 2x: not met)" in text and "= **0.50x** (goal <= 0.33x: not met)" in text
    results.levels = [level for level in results.levels if level.system != "llama.cpp"]
    assert "Goals need the llama.cpp peer in the same run: not checked." in render(results, tmp_path / "docs")


def test_results_round_trip_through_json(tmp_path: Path) -> None:
    results = _results(tmp_path)
    results.save(tmp_path / "results.json")
    again = BenchResults.load(tmp_path / "results.json")
    assert again.levels == results.levels and again.sweep("draftgate")[-1].summary.ttft_by_turn[2] == 0.2


def test_write_docs_replaces_only_its_own_section(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"
    other = "<!-- offline-benchmark:begin -->\nkeep\n<!-- offline-benchmark:end -->"
    path.write_text(f"# Benchmarks\n\n{other}\n")
    write_docs_section("first", path)
    assert path.read_text() == f"# Benchmarks\n\n{other}\n\n{DOCS_BEGIN}\nfirst\n{DOCS_END}\n"
    write_docs_section("second", path)
    assert path.read_text() == f"# Benchmarks\n\n{other}\n\n{DOCS_BEGIN}\nsecond\n{DOCS_END}\n"


def test_prometheus_counters_and_acceptance() -> None:
    text = ('# HELP vllm:spec_decode_num_draft_tokens_total Drafted tokens.\n'
            'vllm:spec_decode_num_draft_tokens_total{model_name="a"} 100.0\n'
            'vllm:spec_decode_num_draft_tokens_total{model_name="b"} 20.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{model_name="a"} 90.0\n'
            'llamacpp:prompt_tokens_total 5\n')
    counters = bench.parse_counters(text)
    assert counters["vllm:spec_decode_num_draft_tokens_total"] == 120.0 and counters["llamacpp:prompt_tokens_total"] == 5
    before = {"vllm:spec_decode_num_draft_tokens_total": 20.0, "vllm:spec_decode_num_accepted_tokens_total": 30.0}
    assert bench.acceptance_rate(before, counters) == pytest.approx(60 / 100)
    assert bench.acceptance_rate({}, {}) is None


def test_systems_are_started_as_described() -> None:
    specs = bench.system_specs(["draftgate", "draftgate+spec", "llama.cpp"], 2, [], ["--cache-reuse", "256"])
    assert specs[0].server_args[:2] == ("--speculative", "none") and "--num-threads" in specs[0].server_args
    assert specs[1].server_args[:2] == ("--speculative", "hybrid")  # the default of draftgate serve
    assert specs[2].server_args == ("--cache-reuse", "256")
    with pytest.raises(ValueError, match="unknown vllm"):
        bench.system_specs(["vllm"], 2, [], [])


def test_bench_options_are_checked() -> None:
    parser = bench.build_parser()
    assert parser.parse_args(["--levels", "1,4", "--durations", "5,6"]).levels == [1, 4]
    with pytest.raises(SystemExit):
        parser.parse_args(["--levels", "0,2"])
    with pytest.raises(SystemExit, match="one value per level"):
        bench.main(["--levels", "1,2", "--durations", "5", "--systems", "draftgate"])
