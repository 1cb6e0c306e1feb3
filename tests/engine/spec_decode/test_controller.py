"""The speculation controller: acceptance estimates, cost-priced drafting, the hybrid's choice,
probes of a request left without drafts, and the non-adaptive mode."""

from __future__ import annotations

import pytest

import engine.spec_decode.controller as controller_module
from engine.config import SpeculativeConfig
from engine.spec_decode.controller import (FIRST_EXPLORE_INTERVAL, MAX_EXPLORE_INTERVAL, MAX_FORCED_EXPLORE_INTERVAL,
                                           MAX_PROBE_INTERVAL, POOLED_PRIOR, PROBE_EVERY, PROBE_SHARE, UNTRIED_DECAY,
                                           Acceptance, SpeculationController)
from engine.spec_decode.proposer import Proposal, ProposalRequest
from engine.spec_decode.suffix import SuffixProposer

REPEATING = [5, 6, 7, 8] * 6  # the suffix proposer continues this with full confidence


def drafted_ids(proposals: dict[str, Proposal], req_id: str) -> list[int]:
    """A request's drafts (none where propose left it out: on a step the gate keeps shut, all are)."""
    return proposals.get(req_id, Proposal([])).token_ids


class CountingDraft:
    """A draft proposer that proposes token 7 and records how many tokens it was asked for, and
    which requests each call drafted for."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []
        self.calls: list[list[str]] = []

    def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]:
        self.asked += [(r.req_id, r.num_drafts) for r in requests]
        self.calls.append(sorted(r.req_id for r in requests))
        return {r.req_id: Proposal([7] * r.num_drafts) for r in requests}

    def finish(self, req_id: str, output_token_ids: list[int] | None) -> None:
        pass


def request(req_id: str, output: list[int], k: int = 4) -> ProposalRequest:
    return ProposalRequest(req_id, prompt_token_ids=[1, 2, 3], output_token_ids=output, num_drafts=k)


def controller(method: str, *, a: float = 0.030, b: float = 0.001, draft_seconds: float = 0.0,
               draft_fixed: float = 0.0, draft_per_depth: float = 0.0,
               adaptive: bool = True, draft_class: type[CountingDraft] = CountingDraft,
               ) -> tuple[SpeculationController, CountingDraft]:
    """A controller whose cost model has seen CPU-like steps, a + b * tokens, and draft-model
    calls that cost draft_fixed + draft_per_depth * depth + draft_seconds * tokens."""
    draft = draft_class()
    suffix = SuffixProposer() if method in ("suffix", "hybrid") else None
    config = SpeculativeConfig(method=method, num_speculative_tokens=4, adaptive=adaptive)
    spec = SpeculationController(config, suffix=suffix, draft=draft if method != "suffix" else None)
    observe_cpu_steps(spec, a, b)
    for depth, tokens in ((1, 1), (4, 4), (2, 16), (4, 32), (3, 3), (1, 8)):
        spec.draft_cost.observe(depth, tokens, draft_fixed + draft_per_depth * depth + draft_seconds * tokens)
    return spec, draft


def observe_cpu_steps(spec: SpeculationController, a: float = 0.030, b: float = 0.001) -> None:
    """Target steps of a + b * tokens seconds, at batch sizes spread enough to fit b, then at
    every token count up to 48 (the steps seen, by which plans are priced again: a line here)."""
    for n in (1, 8, 24, 8, 40, 16):
        spec.observe_step(n, a + b * n)
    for n in range(1, 49):
        spec.observe_step(n, a + b * n)


class SteadyClock:
    """The controller's perf_counter in these tests: a microsecond a call. What it times (its
    own proposing, which the fairness gate prices, and a draft model's runs, which the draft cost
    model fits) is then the same on any machine: on a loaded 2-core machine the real clock made
    the pure-Python proposing of 8 requests cost more than a verified token, which shut the gate
    and failed 2-4 of these tests a run."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1e-6
        return self.now


@pytest.fixture(autouse=True)
def steady_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_module, "time", SteadyClock())


@pytest.fixture
def unbudgeted_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe steps every PROBE_EVERY whatever they cost: for the tests of what probes do (the
    budget that spaces them out is tested on its own)."""
    monkeypatch.setattr(controller_module, "PROBE_SHARE", float("inf"))


def test_acceptance_counts_only_tried_drafts() -> None:
    estimate = Acceptance(0.0, 0.0)
    estimate.update(4, 2, decay=1.0)  # two accepted, the third tried and rejected, the fourth untried
    assert (estimate.accepted, estimate.trials) == (2, 3)
    estimate.update(4, 4, decay=0.5)  # all four accepted: four trials, no failure
    assert (estimate.accepted, estimate.trials) == (5, 5.5)


def test_acceptance_counts_first_drafts_apart() -> None:
    estimate = Acceptance(0.0, 0.0)
    estimate.update(4, 2, decay=1.0)  # the first accepted; of the later ones the 2nd accepted, the 3rd not
    assert (estimate.first_accepted, estimate.first_trials) == (1, 1)
    assert (estimate.continued_accepted, estimate.continued_trials) == (1, 2)
    estimate.update(4, 0, decay=0.5)  # the first rejected: no later one was tried
    assert (estimate.first_accepted, estimate.first_trials) == (0.5, 1.5)
    assert (estimate.continued_accepted, estimate.continued_trials) == (0.5, 1.0)


def test_all_or_nothing_suffix_drafts_gain_their_first_rate_at_every_depth() -> None:
    """Drafts accepted whole or rejected at once, half the time each: one rate would say p = 0.8
    (8 accepted of 10 tried per pair), gains 0.8, 0.64, 0.51, 0.41; the first is in fact taken
    half the time and, once it is, every later one is."""
    spec, _ = controller("suffix")
    for i in range(60):
        spec.propose([request("a", REPEATING)], batch_size=1)
        spec.record("a", 4, 4 if i % 2 else 0)
    first, continued = spec.rates("a", "suffix")
    assert first == pytest.approx(0.5, abs=0.1) and continued > 0.95
    assert spec.acceptance("a", "suffix") == pytest.approx(0.8, abs=0.1)


def test_a_new_request_starts_from_the_pooled_estimate() -> None:
    spec, _ = controller("draft")
    assert spec.acceptance("a", "draft") == 0.5
    for _ in range(30):
        spec.propose([request("a", [9])], batch_size=1)
        spec.record("a", 1, 1)
    assert spec.acceptance("a", "draft") > 0.95
    assert spec.acceptance("b", "draft") > 0.9  # pooled over requests: a newcomer expects the same


def test_a_few_rejections_move_a_request_toward_zero_but_the_pool_holds_it() -> None:
    """A request's estimate is its own decaying counts plus PRIOR_TRIALS trials at the pooled
    rate, which never decay: three rejections in a row lower it, they do not switch it off
    (they barely predict the next draft's fate); a long run of them takes it to 8 / 13 of the
    pooled rate (its own counts weigh at most 1 / (1 - 0.8) = 5 trials)."""
    spec, _ = controller("draft")
    for _ in range(30):  # another request: the pool learns that drafts pass
        spec.propose([request("b", [9])], batch_size=1)
        spec.record("b", 1, 1)
    for _ in range(3):
        spec.propose([request("a", [9])], batch_size=1)
        spec.record("a", 1, 0)
    pooled = spec._pooled["draft"].p
    assert 0.5 < spec.acceptance("a", "draft") < pooled
    for _ in range(30):
        spec.record("a", 1, 0)
    assert spec.acceptance("a", "draft") == pytest.approx(spec._pooled["draft"].p * 8 / 13, rel=0.01)


def test_alone_suffix_drafts_the_full_k() -> None:
    spec, _ = controller("suffix")
    proposals = spec.propose([request("a", REPEATING)], batch_size=1)
    assert drafted_ids(proposals, "a") == [5, 6, 7, 8]



def test_alone_a_plan_stops_before_the_stair_of_the_step_table() -> None:
    from engine.spec_decode.policy import Candidate, DraftRun, plan_step
    gains = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    candidate = Candidate("a", gains, token_seconds=0.001)
    run = DraftRun(0.0, 0.0)
    # A CPU's staircase: 1-6 rows 20 ms, then a second pass over the weights, 27 ms up to 12.
    spec, _ = controller("suffix")
    spec.cost = controller_module.StepCostModel()
    for _ in range(3):
        for n in range(1, 13):
            spec.observe_step(n, 0.020 if n <= 6 else 0.027)
    # The slope (~1 ms a token) breaks even at a gain of 0.05: all nine.
    slope_plan = plan_step([[candidate]], step_seconds=0.020, batch_size=1, draft_run=run, standing={})
    assert slope_plan["a"][1] == 9
    # By the table: 5 drafts (6 rows) make (1 + 3.5) / 20 ms, 9 (10 rows) (1 + 4.5) / 27 ms.
    assert spec._plan_alone([candidate], context=10, run=run)["a"][1] == 5
    # Where every row costs the same (a GPU at small batch), all nine.
    spec.cost = controller_module.StepCostModel()
    for _ in range(3):
        for n in range(1, 13):
            spec.observe_step(n, 0.020)
    assert spec._plan_alone([candidate], context=10, run=run)["a"][1] == 9
    # And nothing is drafted where no draft pays for its row (10 ms: a gain of 0.1 pays 2 ms).
    for _ in range(30):
        for n in range(2, 13):
            spec.observe_step(n, 0.030)
    assert spec._plan_alone([Candidate("a", [0.1, 0.05], 0.001)], context=10, run=run)["a"][1] == 0


def swept(spec: SpeculationController, rows_after_stair: float = 0.0001) -> dict[int, float]:
    """Gives the controller a swept CPU step (a pass over the weights per 6 rows, 6 ms each, and
    rows_after_stair a row) and steps seen at it, so its line is fitted; returns the sweep."""
    sweep = {n: 0.020 + 0.006 * ((n - 1) // 6) + rows_after_stair * n for n in range(1, 33)}
    spec.cost = controller_module.StepCostModel()
    spec.cost.sweep(sweep)
    for n in (1, 8, 16, 8, 24, 8):
        spec.observe_step(n, sweep[n])
    return sweep


def test_in_a_batch_a_swept_step_drafts_into_the_rows_its_stair_leaves_free() -> None:
    from engine.spec_decode.policy import Candidate, DraftRun
    spec, _ = controller("suffix")
    swept(spec)
    firsts = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
    options = [[Candidate(f"r{i}", [g, g / 2], token_seconds=spec.cost.b)] for i, g in enumerate(firsts)]
    # The slope (a row's average, ~1 ms) breaks even at a gain of 0.3 a token: the line's plan
    # drafts 6 tokens, 14 rows, past the stair at 12.
    assert spec.cost.b > 0.0008
    # By the table, rows 9-12 cost 0.1 ms each and the 13th 6 ms: the four best first drafts,
    # 0.4 ms in all, within what the tolerance lets a request that gains nothing wait (2% of 27 ms).
    plan = spec._plan_batch(options, [10] * 8, {}, DraftRun(0.0, 0.0))
    assert {req_id: count for req_id, (_, count) in plan.items()} == {
        "r0": 1, "r1": 1, "r2": 1, "r3": 1, "r4": 0, "r5": 0, "r6": 0, "r7": 0}


def test_in_a_batch_the_others_rows_are_paid_by_a_requests_standing_gain() -> None:
    from engine.spec_decode.policy import Candidate, DraftRun
    spec, _ = controller("suffix")
    swept(spec, rows_after_stair=0.001)  # rows 9-12 cost 1 ms each: more than 2% of a step
    # Four requests have drafts; the other four have nothing to draft, so nothing to gain.
    options = [[Candidate(f"r{i}", [0.9, 0.9] if i < 4 else [], token_seconds=spec.cost.b)] for i in range(8)]
    plan = spec._plan_batch(options, [10] * 8, {}, DraftRun(0.0, 0.0))
    assert sum(count for _, count in plan.values()) == 0
    # Gaining 0.07 tokens a step of 34 ms, a request may wait 2.4 ms + the tolerance's 0.7 for
    # the others' rows: three of them.
    plan = spec._plan_batch(options, [10] * 8, {f"r{i}": 0.07 for i in range(8)}, DraftRun(0.0, 0.0))
    assert sum(count for _, count in plan.values()) == 3


def test_in_a_batch_a_request_that_drafts_pays_its_wait_with_its_own_expected_gain() -> None:
    """A request that makes 1 + g tokens in a step of plain + extra seconds is not slower while
    extra <= g * plain: with no standing gain yet (a fresh batch), every request drafting
    confidently may still draft. (The rule before counted only standing gains against the others'
    rows, so no batch drafted until some had gained: at 8 agent streams the draft model alone
    started in some rounds and not in others, 57-61 steps against 107.)"""
    from engine.spec_decode.policy import Candidate, DraftRun
    spec, _ = controller("suffix")
    swept(spec, rows_after_stair=0.001)
    options = [[Candidate(f"r{i}", [0.9, 0.9], token_seconds=spec.cost.b)] for i in range(8)]
    # 16 drafts: a step of 24 rows, 62 ms for 8 + 14.4 tokens, where 8 rows make 8 in 34 ms; each
    # request waits 28 ms more for its 1.8 expected tokens (61 ms of plain decoding).
    plan = spec._plan_batch(options, [10] * 8, {}, DraftRun(0.0, 0.0))
    assert {req_id: count for req_id, (_, count) in plan.items()} == {f"r{i}": 2 for i in range(8)}
    # One request's only draft gains 0.05: it pays 1.7 ms at most, and comes last (tokens are
    # taken best first), after the others' rows; before it, the tolerance's 0.7 ms buys no row.
    options[7] = [Candidate("r7", [0.05], token_seconds=spec.cost.b)]
    plan = spec._plan_batch(options, [10] * 8, {}, DraftRun(0.0, 0.0))
    assert sum(count for _, count in plan.values()) == 0


def test_in_a_batch_a_swept_controller_proposes_while_drafts_gain_and_else_explores() -> None:
    def run(accepted: bool, steps: int = 7) -> list[bool]:
        """Which steps proposed (ran the suffix proposer), drafts all accepted or all rejected."""
        spec, _ = controller("suffix")
        swept(spec)
        requests = [request(f"r{i}", REPEATING) for i in range(8)]
        proposing: list[bool] = []
        propose = spec.suffix.propose

        def counted(*args, **kwargs):
            proposing[-1] = True
            return propose(*args, **kwargs)

        spec.suffix.propose = counted
        for _ in range(steps):
            proposing.append(False)
            for req_id, proposal in spec.propose(requests, batch_size=8).items():
                drafted = len(proposal.token_ids)
                spec.record(req_id, drafted, drafted if accepted else 0)
        return proposing

    # Drafts the target takes: every step proposes.
    assert all(run(accepted=True))
    # Nothing gained: proposing (here a few microseconds) pays nothing, so after the first step
    # it runs once every explore_every steps (2 at this price), to measure again.
    assert run(accepted=False) == [True, False, True, False, True, False, True]
    # Where no plain step is priced yet (a line all attention, read without any), it proposes.
    spec, _ = controller("suffix")
    swept(spec)
    spec._proposing_cost = 1.0
    assert not spec._proposing_does_not_pay(0.0) and spec._proposing_does_not_pay(0.030)


def test_in_a_batch_a_swept_controller_explores_sooner_while_its_account_is_young() -> None:
    """Nothing gained, exploring priced dear (every MAX_EXPLORE_INTERVAL steps by its cost):
    after the first step it explores FIRST_EXPLORE_INTERVAL steps after shutting, then after
    twice as many each time; probe steps (every PROBE_EVERY) do not open it. Every exploring step
    here finds the plan empty and drafts one token all the same, so the interval doubles up to
    MAX_FORCED_EXPLORE_INTERVAL (test_an_exploring_step_whose_plan_drafts_keeps_the_shorter_cap)."""
    spec, _ = controller("suffix")
    swept(spec)
    spec._explore_seconds = 1.0  # an exploring step's measured cost: far past EXPLORE_SHARE
    requests = [request(f"r{i}", REPEATING) for i in range(8)]
    proposing: list[int] = []
    propose = spec.suffix.propose

    def counted(*args, **kwargs):
        proposing.append(step)
        return propose(*args, **kwargs)

    spec.suffix.propose = counted
    for step in range(300):
        for req_id, proposal in spec.propose(requests, batch_size=8).items():
            spec.record(req_id, len(proposal.token_ids), 0)
    first = FIRST_EXPLORE_INTERVAL
    assert (first, MAX_EXPLORE_INTERVAL, MAX_FORCED_EXPLORE_INTERVAL) == (4, 32, 128) and PROBE_EVERY == 16
    assert proposing == [0, 4, 12, 28, 60, 124, 252]
    assert spec._explore_forced
    # Once its drafts pay, the interval starts over.
    spec._proposing_paid = spec._proposing_cost + 1.0
    assert not spec._proposing_does_not_pay(0.030) and spec._explore_interval == first


def test_an_exploring_step_whose_plan_drafts_keeps_the_shorter_cap() -> None:
    """The interval doubles up to MAX_EXPLORE_INTERVAL after an exploring step whose plan drafted
    of its own, and up to MAX_FORCED_EXPLORE_INTERVAL after one that only drafted its likeliest
    first token (which cannot pay the account back: the cap's comment)."""
    spec, _ = controller("suffix")
    swept(spec)
    spec._explore_seconds = 1.0
    spec._proposing_cost, spec._proposing_paid = 1.0, 0.0  # unpaid: the gate is shut

    def steps_to_next_exploring_step() -> int:
        skipped = 1
        while spec._proposing_does_not_pay(0.030):
            skipped += 1
        spec._shut_steps = 0  # (what propose does on the exploring step)
        return skipped

    spec._explore_interval = MAX_EXPLORE_INTERVAL
    spec._explore_forced = False
    assert [steps_to_next_exploring_step() for _ in range(3)] == [32, 32, 32]
    spec._explore_forced = True
    assert [steps_to_next_exploring_step() for _ in range(4)] == [32, 64, 128, 128]
    spec._explore_forced = False  # the cap applies at once
    assert steps_to_next_exploring_step() == 32


def test_in_a_batch_an_exploring_step_the_plan_leaves_empty_drafts_its_likeliest_first_token() -> None:
    """12 rows fill two of the sweep's 6-row passes, so the 13th row costs a third one (6 ms, for
    a first draft worth at most a twelfth of a 32 ms step): the plan drafts nothing. An exploring
    step drafts the likeliest first draft all the same, one token, so that it measures something."""
    spec, _ = controller("suffix")
    swept(spec)
    requests = [request(f"r{i}", REPEATING) for i in range(12)]
    suffix = {r.req_id: Proposal([5, 6], None, 0.4, [0.3 - 0.02 * i, 0.1]) for i, r in enumerate(requests)}
    suffix["r0"] = Proposal([5, 6], None, 0.3, [0.2, 0.1])  # r1's first draft is the likeliest
    step = spec._plain_step_seconds(float(len(REPEATING) + 3), 12)
    args = (requests, suffix, 12, step, {}, {r.req_id: 0.0 for r in requests}, PROBE_EVERY)
    assert all(count == 0 for _, count in spec._plan(*args).values())
    explored = spec._plan(*args, exploring=True)
    assert explored.pop("r1") == ("suffix", 1) and all(count == 0 for _, count in explored.values())


def test_draft_model_length_follows_its_cost() -> None:
    # Alone, 31 ms a step: break-even gain (1 ms + the draft's own 10 ms) / 31 ms = 0.35, so a
    # prior of p = 0.5 drafts one token (0.5), not two (0.25).
    spec, draft = controller("draft", draft_seconds=0.010)
    spec.propose([request("a", [9])], batch_size=1)
    assert draft.asked[-1] == ("a", 1)
    # A free draft drafts all four: break-even 1 ms / 31 ms = 0.032 < 0.5^4.
    spec, draft = controller("draft", draft_seconds=0.0)
    spec.propose([request("a", [9])], batch_size=1)
    assert draft.asked[-1] == ("a", 4)


@pytest.mark.usefixtures("unbudgeted_probes")
def test_at_batch_8_one_request_without_drafts_gates_the_others() -> None:
    """A request with nothing to draft, and no drafts that ever paid, gates the batch; once the
    others' drafts have paid, they draft alone."""
    spec, _ = controller("suffix")
    seven = [f"r{i}" for i in range(7)]
    batch = [request(name, REPEATING) for name in seven] + [request("new", [40, 41, 42])]
    proposals = spec.propose(batch, batch_size=8)
    assert all(not drafted_ids(proposals, r.req_id) for r in batch)
    drafted = run_batch(spec, seven, 3 * PROBE_EVERY)
    assert drafted[-1] == 7 * 4
    for name in seven:  # (the new request's standing fades: it shares no step with them)
        spec.finish(name, None)
    spec, _ = controller("suffix")
    run_batch(spec, seven, 3 * PROBE_EVERY)
    assert run_batch(spec, seven, 1) == [28]
    drafted = []
    for _ in range(5 * PROBE_EVERY):  # the eighth joins and never has anything to draft
        batch = [request(name, REPEATING) for name in seven] + [request("new", [40, 41, 42])]
        proposals = spec.propose(batch, batch_size=8)
        for name in seven:
            spec.record(name, len(drafted_ids(proposals, name)), len(drafted_ids(proposals, name)))
        drafted.append(sum(len(p.token_ids) for p in proposals.values()))
    # It starts from the seven's rate, which fades: then hardly a token a step where they drafted 28.
    assert drafted[0] == 28 and sum(drafted[-PROBE_EVERY:]) <= PROBE_EVERY


def run_batch(spec: SpeculationController, names: list[str], steps: int, rejecting: str | None = None) -> list[int]:
    """Steps of a batch that all continue REPEATING; every draft is accepted except the rejecting
    request's. Tokens drafted per step."""
    drafted = []
    for _ in range(steps):
        proposals = spec.propose([request(name, REPEATING) for name in names], batch_size=len(names))
        drafted.append(sum(len(p.token_ids) for p in proposals.values()))
        for name in names:
            count = len(drafted_ids(proposals, name))
            spec.record(name, count, 0 if name == rejecting else count)
    return drafted


@pytest.mark.usefixtures("unbudgeted_probes")
def test_the_gate_opens_as_every_requests_drafts_pay_and_stays_shut_for_one_that_gains_nothing() -> None:
    """At batch 8 on a CPU-like step a token costs 1 ms of 38: nothing fits in the tolerance, so
    the gate stays shut until the probe step. There every request drafts two, each paying its wait
    with its own expected gain; as the accepted drafts raise every standing gain the gate opens to
    all four drafts each. One request whose drafts are all rejected keeps its standing at nothing,
    and its rejections cap what its own gain may pay (Candidate.realized): the others get nothing
    but probes."""
    names = [f"r{i}" for i in range(8)]
    spec, _ = controller("suffix")
    drafted = run_batch(spec, names, 4 * PROBE_EVERY)
    assert drafted[: PROBE_EVERY - 1] == [0] * (PROBE_EVERY - 1) and drafted[PROBE_EVERY - 1] == 16
    assert drafted[-PROBE_EVERY:] == [32] * PROBE_EVERY
    spec, _ = controller("suffix")
    drafted = run_batch(spec, names, 4 * PROBE_EVERY, rejecting="r7")
    # Its standing starts from the others' rate (what requests gain), which fades: after that,
    # nothing but the probes. (Below 1 ms a step, a verified token's price, by the third probe
    # step; before it, how long its budget bought one token depends on the proposing measured.)
    probe_steps = [step for step, count in enumerate(drafted) if count and step >= 3 * PROBE_EVERY - 1]
    assert probe_steps and all((step + 1) % PROBE_EVERY == 0 for step in probe_steps)
    assert max(drafted[3 * PROBE_EVERY - 1:]) == 8
    # While the gate is shut the proposer does not even run, but on the probe steps.
    calls = []
    real_propose = spec.suffix.propose
    spec.suffix.propose = lambda requests, *cap: calls.append(len(requests)) or real_propose(requests, *cap)
    drafted = run_batch(spec, names, 2 * PROBE_EVERY, rejecting="r7")
    assert len([count for count in drafted if count]) == 2 and calls == [8, 8]


@pytest.mark.usefixtures("unbudgeted_probes")
def test_a_new_request_starts_from_the_pooled_standing_gain() -> None:
    """Requests that come after well-paying ones start with their standing gain and draft from
    their first step; without such a history a new batch starts gated."""
    names = [f"r{i}" for i in range(8)]
    spec, _ = controller("suffix")
    run_batch(spec, names, 4 * PROBE_EVERY)
    for name in names:
        spec.finish(name, None)
    assert run_batch(spec, [f"n{i}" for i in range(8)], 1) == [32]


def test_a_failing_draft_model_switches_off_and_probes() -> None:
    spec, draft = controller("draft")
    for _ in range(20):
        spec.propose([request("a", [9])], batch_size=8)
        spec.record("a", 1, 0)
    assert spec.acceptance("a", "draft") < 0.05
    draft.asked.clear()
    drafted = [len(drafted_ids(spec.propose([request("a", [9])], batch_size=8), "a")) for _ in range(2 * PROBE_EVERY)]
    assert drafted.count(1) == 2 and sum(drafted) == 2  # one single-token probe every PROBE_EVERY steps
    assert len(draft.asked) == 2  # and the draft model ran for nothing else
    # Probes that succeed bring the drafts back.
    for _ in range(10):
        spec.record("a", 1, 1)
    assert len(drafted_ids(spec.propose([request("a", [9])], batch_size=1), "a")) >= 1


def draft_model_clock(spec: SpeculationController, draft: CountingDraft, names: list[str], steps: int,
                      back_off: bool = True) -> list[int]:
    """Steps of a batch at batch size 8 whose drafts are all rejected: the planned steps on which
    the draft model ran. back_off=False: rejected probes do not lengthen the requests' intervals."""
    clock = []
    for _ in range(steps):
        calls = len(draft.calls)
        proposals = spec.propose([request(name, [9]) for name in names], batch_size=8)
        if len(draft.calls) > calls:
            clock.append(spec._planned_steps)
        for name in names:
            spec.record(name, len(drafted_ids(proposals, name)), 0)
            if not back_off:
                spec._probe_interval.pop(name, None)
    return clock


@pytest.mark.usefixtures("unbudgeted_probes")
def test_idle_requests_probe_in_the_same_steps() -> None:
    """Requests switched off at different times, and backed off to different probe intervals,
    probe together: the draft model starts once per probe step, not once per request."""
    spec, draft = controller("draft")
    names = [f"r{i}" for i in range(4)]
    for i, name in enumerate(names):  # each fails a different number of times
        for _ in range(20 + 3 * i):
            spec.propose([request(name, [9])], batch_size=8)
            spec.record(name, 1, 0)
    assert spec._probe_interval.get("r0", PROBE_EVERY) < spec._probe_interval["r3"]  # r3 probed alone already
    draft.calls.clear()
    probe_clock = draft_model_clock(spec, draft, names, 20 * PROBE_EVERY)
    assert all(step % PROBE_EVERY == 0 for step in probe_clock)
    # The shorter intervals catch up with the longer ones on a shared step; from then on one
    # draft-model start probes all four, at their backed-off intervals.
    assert len(draft.calls) >= 4 and all(call == names for call in draft.calls[1:])
    assert [b - a for a, b in zip(probe_clock[1:], probe_clock[2:])][-1] == MAX_PROBE_INTERVAL


def test_rejected_probes_back_off_and_an_accepted_one_resets() -> None:
    spec, _ = controller("draft")
    for _ in range(20):
        spec.propose([request("a", [9])], batch_size=8)
        spec.record("a", 1, 0)
    probe_clock = []
    for _ in range(60 * PROBE_EVERY):
        drafted = len(drafted_ids(spec.propose([request("a", [9])], batch_size=8), "a"))
        if drafted:
            probe_clock.append(spec._planned_steps)
        spec.record("a", drafted, 1 if drafted and len(probe_clock) == 7 else 0)  # only the 7th is accepted
    assert MAX_PROBE_INTERVAL == 8 * PROBE_EVERY
    # Each rejection doubles the interval: the k-th probe falls on a multiple of it.
    intervals = [PROBE_EVERY, 2 * PROBE_EVERY, 4 * PROBE_EVERY] + [MAX_PROBE_INTERVAL] * 4
    assert all(step % interval == 0 for step, interval in zip(probe_clock, intervals))
    gaps = [b - a for a, b in zip(probe_clock, probe_clock[1:])]
    assert gaps[3:6] == [MAX_PROBE_INTERVAL] * 3
    assert gaps[6] == PROBE_EVERY  # the 7th was accepted: back to PROBE_EVERY


def test_probe_steps_are_spaced_out_to_their_budget() -> None:
    """Probe steps come PROBE_EVERY steps apart while a probe step costs at most PROBE_SHARE of
    the plain steps between two; dearer ones are spaced out by powers of 2."""
    def probe_clock(num_requests: int, draft_fixed: float) -> list[int]:
        spec, draft = controller("draft", draft_fixed=draft_fixed)
        names = [f"r{i}" for i in range(num_requests)]
        for _ in range(20):  # their drafts all fail: no plan drafts for them, only probes
            spec.propose([request(name, [9]) for name in names], batch_size=8)
            for name in names:
                spec.record(name, 1, 0)
        return draft_model_clock(spec, draft, names, 16 * PROBE_EVERY, back_off=False)

    # A plain step at batch 8: 30 + 8 ms. One request probing costs 1 ms of a budget of
    # 0.005 * 16 * 38 = 3.0 ms: every PROBE_EVERY steps.
    assert PROBE_SHARE == 0.005
    cheap = probe_clock(1, 0.0)
    assert len(cheap) >= 15 and all(b - a == PROBE_EVERY for a, b in zip(cheap, cheap[1:]))
    # Eight probing cost 8 ms and the draft model's start 4 ms more: 12 ms, over the budget of
    # 16 and of 32 steps (6.1 ms), within that of 64 (12.2 ms).
    dear = probe_clock(8, 0.004)
    assert len(dear) >= 3 and all(b - a == 4 * PROBE_EVERY for a, b in zip(dear, dear[1:]))
    assert all(step % (4 * PROBE_EVERY) == 0 for step in dear)


def test_an_untried_low_suffix_rate_returns_toward_the_prior() -> None:
    """A pooled suffix rate set low by early rejections moves back toward the prior on the plans
    that do not try it, the first draft's and the later drafts' each on its own; one tried on
    every plan, or above the prior, stays where its verifications put it."""
    spec, _ = controller("hybrid")
    for _ in range(10):  # suffix drafts of 2 whose first is always rejected
        spec._method["a"] = "suffix"
        spec.record("a", 2, 0)
    pooled = spec._pooled["suffix"]
    first_before, continued_before = pooled.first_p, pooled.continued_p
    assert first_before < 0.1 and continued_before == pytest.approx(0.5)  # no later draft tried
    spec._age_untried()  # the plan after those verifications: they tried the first draft
    assert pooled.first_p == first_before
    counts = (pooled.first_accepted, pooled.first_trials)
    for _ in range(25):
        spec._age_untried()
    # The counts move by UNTRIED_DECAY a plan toward the prior's.
    decay = UNTRIED_DECAY ** 25
    accepted = decay * counts[0] + (1 - decay) * POOLED_PRIOR.first_accepted
    trials = decay * counts[1] + (1 - decay) * POOLED_PRIOR.first_trials
    assert pooled.first_p == pytest.approx(accepted / trials)
    assert first_before < pooled.first_p < POOLED_PRIOR.first_p
    assert pooled.continued_p == pytest.approx(0.5)
    for _ in range(400):
        spec._age_untried()
    assert pooled.first_p == pytest.approx(POOLED_PRIOR.first_p, abs=1e-3)

    high, _ = controller("hybrid")
    for _ in range(10):  # drafts of 3, all accepted
        high._method["a"] = "suffix"
        high.record("a", 3, 3)
    estimate = high._pooled["suffix"]
    rates = (estimate.first_p, estimate.continued_p)
    for _ in range(100):
        high._age_untried()
    assert (estimate.first_p, estimate.continued_p) == rates


def test_hybrid_takes_confident_suffix_drafts_over_an_average_draft_model() -> None:
    spec, draft = controller("hybrid", draft_seconds=0.005)
    proposals = spec.propose([request("a", REPEATING)], batch_size=1)
    assert drafted_ids(proposals, "a") == [5, 6, 7, 8] and not draft.asked
    # Nothing to continue from: the draft model drafts.
    proposals = spec.propose([request("b", [40, 41, 42])], batch_size=1)
    assert draft.asked == [("b", drafted_ids(proposals, "b").__len__())] and drafted_ids(proposals, "b")


def test_not_adaptive_always_drafts_k() -> None:
    spec, draft = controller("draft", adaptive=False)
    for _ in range(5):
        spec.propose([request("a", [9])], batch_size=32)
        spec.record("a", 4, 0)
    assert all(k == 4 for _, k in draft.asked)


@pytest.mark.parametrize("method", ["suffix", "hybrid"])
def test_num_drafts_is_what_was_drafted(method: str) -> None:
    spec, _ = controller(method)
    requests = [request("a", REPEATING), request("b", [40, 41, 42])]
    proposals = spec.propose(requests, batch_size=1)
    for r in requests:
        assert len(drafted_ids(proposals, r.req_id)) <= r.num_drafts


def test_reset_forgets_what_earlier_requests_taught() -> None:
    spec, draft = controller("hybrid", draft_seconds=0.002)
    for _ in range(20):  # a poor draft: its pooled estimate falls
        spec.propose([request("a", [9])], batch_size=1)
        spec.record("a", 1, 0)
    with pytest.raises(RuntimeError, match="requests are running"):
        spec.reset()
    spec.finish("a", REPEATING)  # its output joins the global suffix index
    assert spec.acceptance("b", "draft") < 0.3
    assert spec.suffix.propose([request("c", [5, 6, 7])])["c"].token_ids  # found in "a"'s output
    assert spec.cost.b > 0 and spec.draft_cost.per_token > 0
    spec.finish("b", None)
    spec.reset()
    assert (spec.cost.a, spec.cost.b) == (0.0, 0.0)
    assert (spec.draft_cost.fixed, spec.draft_cost.per_depth, spec.draft_cost.per_token) == (0.0, 0.0, 0.0)
    assert spec.acceptance("d", "draft") == 0.5
    assert spec.suffix.propose([request("e", [5, 6, 7])])["e"].token_ids == []


def test_long_contexts_get_fewer_drafts_when_attention_costs() -> None:
    """Verified tokens cost attention over the request's whole context: at equal acceptance a
    request at 4,000 tokens drafts less than one at 100."""
    config = SpeculativeConfig(method="draft", num_speculative_tokens=4)
    draft = CountingDraft()
    spec = SpeculationController(config, suffix=None, draft=draft)
    for n, w in ((8, 8 * 300), (24, 24 * 2000), (8, 8 * 3000), (40, 40 * 500), (16, 16 * 100), (1, 300)) * 4:
        spec.observe_step(n, 0.020 + 0.0003 * n + 1e-6 * w, w)
    short = ProposalRequest("short", prompt_token_ids=[1] * 100, output_token_ids=[9], num_drafts=4)
    long = ProposalRequest("long", prompt_token_ids=[1] * 4000, output_token_ids=[9], num_drafts=4)
    for name in ("short", "long"):  # the same acceptance for both: 0.6
        spec._estimate(name, "draft").accepted, spec._estimate(name, "draft").trials = 6.0, 10.0
    spec.propose([short], batch_size=1)
    spec.propose([long], batch_size=1)
    assert short.num_drafts > long.num_drafts


class RunnersUpDraft(CountingDraft):
    """CountingDraft that also names runners-up (tokens 8, 9, 10) for its first draft."""

    supports_alternatives = True

    def __init__(self) -> None:
        super().__init__()
        self.alternatives: list[int] = []

    def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]:
        self.alternatives += [r.num_alternatives for r in requests]
        return {r.req_id: Proposal([7] * r.num_drafts, alternatives=[8, 9, 10][: r.num_alternatives])
                for r in requests}


def runners_up_controller(adaptive: bool = True) -> tuple[SpeculationController, RunnersUpDraft]:
    """Steps cost 0.030 + 0.001 * tokens: at batch 1 a pair (two rows, 0.002 s) breaks even at a
    hit rate of 0.002 / 0.031 = 0.0645, under the 0.1 every rank starts from."""
    spec, draft = controller("draft", adaptive=adaptive, draft_class=RunnersUpDraft)
    assert isinstance(draft, RunnersUpDraft)
    return spec, draft


def asked(spec: SpeculationController, draft: RunnersUpDraft, *, batch_size: int = 1, max_alternatives: int = 3,
          req_id: str = "a") -> int:
    r = ProposalRequest(req_id, prompt_token_ids=[1, 2, 3], output_token_ids=[4], num_drafts=4,
                        max_alternatives=max_alternatives)
    proposal = spec.propose([r], batch_size=batch_size)[req_id]
    assert len(proposal.alternatives) == r.num_alternatives
    return r.num_alternatives


@pytest.mark.usefixtures("unbudgeted_probes")
def test_runners_up_are_asked_while_their_hit_rate_pays_for_two_rows() -> None:
    spec, draft = runners_up_controller()
    assert asked(spec, draft) == 3  # the prior (0.1) pays at batch 1
    assert asked(spec, draft, max_alternatives=1) == 1  # never more than the runner can verify
    assert asked(spec, draft, max_alternatives=0) == 0
    # The first rank hits every time, the others never: their rates fall below 0.0645.
    for _ in range(40):
        spec.record_alternatives([8, 9, 10], 8)
    rates = spec.alternative_hit_rates()
    assert rates[0] > 0.9 and rates[1] < 0.0645 and rates[2] < 0.0645
    counts = [asked(spec, draft) for _ in range(2 * PROBE_EVERY)]
    # One rank, and every PROBE_EVERY-th step one more (the first that stopped paying), so the
    # estimates of ranks that stopped paying can recover.
    assert sorted(set(counts)) == [1, 2] and counts.count(2) == 2
    # At batch 8 two rows cost 8 tokens' worth of plain decoding: 0.1 does not pay.
    fresh, fresh_draft = runners_up_controller()
    assert asked(fresh, fresh_draft, batch_size=8) == 0
    # Several drafting requests (once their drafts have paid: the fairness gate): one of them
    # probes (the rate is pooled), the others get the paying rank only.
    def step_of_four() -> list[ProposalRequest]:
        step = [ProposalRequest(f"r{i}", [1, 2, 3], [4], num_drafts=4, max_alternatives=3) for i in range(4)]
        proposals = spec.propose(step, batch_size=1)
        for r in step:
            spec.record(r.req_id, len(drafted_ids(proposals, r.req_id)), len(drafted_ids(proposals, r.req_id)))
        return step

    for _ in range(2 * PROBE_EVERY):
        step_of_four()
    batch = [step_of_four() for _ in range(PROBE_EVERY)]
    counts = sorted(r.num_alternatives for step in batch for r in step)
    assert counts == [1] * (4 * PROBE_EVERY - 1) + [2]


def test_not_adaptive_always_asks_for_every_runner_up() -> None:
    spec, draft = runners_up_controller(adaptive=False)
    for _ in range(40):
        spec.record_alternatives([8, 9, 10], 1)  # never hit: adaptive drafting would stop
    assert asked(spec, draft) == 3 and asked(spec, draft, max_alternatives=2) == 2


def test_runners_up_can_pay_for_a_draft_run() -> None:
    """A request whose own drafts are never accepted still drafts when its first draft's
    runners-up pay (their net gain rides on the first draft); without them it does not."""
    spec, draft = runners_up_controller()
    spec.draft_cost.observe(1, 1, 0.0005)
    for req_id in ("with", "without"):
        asked(spec, draft, req_id=req_id)  # sets the proposer that drafted, so record() counts
        for _ in range(20):
            spec.record(req_id, 4, 0)
        assert spec.acceptance(req_id, "draft") < 0.02  # under break-even (0.032 a token, before the run)
    for _ in range(40):
        spec.record_alternatives([8, 9, 10], 8)  # the first runner-up is the target's token
    with_runners_up = ProposalRequest("with", [1, 2, 3], [4], num_drafts=4, max_alternatives=3)
    without = ProposalRequest("without", [1, 2, 3], [4], num_drafts=4, max_alternatives=0)
    spec.propose([with_runners_up], batch_size=1)
    spec.propose([without], batch_size=1)
    assert with_runners_up.num_drafts == 1 and with_runners_up.num_alternatives >= 1
    assert without.num_drafts == 0


def test_reset_restarts_what_a_fresh_controller_starts_with() -> None:
    """After reset() the controller drafts and probes as a fresh one would (probe steps included)."""
    config = SpeculativeConfig(method="draft", num_speculative_tokens=4, adaptive=True)
    fresh = SpeculationController(config, suffix=None, draft=CountingDraft())
    used = SpeculationController(config, suffix=None, draft=CountingDraft())
    for _ in range(7):
        used.propose([request("x", [9])], batch_size=8)
        used.record("x", 4, 0)
        used.finish("x", None)
    used.reset()

    def run(spec: SpeculationController) -> list[int]:
        observe_cpu_steps(spec)
        counts = []
        for _ in range(3 * PROBE_EVERY):
            counts.append(len(drafted_ids(spec.propose([request("a", [9])], batch_size=8), "a")))
            spec.record("a", counts[-1], 0)
        return counts

    expected = run(fresh)
    assert 0 < expected.count(1) < len(expected)  # it switched off and probed
    assert run(used) == expected


def test_before_the_step_price_is_known_one_draft_for_one_request_and_no_runners_up() -> None:
    """Unpriced, the draft model drafts one token for the request with the shortest context only
    (its first draft is a catch-up over the whole context), no runners-up; suffix drafts, one
    token each, for every request that has one."""
    config = SpeculativeConfig(method="draft", num_speculative_tokens=4, adaptive=True)
    draft = RunnersUpDraft()
    spec = SpeculationController(config, suffix=None, draft=draft)
    batch = [ProposalRequest(f"r{i}", [1, 2, 3] * (1 if i == 5 else 4), [4], num_drafts=4, max_alternatives=3)
             for i in range(8)]
    proposals = spec.propose(batch, batch_size=8)  # nothing measured: tokens look free
    assert [len(drafted_ids(proposals, r.req_id)) for r in batch] == [0] * 5 + [1] + [0] * 2
    assert [r.num_drafts for r in batch] == [0] * 5 + [1] + [0] * 2
    assert [r.num_alternatives for r in batch] == [0] * 8
    hybrid = SpeculationController(SpeculativeConfig(method="hybrid", num_speculative_tokens=4, adaptive=True),
                                   suffix=SuffixProposer(), draft=CountingDraft())
    batch = [request(f"r{i}", REPEATING if i % 2 else [9, 8]) for i in range(8)]
    proposals = hybrid.propose(batch, batch_size=8)
    assert [len(drafted_ids(proposals, r.req_id)) for r in batch] == [1, 1] + [0, 1] * 3
    spec.observe_step(200, 0.3)  # a prefill: one token count, no slope yet
    proposals = spec.propose([request("a", [4])], batch_size=1)
    assert len(drafted_ids(proposals, "a")) == 1
    spec.observe_step(1, 0.03)  # the first decode step: the slope is known
    assert spec.cost.identified
    single = ProposalRequest("a", [1, 2, 3], [4], num_drafts=4, max_alternatives=3)
    assert len(drafted_ids(spec.propose([single], batch_size=1), "a")) > 1 and single.num_alternatives > 0


@pytest.mark.parametrize("proposing_seconds", [0.0, 0.002])
def test_the_fairness_gate_prices_proposing_itself(proposing_seconds: float) -> None:
    """In a batch, a step whose fairness budget buys one verified token but not also the
    proposing and planning of it (measured: proposing_seconds, a decaying mean of the steps that
    proposed) runs no proposer at all: at 8 chat streams the suffix index, the vote and the plan
    took ~0.4 ms a step to draft a token now and then."""
    spec, _ = controller("suffix")  # a step of 38 ms at batch 8, a verified token 1 ms
    for i in range(8):
        spec._standing[f"r{i}"] = controller_module.TokensPerStep(tokens=0.04 * 20, steps=20.0)
    spec.proposing_seconds = proposing_seconds
    calls = []
    propose = spec.suffix.propose
    spec.suffix.propose = lambda requests, cap: calls.append(len(requests)) or propose(requests, cap)
    proposals = spec.propose([request(f"r{i}", REPEATING) for i in range(8)], batch_size=8)
    # The budget: 38 ms x (standing ~0.038 + the 2% tolerance) = 2.2 ms.
    if proposing_seconds:  # 1 ms + 2 ms does not fit
        assert calls == [] and not any(p.token_ids for p in proposals.values())
    else:
        # Proposed, the plan drafts two for every request, each paying its wait with its own
        # expected gain (policy._fair).
        assert calls == [8] and sum(len(p.token_ids) for p in proposals.values()) == 16
        assert spec.proposing_seconds > 0  # measured


@pytest.mark.parametrize("adaptive", [True, False])
def test_suffix_and_draft_model_have_caps_of_their_own(adaptive: bool) -> None:
    """num_suffix_tokens caps suffix drafts, num_speculative_tokens the draft model's, each
    within the room the runner gives (request.num_drafts: the larger cap, less what max_tokens
    leaves)."""
    draft = CountingDraft()
    config = SpeculativeConfig(method="hybrid", num_speculative_tokens=2, num_suffix_tokens=7, adaptive=adaptive)
    spec = SpeculationController(config, suffix=SuffixProposer(max_drafts=config.num_suffix_tokens), draft=draft)
    observe_cpu_steps(spec)
    assert spec.max_drafts == 7
    # Alone on a step, cheap verification, suffix drafts that were always accepted: the
    # confident match would be worth drafting past 7.
    for _ in range(20):
        spec.propose([request("warm", REPEATING, k=spec.max_drafts)], batch_size=1)
        spec.record("warm", 7, 7)
    proposals = spec.propose([request("a", REPEATING, k=spec.max_drafts)], batch_size=1)
    assert drafted_ids(proposals, "a") == [5, 6, 7, 8, 5, 6, 7] and not draft.asked
    # Nothing to continue from: the draft model drafts, at most its own cap.
    proposals = spec.propose([request("b", [40, 41, 42], k=7)], batch_size=1)
    assert draft.asked == [("b", 2)] and drafted_ids(proposals, "b") == [7, 7]
    # Less room (max_tokens near): the room wins over both caps.
    proposals = spec.propose([request("c", REPEATING, k=3)], batch_size=1)
    assert drafted_ids(proposals, "c") == [5, 6, 7]


def test_the_suffix_cap_shrinks_with_the_batch_down_to_the_draft_models() -> None:
    config = SpeculativeConfig(method="suffix", num_speculative_tokens=4, num_suffix_tokens=16)
    spec = SpeculationController(config, suffix=SuffixProposer(max_drafts=16))
    assert [spec.suffix_cap(b) for b in (1, 2, 3, 4, 8, 64)] == [16, 8, 5, 4, 4, 4]
    small = SpeculationController(SpeculativeConfig(method="suffix", num_speculative_tokens=8, num_suffix_tokens=2),
                                  suffix=SuffixProposer(max_drafts=2))
    assert [small.suffix_cap(b) for b in (1, 8)] == [2, 2]
    # Proposals follow it: a repeating context, 8 requests, each drafts at most 4.
    spec = SpeculationController(SpeculativeConfig(method="suffix", num_suffix_tokens=16, adaptive=False),
                                 suffix=SuffixProposer(max_drafts=16))
    proposals = spec.propose([request(str(i), REPEATING, k=16) for i in range(8)], batch_size=8)
    assert all(len(p.token_ids) == 4 for p in proposals.values())
    proposals = spec.propose([request("alone", REPEATING, k=16)], batch_size=1)
    assert len(drafted_ids(proposals, "alone")) == 16


def test_caps_are_checked() -> None:
    with pytest.raises(ValueError, match="num_suffix_tokens"):
        SpeculativeConfig(method="suffix", num_suffix_tokens=0)
    with pytest.raises(ValueError, match="num_suffix_tokens"):
        SpeculativeConfig(method="suffix", num_suffix_tokens=33)


class ConfidentDraft(CountingDraft):
    """CountingDraft that stops by confidence like the EAGLE head: it records each request's
    min_confidence and reports its probability of every token (0.9 each)."""

    supports_confidence = True

    def __init__(self) -> None:
        super().__init__()
        self.calibration = None
        self.floors: list[float] = []

    def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]:
        self.floors += [r.min_confidence for r in requests]
        return {r.req_id: Proposal(p.token_ids, token_probs=[0.9] * len(p.token_ids))
                for r, p in zip(requests, super().propose(requests).values())}


def test_alone_a_confident_draft_model_drafts_to_its_cap_above_break_even() -> None:
    # 31 ms a step, 1 ms to verify a token, the draft's own 10 ms a token: CountingDraft's plan
    # drafts one token (test_draft_model_length_follows_its_cost); a draft model that knows its
    # confidence is asked for the cap and stops where the chance of its drafts falls below
    # (0.001 + 0.010) / 0.031.
    spec, draft = controller("draft", draft_seconds=0.010, draft_class=ConfidentDraft)
    assert isinstance(draft, ConfidentDraft) and draft.calibration is spec.calibration
    r = request("a", [9])
    spec.propose([r], batch_size=1)
    assert draft.asked[-1] == ("a", 4) and r.num_drafts == 4
    assert draft.floors[-1] == pytest.approx(0.011 / 0.031, rel=1e-3)


@pytest.mark.usefixtures("unbudgeted_probes")
def test_in_a_batch_a_confident_draft_model_only_trims_the_plan() -> None:
    # The same batch history for both: every draft accepted, so the gate opens and drafts grow.
    pair = [controller("draft", draft_seconds=0.0005), controller("draft", draft_seconds=0.0005,
                                                                  draft_class=ConfidentDraft)]
    names = [f"r{i}" for i in range(8)]
    for _ in range(3 * PROBE_EVERY):
        for spec, _ in pair:
            proposals = spec.propose([request(name, [9]) for name in names], batch_size=8)
            for name in names:
                drafted = len(drafted_ids(proposals, name))
                spec.record(name, drafted, drafted)
    (_, plain), (_, confident) = pair
    assert confident.asked == plain.asked and max(k for _, k in plain.asked) > 1
    assert isinstance(confident, ConfidentDraft) and all(0.0 < floor < 1.0 for floor in confident.floors)


def test_the_calibration_learns_from_the_draft_models_verified_tokens() -> None:
    spec, _ = controller("draft", draft_class=ConfidentDraft)
    before = spec.calibration.acceptance(0.9)
    verified = 0
    for _ in range(30):
        proposals = spec.propose([request("a", [9])], batch_size=1)
        drafted = len(drafted_ids(proposals, "a"))
        verified += drafted > 0
        spec.record("a", drafted, 0)  # its confident drafts are all rejected
    assert verified >= 5 and spec.calibration.acceptance(0.9) < before * 0.7
    spec.finish("a", None)
    spec.reset()  # a fresh calibration, handed to the draft model again
    assert spec.calibration.acceptance(0.9) == before and spec.draft.calibration is spec.calibration


def test_not_adaptive_a_confident_draft_model_drafts_k_without_a_floor() -> None:
    spec, draft = controller("draft", adaptive=False, draft_class=ConfidentDraft)
    spec.propose([request("a", [9])], batch_size=1)
    assert draft.asked == [("a", 4)] and draft.floors == [0.0]


def test_a_draft_model_is_priced_by_the_positions_it_ran() -> None:
    class StoppingDraft(ConfidentDraft):
        """Drafts one token but ran three positions (two drafts dropped for their confidence)."""

        positions_run = 0

        def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]:
            self.positions_run = 3
            return {r.req_id: Proposal([7], token_probs=[0.9]) for r in requests}

    spec, _ = controller("draft", draft_class=StoppingDraft)
    seen = []
    spec.draft_cost.observe = lambda depth, tokens, seconds: seen.append((depth, tokens))  # type: ignore[method-assign]
    spec.propose([request("a", [9])], batch_size=1)
    assert seen == [(3, 1)]


def test_a_staircase_step_is_priced_by_the_steps_seen_in_a_batch() -> None:
    """At batch 8 the line (pulled flat by prompt chunks) says a token costs 2 ms, the steps seen
    say 3.4 ms (8 more rows are a second pass over the weights): drafts the target accepts 60% of
    the time are dropped, sure ones stay."""
    config = SpeculativeConfig(method="suffix", num_speculative_tokens=4, adaptive=True)
    spec = SpeculationController(config, suffix=SuffixProposer(), draft=None)
    for _ in range(5):
        for n, seconds in ((1, 0.030), (4, 0.030), (8, 0.031), (16, 0.058), (128, 0.300)):
            spec.observe_step(n, seconds)
    run = controller_module.DraftRun(0.0, 0.0)
    step_seconds = 0.031

    def plan_for(gain: float) -> dict[str, tuple]:
        candidates = [controller_module.Candidate(f"r{i}", [gain], spec.cost.token_seconds(100)) for i in range(8)]
        plan = controller_module.plan_step([[c] for c in candidates], step_seconds=step_seconds, batch_size=8,
                                           draft_run=run, standing={c.req_id: 1.0 for c in candidates})
        assert sum(count for _, count in plan.values()) == 8  # the line lets them all through
        return spec._price_by_steps_seen(plan, [[c] for c, _ in plan.values()], 8, step_seconds, run,
                                         {f"r{i}": 1.0 for i in range(8)})

    assert sum(count for _, count in plan_for(0.6).values()) == 0
    assert sum(count for _, count in plan_for(0.95).values()) == 8
    # Alone, the line's plan stands (a head's confident drafts run past the plan's count).
    alone = {"r0": (controller_module.Candidate("r0", [0.5], spec.cost.token_seconds(100)), 1)}
    assert spec._price_by_steps_seen(alone, [[alone["r0"][0]]], 1, step_seconds, run, {"r0": 1.0}) == alone


@pytest.mark.parametrize("draft_class", [CountingDraft, ConfidentDraft])
def test_alone_a_confident_draft_model_runs_whenever_its_tokens_pay(draft_class) -> None:
    # 31 ms a step, 1 ms to verify a token, the draft's own 12 ms a token: a draft must be
    # accepted 13 / 31 = 0.42 of the time to pay. Other requests' drafts were all accepted, this
    # one's last ten were not: its own rate is below that, the head's over all of them above.
    spec, draft = controller("draft", draft_seconds=0.012, draft_class=draft_class)
    for name, accepted, times in (("b", 1, 30), ("a", 0, 10)):
        for _ in range(times):
            spec.propose([request(name, [9])], batch_size=1)
            spec.record(name, 1, accepted)
    draft.asked.clear()
    break_even = 0.013 / 0.031
    assert spec.acceptance("a", "draft") < break_even
    assert draft_class is CountingDraft or spec.calibration.overall > break_even
    r = request("a", [9])
    drafted = drafted_ids(spec.propose([r], batch_size=1), "a")
    if draft_class is ConfidentDraft:
        assert draft.asked == [("a", 4)] and r.num_drafts == 4 == len(drafted)  # its confidence sets the depth
    else:  # a draft model that cannot tell a sure draft from a guess keeps to the plan
        assert draft.asked == [] and drafted == []
    # Not in a batch, where the others wait for its verification (the plan and its gate decide).
    spec.propose([request("a", [9]), request("c", [9])], batch_size=2)
    assert ("a", 4) not in draft.asked[1:]


def test_alone_a_confident_draft_model_stays_off_while_its_tokens_do_not_pay() -> None:
    # Every drafted token rejected: the head runs alone while its acceptance over the
    # calibration's window (starting from its prior, 0.5) still pays, then stops for good.
    spec, draft = controller("draft", draft_seconds=0.012, draft_class=ConfidentDraft)
    ran = []
    for _ in range(40):
        drafted = drafted_ids(spec.propose([request("a", [9])], batch_size=1), "a")
        ran.append(bool(drafted))
        spec.record("a", len(drafted), 0)
    assert 0 < sum(ran) <= 10 and not any(ran[10:]) and len(draft.asked) == sum(ran)
    assert spec.calibration.overall < 0.5


def test_alone_the_head_prices_a_verified_token_by_the_steps_seen_with_its_drafts() -> None:
    # Steps of 2 to 5 tokens cost 30-30.3 ms, those of 6 to 48 1 ms a token more each: the line
    # says ~1 ms a token, the steps seen with one to four drafts 0.1 ms. Alone, the floor of the
    # drafts after the first is (0.1 ms verifying, the draft's own) / step; until a step with
    # one draft and one with more were seen, and in a batch, the line prices them.
    spec, draft = controller("draft", draft_seconds=0.010, draft_class=ConfidentDraft)
    spec.cost._seen.clear()  # (forgets the line controller() showed it; the fit keeps it)
    spec.cost._known = None
    step = spec._plain_step_seconds(4, 1)

    def floor(batch_size: int = 1) -> float:
        """The floor the next proposal sets, given what verifying a token costs there."""
        own = spec.draft_cost.per_token + spec.draft_cost.per_depth / batch_size
        requests = [request(name, [9]) for name in "ab"[:batch_size]]
        spec.propose(requests, batch_size=batch_size)
        return draft.floors[-1], own

    found, own = floor()
    assert found == pytest.approx((spec.cost.token_seconds(4) + own) / step, rel=1e-6)
    for n in (2, 3, 4, 5):
        spec.cost._seen[n] = 0.030 + 0.0001 * (n - 2)
    for n in range(6, 49):
        spec.cost._seen[n] = 0.0303 + 0.001 * (n - 5)
    spec.cost._known = None  # (the table as read, built again)
    assert spec.cost.b > 0.0008
    found, own = floor()
    assert found == pytest.approx((0.0001 + own) / step, rel=1e-6)
    del spec.cost._seen[5]  # the furthest seen up to the cap's: 4 tokens
    spec.cost._known = None
    found, own = floor()
    assert found == pytest.approx((0.0001 + own) / step, rel=1e-6)
    found, _ = floor(batch_size=2)
    assert found >= spec.cost.token_seconds(4) * 2 / spec._plain_step_seconds(4, 2)
