"""Prometheus metrics under vLLM's names, so existing dashboards and autoscalers read draftgate.

Latency histograms and token counters are observed by the gateway as outputs stream through it;
queue, KV-cache and prefix-cache figures come from the engine's own statistics, fetched when
/metrics is scraped. Every app has its own registry (tests build several apps in one process).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engine.protocol import EngineStats, RequestDelta

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's buckets, so histograms line up with theirs on the same dashboard.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)


class _EngineStatsCollector(Collector):
    """Exposes the engine statistics fetched for the current scrape."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._metrics.engine_stats
        if stats is None:
            return
        labels = [self._metrics.model_name]

        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, documentation, labels=["model_name"])
            family.add_metric(labels, value)
            return family

        def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, documentation, labels=["model_name"])
            family.add_metric(labels, value)
            return family

        yield gauge("vllm:num_requests_running", "Number of requests in the engine's running batch.", stats.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting in the engine's queue.", stats.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).", stats.kv_cache_usage)
        yield counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      stats.prefix_cache_queries)
        yield counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", stats.prefix_cache_hits)
        yield counter("vllm:spec_decode_num_drafts", "Verifications of a non-empty draft.", stats.spec_num_drafts)
        yield counter("vllm:spec_decode_num_draft_tokens", "Drafted tokens verified.", stats.spec_num_draft_tokens)
        yield counter("vllm:spec_decode_num_accepted_tokens", "Drafted tokens accepted.",
                      stats.spec_num_accepted_tokens)
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Drafted tokens accepted, by position in the draft.",
                                      labels=["model_name", "position"])
        for position, accepted in enumerate(stats.spec_accepted_per_pos):
            per_pos.add_metric(labels + [str(position)], accepted)
        yield per_pos
        yield counter("draftgate:spec_decode_proposer_seconds", "Time spent proposing drafts.",
                      stats.spec_proposer_seconds)
        yield counter("draftgate:spec_decode_num_accepted_alternatives",
                      "First drafts rejected for one of the draft model's runners-up, which the target took.",
                      stats.spec_num_accepted_alternatives)
        yield gauge("draftgate:gateway_waiting_requests", "Requests admitted by the gateway, no output yet.",
                    self._metrics.gateway_waiting)
        yield gauge("draftgate:retained_sessions", "Agent sessions whose KV blocks are kept while their tool runs.",
                    stats.num_retained_sessions)
        yield gauge("draftgate:retained_kv_blocks", "KV blocks kept for agent sessions while their tools run.",
                    stats.num_retained_blocks)


class GatewayMetrics:
    def __init__(self, model_name: str = "") -> None:
        self.model_name = model_name
        self.engine_stats: EngineStats | None = None
        self.gateway_waiting = 0
        self.registry = CollectorRegistry(auto_describe=False)
        labels = ["model_name"]
        self._ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", labels,
                               buckets=_TTFT_BUCKETS, registry=self.registry)
        self._itl = Histogram("vllm:inter_token_latency_seconds", "Time between consecutive output tokens.", labels,
                              buckets=_ITL_BUCKETS, registry=self.registry)
        self._e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.", labels,
                              buckets=_E2E_BUCKETS, registry=self.registry)
        # prometheus-client appends _total: vllm:prompt_tokens_total, vllm:generation_tokens_total.
        self._prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of served requests.", labels,
                                      registry=self.registry)
        self._generation_tokens = Counter("vllm:generation_tokens", "Generated tokens.", labels, registry=self.registry)
        self._rejected = Counter("draftgate:admission_rejected", "Requests refused with 429 by admission control.",
                                 labels, registry=self.registry)
        # Prefix diagnostics (gateway/canonical/diagnostics.py), per request of a session.
        self._prefix_divergence = Counter(
            "draftgate:prefix_divergence", "Requests by the canonical segment where their prompt first departed "
            "from the session's previous request (tools, system, message, output, volatile-note, none, new-session).",
            ["model_name", "segment"], registry=self.registry)
        self._prefix_reusable_tokens = Counter(
            "draftgate:prefix_reusable_tokens", "Prompt tokens shared with the session's previous request "
            "(prefix-cache blocks).", labels, registry=self.registry)
        self._prefix_prompt_tokens = Counter(
            "draftgate:prefix_prompt_tokens", "Prompt tokens of requests given a prefix report.", labels,
            registry=self.registry)
        self._canonical_rules = Counter(
            "draftgate:canonical_rule_applied", "Requests a canonicalization rule changed, by rule.",
            ["model_name", "rule"], registry=self.registry)
        self.registry.register(_EngineStatsCollector(self))
        self._bind()

    def set_model_name(self, model_name: str) -> None:
        self.model_name = model_name
        self._bind()

    def _bind(self) -> None:
        # Labelled children resolved once: observing is then a plain method call.
        self.ttft = self._ttft.labels(self.model_name)
        self.itl = self._itl.labels(self.model_name)
        self.e2e = self._e2e.labels(self.model_name)
        self.prompt_tokens = self._prompt_tokens.labels(self.model_name)
        self.generation_tokens = self._generation_tokens.labels(self.model_name)
        self.rejected = self._rejected.labels(self.model_name)

    def observe_prefix(self, diverged_segment: str, reusable_tokens: int, prompt_tokens: int,
                       rules_applied: Iterable[str]) -> None:
        """One request's prefix report; "message[3]" counts as segment "message"."""
        self._prefix_divergence.labels(self.model_name, diverged_segment.split("[", 1)[0]).inc()
        self._prefix_reusable_tokens.labels(self.model_name).inc(reusable_tokens)
        self._prefix_prompt_tokens.labels(self.model_name).inc(prompt_tokens)
        for rule in rules_applied:
            self._canonical_rules.labels(self.model_name, rule).inc()

    def render(self, engine_stats: EngineStats | None, gateway_waiting: int) -> bytes:
        self.engine_stats = engine_stats
        self.gateway_waiting = gateway_waiting
        return generate_latest(self.registry)


class RequestTimer:
    """Observes one engine request's latencies as its deltas arrive."""

    __slots__ = ("_arrival", "_last", "_metrics")

    def __init__(self, metrics: GatewayMetrics, arrival: float) -> None:
        self._metrics = metrics
        self._arrival = arrival
        self._last: float | None = None

    def on_delta(self, delta: RequestDelta) -> bool:
        """Records one delta; True when it is the request's first output."""
        num_tokens = len(delta.new_token_ids)
        if num_tokens == 0:
            return False
        now = time.monotonic()
        metrics = self._metrics
        metrics.generation_tokens.inc(num_tokens)
        first = self._last is None
        if first:
            metrics.ttft.observe(now - self._arrival)
            num_tokens -= 1
        if num_tokens:
            # Several tokens in one delta (speculative decoding) share the step's latency.
            per_token = (now - (self._last if self._last is not None else self._arrival)) / len(delta.new_token_ids)
            for _ in range(num_tokens):
                metrics.itl.observe(per_token)
        self._last = now
        return first
