"""Prometheus exposition under vLLM's metric names."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from engine.protocol import EngineStats, RequestDelta
from gateway.metrics import GatewayMetrics, RequestTimer

VLLM_NAMES = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "vllm:prompt_tokens",
    "vllm:generation_tokens",
}


def stats(**changes) -> EngineStats:
    values = dict(num_running=2, num_waiting=1, kv_cache_usage=0.25, num_blocks=100, prefix_cache_queries=640,
                  prefix_cache_hits=320, num_preemptions=0, num_steps=10, num_prompt_tokens=320,
                  num_generation_tokens=40, last_step_seconds=0.01, mean_step_seconds=0.01)
    values.update(changes)
    return EngineStats(**values)


def samples(text: bytes) -> dict[str, float]:
    return {sample.name: sample.value for family in text_string_to_metric_families(text.decode())
            for sample in family.samples if not sample.name.endswith("_created")}


def test_all_names_are_exposed_with_engine_figures() -> None:
    metrics = GatewayMetrics("m")
    text = metrics.render(stats(), gateway_waiting=3)
    families = {family.name for family in text_string_to_metric_families(text.decode())}
    assert VLLM_NAMES <= families
    values = samples(text)
    assert values["vllm:num_requests_running"] == 2 and values["vllm:kv_cache_usage_perc"] == 0.25
    assert values["vllm:prefix_cache_hits_total"] == 320 and values["vllm:prefix_cache_queries_total"] == 640
    assert values["draftgate:gateway_waiting_requests"] == 3
    assert b'model_name="m"' in text


def test_speculation_counters_carry_the_engine_figures() -> None:
    text = GatewayMetrics("m").render(stats(spec_num_drafts=5, spec_num_draft_tokens=12, spec_num_accepted_tokens=7,
                                            spec_accepted_per_pos=[4, 2, 1], spec_num_accepted_alternatives=2), 0)
    values = samples(text)
    assert values["vllm:spec_decode_num_drafts_total"] == 5
    assert values["vllm:spec_decode_num_draft_tokens_total"] == 12
    assert values["vllm:spec_decode_num_accepted_tokens_total"] == 7
    assert values["draftgate:spec_decode_num_accepted_alternatives_total"] == 2
    per_position = {sample.labels["position"]: sample.value for family in text_string_to_metric_families(text.decode())
                    for sample in family.samples if sample.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total"}
    assert per_position == {"0": 4, "1": 2, "2": 1}


def test_without_engine_stats_the_engine_families_are_left_out() -> None:
    text = GatewayMetrics("m").render(None, 0)
    assert b"vllm:num_requests_running" not in text and b"vllm:time_to_first_token_seconds" in text


def test_request_timer_observes_ttft_itl_and_tokens() -> None:
    metrics = GatewayMetrics("m")
    timer = RequestTimer(metrics, arrival=0.0)
    assert not timer.on_delta(RequestDelta("r", new_token_ids=[]))
    assert timer.on_delta(RequestDelta("r", new_token_ids=[1]))
    assert not timer.on_delta(RequestDelta("r", new_token_ids=[2, 3]))
    values = samples(metrics.render(None, 0))
    assert values["vllm:generation_tokens_total"] == 3
    assert values["vllm:time_to_first_token_seconds_count"] == 1
    assert values["vllm:inter_token_latency_seconds_count"] == 2
