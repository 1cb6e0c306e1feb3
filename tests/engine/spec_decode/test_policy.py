"""The cost-aware drafting arithmetic: break-even gains, per-token counts and the fairness gate.

Numbers are a CPU-like step (40 ms for 8 requests, 1 ms per verified token) and a GPU-like one
(verification nearly free)."""

from __future__ import annotations

import pytest

from engine.spec_decode.cost_model import StepCostModel, attention_work
from engine.spec_decode.policy import TOLERANCE, Candidate, break_even_gain, plan_drafts, worth


def geometric(p: float, k: int = 4) -> list[float]:
    return [p ** j for j in range(1, k + 1)]


def test_break_even_is_plain_decodings_rate_times_the_cost() -> None:
    # 8 tokens per 40 ms: 1 ms buys 0.2 tokens of plain decoding.
    assert break_even_gain(0.040, 8, 0.001) == pytest.approx(0.2)
    assert break_even_gain(0.034, 1, 0.001) == pytest.approx(1 / 34)
    assert break_even_gain(0.0, 8, 0.001) == 0.0  # nothing measured: tokens look free


def test_worth_counts_tokens_until_one_does_not_pay() -> None:
    count, value = worth(Candidate("a", [0.9, 0.5, 0.1, 0.05], 0.001), 0.040, 8)
    assert count == 2
    assert value == pytest.approx((0.9 - 0.2) + (0.5 - 0.2))
    assert worth(Candidate("a", [0.15], 0.001), 0.040, 8) == (0, 0.0)
    assert worth(Candidate("a", [], 0.001), 0.040, 8) == (0, 0.0)


def test_alone_nearly_every_draft_pays() -> None:
    # Batch 1, 34 ms a step, 1 ms a token: break-even 0.029, so p = 0.5 drafts all four.
    assert plan_drafts([Candidate("a", geometric(0.5), 0.001)], step_seconds=0.034, batch_size=1) == {"a": 4}
    # A draft model's own cost per token counts too: 10 ms more makes break-even 0.32.
    assert plan_drafts([Candidate("a", geometric(0.5), 0.011)], step_seconds=0.034, batch_size=1) == {"a": 1}


def test_at_batch_8_on_a_cpu_only_confident_drafts_pay() -> None:
    confident = [Candidate(f"r{i}", geometric(0.96), 0.001) for i in range(8)]
    assert plan_drafts(confident, step_seconds=0.040, batch_size=8) == {f"r{i}": 4 for i in range(8)}
    # p = 0.5: 0.5 and 0.25 clear 0.2, and the least gain (0.75 tokens) pays 16 ms of 40.
    middling = [Candidate(f"r{i}", geometric(0.5), 0.001) for i in range(8)]
    assert plan_drafts(middling, step_seconds=0.040, batch_size=8) == {f"r{i}": 2 for i in range(8)}


def test_a_request_that_gains_nothing_gates_the_batch() -> None:
    # Seven confident requests and one with nothing to draft: the 28 ms they would add delay the
    # eighth for nothing, so only what fits in the tolerance is drafted (0.8 ms: not one 1 ms token).
    batch = [Candidate(f"r{i}", geometric(0.96), 0.001) for i in range(7)] + [Candidate("idle", [], 0.001)]
    assert sum(plan_drafts(batch, step_seconds=0.040, batch_size=8).values()) == 0
    # Where verification is nearly free (a GPU), the tolerance holds drafts: the best first,
    # each request's in order. 0.8 ms / 0.05 ms = 16 tokens: the first two of all seven, then the
    # third of two of them.
    cheap = [Candidate(c.req_id, c.gains, 0.00005) for c in batch]
    counts = plan_drafts(cheap, step_seconds=0.040, batch_size=8)
    assert sum(counts.values()) == int(0.040 * TOLERANCE / 0.00005)
    assert counts == {"r0": 3, "r1": 3, "r2": 2, "r3": 2, "r4": 2, "r5": 2, "r6": 2, "idle": 0}


def test_a_weak_request_gates_the_batch_too() -> None:
    # One request gains 0.3 tokens a step; the others' 29 ms would cost it 72% of a step.
    batch = [Candidate(f"r{i}", geometric(0.9), 0.001) for i in range(7)] + [Candidate("weak", [0.3], 0.001)]
    assert sum(plan_drafts(batch, step_seconds=0.040, batch_size=8).values()) == 0


def test_cost_model_fits_a_line_and_keeps_it_without_spread() -> None:
    cost = StepCostModel()
    assert cost.step_seconds(8) == 0.0 and not cost.fitted
    for n in (8, 24, 16, 40, 8, 12):
        cost.observe(n, 0.030 + 0.001 * n)
    assert cost.a == pytest.approx(0.030) and cost.b == pytest.approx(0.001)
    assert cost.step_seconds(8) == pytest.approx(0.038)
    # Then steps of one size only, slower (the machine got busy): the level follows them, and
    # once the old spread has faded the slope learned before is kept rather than lost to noise.
    for _ in range(200):
        cost.observe(8, 0.046)
    kept = cost.b
    assert kept > 0
    for _ in range(100):
        cost.observe(8, 0.046)
    assert cost.b == kept
    assert cost.step_seconds(8) == pytest.approx(0.046, rel=1e-3)


def test_cost_model_before_any_spread_says_tokens_are_free() -> None:
    cost = StepCostModel()
    for _ in range(5):
        cost.observe(8, 0.040)
    assert cost.b == 0.0 and cost.step_seconds(8) == pytest.approx(0.040)


def test_cost_model_never_learns_a_negative_slope() -> None:
    cost = StepCostModel()
    for n, t in ((8, 0.05), (16, 0.04), (8, 0.05), (16, 0.04)):
        cost.observe(n, t)
    assert cost.b == 0.0
    assert cost.a == pytest.approx(0.045, rel=0.01)  # the (recency-weighted) mean step


def test_attention_work_counts_the_keys_causal_queries_read() -> None:
    # A decode row at 100 tokens reads 100 keys; 3 rows ending at 10 read 8 + 9 + 10.
    assert attention_work([1, 3], [100, 10]) == 100 + 27


def test_cost_model_separates_tokens_from_attention() -> None:
    cost = StepCostModel()
    steps = [(8, 8 * 300), (24, 8 * 300 + 16 * 301), (8, 8 * 2000), (40, 40 * 1000), (12, 12 * 150),
             (16, 16 * 900), (9, 9 * 1800), (30, 30 * 200)]
    for n, w in steps * 3:
        cost.observe(n, 0.020 + 0.0003 * n + 2e-7 * w, w)
    assert cost.a == pytest.approx(0.020) and cost.b == pytest.approx(0.0003)
    assert cost.c == pytest.approx(2e-7)
    # A verified token at 2,000 tokens of context costs more than one at 100.
    assert cost.token_seconds(2000) == pytest.approx(0.0003 + 2e-7 * 2001)
    assert cost.token_seconds(2000) > 2 * cost.token_seconds(100)


def test_cost_model_leaves_attention_out_when_it_moves_with_the_tokens() -> None:
    cost = StepCostModel()
    for n in (8, 24, 16, 40, 8, 12) * 3:
        cost.observe(n, 0.030 + 0.001 * n, 100.0 * n)  # every token at the same context
    assert cost.c == 0.0 and cost.b == pytest.approx(0.001) and cost.a == pytest.approx(0.030)
