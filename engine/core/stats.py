"""A snapshot of the scheduler's state for metrics. A msgspec Struct because it crosses the
engine socket to the gateway's /metrics as is."""

from __future__ import annotations

import msgspec


class SchedulerStats(msgspec.Struct, frozen=True, kw_only=True):
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of KV blocks held by some request, in [0, 1]
    # Cumulative, in tokens: tokens looked up in the prefix cache at admission / found there.
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int  # cumulative
    # Cumulative speculative-decoding counters: drafts verified, and those accepted.
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_num_drafts: int = 0  # verifications of a non-empty draft
    # [i]: drafts at position i (0-based) that were accepted, cumulative.
    spec_accepted_per_pos: list[int] = msgspec.field(default_factory=list)
    spec_drafted_per_pos: list[int] = msgspec.field(default_factory=list)  # drafts that reached position i

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
