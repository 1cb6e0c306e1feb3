"""The cost-aware drafting arithmetic: break-even gains, per-token counts, the draft model's
per-step and per-position price, and the fairness gate.

Numbers are a CPU-like step (40 ms for 8 requests, 1 ms per verified token) and a GPU-like one
(verification nearly free)."""

from __future__ import annotations

import pytest

from engine.spec_decode.cost_model import DraftCostModel, StepCostModel, attention_work
from engine.spec_decode.policy import TOLERANCE, Candidate, DraftRun, break_even_gain, plan_step, worth


def geometric(p: float, k: int = 4) -> list[float]:
    return [p ** j for j in range(1, k + 1)]


def plan_drafts(candidates: list[Candidate], *, standing: dict[str, float], **options) -> dict[str, int]:
    """How many tokens each candidate drafts, one proposer per request."""
    plan = plan_step([[c] for c in candidates], standing=standing, **options)
    return {req_id: count for req_id, (_, count) in plan.items()}


def paid(batch: list[Candidate], gain: float = 1.0) -> dict[str, float]:
    """Standing gains that pay for anything: the throughput break-even alone decides."""
    return {c.req_id: gain for c in batch}


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
    assert plan_drafts([Candidate("a", geometric(0.5), 0.001)], step_seconds=0.034, batch_size=1, standing={}) == {"a": 4}
    # A draft model's own cost per token counts too: 10 ms more makes break-even 0.32.
    assert plan_drafts([Candidate("a", geometric(0.5), 0.011)], step_seconds=0.034, batch_size=1, standing={}) == {"a": 1}


def test_at_batch_8_on_a_cpu_only_confident_drafts_pay() -> None:
    confident = [Candidate(f"r{i}", geometric(0.96), 0.001) for i in range(8)]
    assert plan_drafts(confident, step_seconds=0.040, batch_size=8, standing=paid(confident)) == {
        f"r{i}": 4 for i in range(8)}
    # p = 0.5: 0.5 and 0.25 clear 0.2; what the others add to a request's step (14 ms of 40)
    # fits in what two such drafts gain it a step (0.75 tokens, 30 ms).
    middling = [Candidate(f"r{i}", geometric(0.5), 0.001) for i in range(8)]
    assert plan_drafts(middling, step_seconds=0.040, batch_size=8, standing=paid(middling, 0.75)) == {
        f"r{i}": 2 for i in range(8)}


def test_a_request_that_gains_nothing_gates_the_batch() -> None:
    # Seven confident requests and one whose drafts never gained it anything: the 28 ms the seven
    # would add delay the eighth for nothing, so only what fits in the tolerance is drafted
    # (0.8 ms: not one 1 ms token).
    batch = [Candidate(f"r{i}", geometric(0.96), 0.001) for i in range(7)] + [Candidate("idle", [], 0.001)]
    standing = {**paid(batch), "idle": 0.0}
    assert sum(plan_drafts(batch, step_seconds=0.040, batch_size=8, standing=standing).values()) == 0
    # Where verification is nearly free (a GPU), the tolerance holds drafts: every request's
    # first before any second, in order. 0.8 ms / 0.05 ms = 16 tokens: the first two of all
    # seven, then the third of two of them.
    cheap = [Candidate(c.req_id, c.gains, 0.00005) for c in batch]
    counts = plan_drafts(cheap, step_seconds=0.040, batch_size=8, standing=standing)
    assert sum(counts.values()) == int(0.040 * TOLERANCE / 0.00005)
    assert counts == {"r0": 3, "r1": 3, "r2": 2, "r3": 2, "r4": 2, "r5": 2, "r6": 2, "idle": 0}


def test_a_weak_request_holds_the_batch_to_what_it_gains() -> None:
    # One request's drafts gain it 0.3 tokens a step: the others' 29 ms would cost it 72% of a
    # step, so the plan is trimmed to 40 ms * (0.3 + 0.02) = 12.8 ms: 12 tokens, every first
    # draft (the weak one's first) before any second.
    batch = [Candidate(f"r{i}", geometric(0.9), 0.001) for i in range(7)] + [Candidate("weak", [0.3], 0.001)]
    standing = {**paid(batch), "weak": 0.3}
    counts = plan_drafts(batch, step_seconds=0.040, batch_size=8, standing=standing)
    assert counts == {"r0": 2, "r1": 2, "r2": 2, "r3": 2, "r4": 1, "r5": 1, "r6": 1, "weak": 1}
    # With nothing gained, nothing but the tolerance: not one token.
    assert sum(plan_drafts(batch, step_seconds=0.040, batch_size=8, standing={**standing, "weak": 0.0}).values()) == 0


def test_a_request_pays_its_wait_with_what_its_own_drafts_gain_it() -> None:
    # A fresh batch, no standing gains yet: each of 8 confident requests drafts 4 (32 ms more of a
    # 40 ms step) and expects 3.1 tokens for them, worth 124 ms of plain decoding.
    batch = [Candidate(f"r{i}", geometric(0.9), 0.001) for i in range(8)]
    assert plan_drafts(batch, step_seconds=0.040, batch_size=8, standing={}) == {f"r{i}": 4 for i in range(8)}
    # Its own gain counts at most what its drafts realized lately: one whose drafts were all
    # rejected pays nothing with its expectation, and the tolerance buys no 1 ms token.
    rejected = batch[:7] + [Candidate("r7", geometric(0.9), 0.001, realized=0.0)]
    assert sum(plan_drafts(rejected, step_seconds=0.040, batch_size=8, standing={}).values()) == 0
    realized = batch[:7] + [Candidate("r7", geometric(0.9), 0.001, realized=2.0)]  # 80 ms
    assert plan_drafts(realized, step_seconds=0.040, batch_size=8, standing={}) == {f"r{i}": 4 for i in range(8)}
    # Alone, nobody else waits: its drafts are priced by the tokens per second they make.
    alone = [Candidate("a", geometric(0.5), 0.001, realized=0.0)]
    assert plan_drafts(alone, step_seconds=0.034, batch_size=1, standing={}) == {"a": 4}


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


def test_the_draft_models_run_sets_its_depth() -> None:
    """Alone, 40 ms a step, 1 ms per verified token: every one of p = 0.5's four drafts breaks even
    by itself (0.025), but the draft model costs 2 ms to start and 4 ms per position. Tokens per
    second by depth: 25.0 (none), 1.5 / 47 ms = 31.9, 1.75 / 52 ms = 33.7, 1.875 / 57 ms = 32.9,
    1.9375 / 62 ms = 31.3: two positions."""
    draft = Candidate("a", geometric(0.5), 0.001, "draft")
    run = DraftRun(fixed=0.002, per_depth=0.004)
    assert plan_drafts([draft], step_seconds=0.040, batch_size=1, draft_run=run, standing={}) == {"a": 2}
    assert plan_drafts([draft], step_seconds=0.040, batch_size=1, standing={}) == {"a": 4}  # a free run: all four
    # A start-up cost paid once per step drafts deeper than the same seconds charged per token:
    # 10 ms once makes four drafts pay (1.94 / 54 ms = 35.9 per second against 25.0); 10 ms per
    # token makes only the first one pay (0.5 > 11 ms / 40 ms = 0.275; 0.25 does not).
    assert plan_drafts([draft], step_seconds=0.040, batch_size=1, draft_run=DraftRun(0.010, 0.0), standing={}) == {"a": 4}
    assert plan_drafts([Candidate("a", geometric(0.5), 0.011, "draft")], step_seconds=0.040, batch_size=1, standing={}) == {"a": 1}


def test_a_draft_run_that_does_not_pay_for_the_batch_is_left_out() -> None:
    """Batch 8 on a CPU, 45 ms a step: eight requests at p = 0.4 whose tokens cost 0.3 ms each
    (break-even 0.053, so each would draft three) and a draft model at 2 ms + 5 ms per position.
    Depth 1 gains 3.2 tokens for 9.4 ms (11.2 / 54.4 ms = 206 per second against 178 for none),
    depth 2 4.48 for 16.8 ms (202), depth 3 less again: one position. At 15 ms per position no
    depth pays (11.2 / 64.4 ms = 174) and the model does not run."""
    batch = [Candidate(f"r{i}", geometric(0.4, 3), 0.0003, "draft") for i in range(8)]
    counts = plan_drafts(batch, step_seconds=0.045, batch_size=8, draft_run=DraftRun(0.002, 0.005), standing=paid(batch))
    assert counts == {f"r{i}": 1 for i in range(8)}
    counts = plan_drafts(batch, step_seconds=0.045, batch_size=8, draft_run=DraftRun(0.002, 0.015), standing=paid(batch))
    assert counts == {f"r{i}": 0 for i in range(8)}


def test_the_gate_charges_a_draft_models_run_to_the_tolerance() -> None:
    """No request has gained anything yet, so only 0.8 ms (2% of 40 ms) may be spent. Without a
    run cost the best first drafts, the draft model's 0.95 among them, fit; with one (3 ms to
    start) it does not, and the suffix tokens that fit take the budget instead."""
    batch = [[Candidate("d", [0.95], 0.0002, "draft")], [Candidate("s1", [0.9, 0.8], 0.0002)],
             [Candidate("s2", [0.9, 0.8], 0.0002)], [Candidate("idle", [], 0.0002)]]
    free = plan_step(batch, step_seconds=0.040, batch_size=8, standing={})
    assert {r: count for r, (_, count) in free.items()} == {"d": 1, "s1": 2, "s2": 1, "idle": 0}
    priced = plan_step(batch, step_seconds=0.040, batch_size=8, draft_run=DraftRun(0.003, 0.002), standing={})
    assert {r: count for r, (_, count) in priced.items()} == {"d": 0, "s1": 2, "s2": 2, "idle": 0}


def test_hybrid_plan_picks_the_proposer_per_request_under_the_run_cost() -> None:
    """Alone, 40 ms a step, 1 ms per verified token. A request with a confident suffix continuation
    and a draft model takes the suffix drafts, which need no run; one with only the draft model at
    p = 0.3 drafts when the run is cheap (2 ms + 2 ms per position: 1.3 tokens per 45 ms beats 1
    per 40) and not when it is dear (8 ms + 4 ms: 1.3 per 53 ms)."""
    both = [Candidate("s", [0.9, 0.8, 0.7, 0.6], 0.001), Candidate("s", geometric(0.5), 0.001, "draft")]
    model_only = [Candidate("m", geometric(0.3), 0.001, "draft")]
    for run in (DraftRun(0.002, 0.002), DraftRun(0.008, 0.004)):
        plan = plan_step([both], step_seconds=0.040, batch_size=1, draft_run=run, standing={})
        assert plan["s"][0].method == "suffix" and plan["s"][1] == 4
    assert plan_step([model_only], step_seconds=0.040, batch_size=1, draft_run=DraftRun(0.002, 0.002), standing={})["m"][1] >= 1
    assert plan_step([model_only], step_seconds=0.040, batch_size=1, draft_run=DraftRun(0.008, 0.004), standing={})["m"][1] == 0


def test_draft_cost_model_separates_start_depth_and_tokens() -> None:
    cost = DraftCostModel()
    assert cost.seconds(4, 4) == 0.0
    # Before the depth varies, all of a call is priced per position.
    for _ in range(3):
        cost.observe(4, 4, 0.0112)
    assert (cost.fixed, cost.per_depth, cost.per_token) == (0.0, pytest.approx(0.0028), 0.0)
    calls = [(1, 1), (4, 32), (2, 16), (4, 4), (3, 24), (1, 8), (2, 2), (3, 9)]
    for depth, tokens in calls * 3:
        cost.observe(depth, tokens, 0.002 + 0.0022 * depth + 0.0001 * tokens)
    assert cost.fixed == pytest.approx(0.002) and cost.per_depth == pytest.approx(0.0022)
    assert cost.per_token == pytest.approx(0.0001)
    assert cost.seconds(4, 32) == pytest.approx(0.002 + 0.0088 + 0.0032)
    assert cost.seconds(0, 0) == 0.0


def test_the_gate_takes_the_requests_standing_gains_not_this_steps() -> None:
    # Seven confident requests and one with nothing to draft this step, but whose drafts have
    # gained it 0.5 tokens a step: the step may cost 0.52 of a step (20.8 ms), the best 20 tokens.
    batch = [Candidate(f"r{i}", geometric(0.96), 0.001) for i in range(7)] + [Candidate("idle", [], 0.001)]
    standing = {c.req_id: 0.5 for c in batch}
    counts = plan_drafts(batch, step_seconds=0.040, batch_size=8, standing=standing)
    assert counts == {"r0": 3, "r1": 3, "r2": 3, "r3": 3, "r4": 3, "r5": 3, "r6": 2, "idle": 0}
    # One whose drafts gained it nothing holds the step to the tolerance (a request missing from
    # the standing gains counts as gaining nothing).
    assert sum(plan_drafts(batch, step_seconds=0.040, batch_size=8, standing={**standing, "idle": 0.0}).values()) == 0
    del standing["idle"]
    assert sum(plan_drafts(batch, step_seconds=0.040, batch_size=8, standing=standing).values()) == 0
    # Enough standing for everything: the throughput break-even alone decides.
    assert plan_drafts(batch, step_seconds=0.040, batch_size=8, standing={c.req_id: 1.0 for c in batch}) == {
        **{f"r{i}": 4 for i in range(7)}, "idle": 0}


def staircase(cost: StepCostModel) -> None:
    """A CPU step with a few-row kernel: 30 ms up to 8 tokens, 58 ms at 16, 300 ms for a 128-token
    prompt chunk (which flattens the fitted line)."""
    for _ in range(5):
        for n, seconds in ((1, 0.030), (4, 0.030), (8, 0.031), (16, 0.058), (128, 0.300)):
            cost.observe(n, seconds)


def test_step_table_prices_what_the_line_misses() -> None:
    cost = StepCostModel()
    staircase(cost)
    assert cost.identified and 0.0015 < cost.b < 0.0025  # the line: ~2 ms a token
    assert cost.seen(8) and not cost.seen(12)
    assert cost.table_seconds(12) == pytest.approx((0.031 + 0.058) / 2)  # between seen counts
    assert cost.table_seconds(200) is None and cost.table_seconds(0) is None  # outside them
    # 8 more tokens on a step of 8: (58 - 31) / 8 = 3.4 ms each, 1.4-1.9 ms over the line.
    assert cost.surcharge(8, 8) == pytest.approx(0.027 / 8 - cost.b)
    assert cost.surcharge(1, 3) == 0.0  # flat there: never cheaper than the line
    assert cost.surcharge(8, 0) == 0.0 and cost.surcharge(100, 50) == 0.0  # unseen end


def test_step_table_secant_between_seen_steps() -> None:
    cost = StepCostModel()
    staircase(cost)
    assert cost.secant_seconds(1, 3) == 0.0  # 1 and 4 tokens took 30 ms: verified rows were free there
    assert cost.secant_seconds(8, 8) == pytest.approx(0.027 / 8)
    assert cost.secant_seconds(4, 4) == pytest.approx(0.001 / 4)
    assert cost.secant_seconds(1, 4) is None and cost.secant_seconds(8, 4) is None  # an end not seen
    assert cost.secant_seconds(8, 0) is None


def cpu_sweep(max_rows: int = 24) -> dict[int, float]:
    """A swept CPU step: a pass over the weights per 6 rows (6 ms each) and 0.1 ms a row."""
    return {n: 0.020 + 0.006 * ((n - 1) // 6) + 0.0001 * n for n in range(1, max_rows + 1)}


def test_a_swept_table_reads_as_the_sweep_lifted_by_the_steps_seen() -> None:
    cost = StepCostModel()
    sweep = cpu_sweep()
    cost.sweep(sweep)
    assert cost.swept and not cost.seen(8)
    # Before any step is seen: the sweep itself, its stairs included.
    assert cost.table_seconds(10) == pytest.approx(sweep[10])
    assert cost.envelope(13)[11:13] == pytest.approx([sweep[12], sweep[13]])
    # A step seen at 4 rows took 2 ms more than its sweep (inputs, sampling): every swept count
    # is lifted by that much, the stairs kept.
    cost.observe(4, sweep[4] + 0.002)
    assert cost.seen(4) and cost.table_seconds(4) == pytest.approx(sweep[4] + 0.002)
    assert cost.table_seconds(13) - cost.table_seconds(12) == pytest.approx(sweep[13] - sweep[12])
    assert cost.table_seconds(20) == pytest.approx(sweep[20] + 0.002)
    # Another at 8 rows, 4 ms over: between them the gap is interpolated, beyond them the nearest one's.
    cost.observe(8, sweep[8] + 0.004)
    assert cost.table_seconds(6) == pytest.approx(sweep[6] + 0.003)
    assert cost.table_seconds(2) == pytest.approx(sweep[2] + 0.002)
    assert cost.table_seconds(12) == pytest.approx(sweep[12] + 0.004)
    # Past the sweep, the steps seen and the slope, as without one.
    cost.observe(40, 0.080)
    assert cost.table_seconds(32) == pytest.approx(sweep[24] + 0.004 + (0.080 - sweep[24] - 0.004) * 8 / 16)
    # Secants stay between steps actually seen.
    assert cost.secant_seconds(4, 4) == pytest.approx((sweep[8] + 0.004 - sweep[4] - 0.002) / 4)
    assert cost.secant_seconds(8, 4) is None


def test_the_step_table_averages_and_forgets_attention() -> None:
    cost = StepCostModel()
    for n, w in ((8, 1000), (16, 9000), (8, 4000), (40, 2000), (16, 100)) * 6:
        cost.observe(n, 0.02 + 0.001 * n + 1e-6 * w, w)
    assert cost.c == pytest.approx(1e-6, rel=1e-3)
    assert cost.table_seconds(8) == pytest.approx(0.028, rel=1e-2)  # attention taken out (with it: 0.0305)
