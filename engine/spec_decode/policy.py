"""How many tokens to draft, given what they are expected to gain and what they cost.

Pure arithmetic, no state (the controller keeps the estimates; tests pin the decisions).

- A drafted token's gain is the probability that the target accepts it (the j-th draft only
  counts if the j - 1 before it were accepted, so gains never increase along a proposal).
- Its cost is the seconds it adds: verifying one more token (the step cost model's slope) plus,
  for a draft model, its own share of the drafting. Plain decoding makes batch_size tokens per
  step_seconds; a token that adds c seconds must therefore gain at least c * batch_size /
  step_seconds tokens, else the same seconds would have made more tokens without it. This is
  throughput break-even: alone on a weight-bound step (c << step) nearly any draft pays; at batch
  8 on a CPU only confident ones do.
- A draft model also costs per step, not per token: it drafts position by position, so running
  it at all costs `fixed` and every position it drafts to costs `per_depth`, however many
  requests share the pass (DraftRun). The plan therefore tries every depth the draft model could
  run to (0: not at all) and keeps the one that makes the most tokens per second,
  (batch_size + gained) / (step_seconds + extra seconds).
- Fairness gate: the step's extra seconds delay every request in it, also those that draft
  nothing, and a batch that runs until its slowest request finishes (a tool-loop round, a
  benchmark group) gets slower when drafts finish the predictable requests early while the
  unpredictable one, which sets the pace, pays for them every step. A request is not slowed while
  the extra seconds it waits are paid by what it gains over its steps: sum(extra) <=
  step_seconds * sum(its gains). So a step's extra seconds must fit in step_seconds * (what the
  request's own drafts in it are expected to gain it + its standing gain + tolerance), its
  standing gain being what its drafts gained it per step lately (measured by the controller); a
  plan that does not fit is trimmed to the tokens that fit in the least standing gain's budget,
  for all (a draft model's run costs included). The expected gain of its own drafts counts at
  most what they realized per verification lately (Candidate.own_gain): the expectation leans on
  the rate pooled over all requests, which a request whose drafts are all rejected does not
  move much.
  History: the gate first took this step's expected gains alone (the least gaining request paid
  for the whole step): too strict where every request's text repeats now and then: code at 8
  streams, where some request has nothing to draft at nearly every step, held suffix drafting to
  0.95-0.97x of none, where drafting every proposal made 1.17x and standing gains 1.14x (bf16,
  this machine). Then standing gains alone paid for the others' tokens (a request's own priced
  at break-even): a batch with no standing gains yet could not draft at all until probes had
  raised them, and at 8 agent-turn streams (short answers, ~35 tokens) the draft model alone
  started in some rounds (57-61 steps for 24 turns) and never in others (107 steps, as many as
  without drafts, its exploring costs making it 0.97-0.98x of none).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Share of a step by which speculation may slow a request that gains nothing from it. A GPU's
# verification tokens cost about this much noise; a CPU's cost more, so there it is a gate.
TOLERANCE = 0.02


@dataclass
class Candidate:
    req_id: str
    gains: list[float]  # expected accepted tokens added by each successive draft, non-increasing
    token_seconds: float  # what one more drafted token adds to the step (verification + proposing)
    method: str = "suffix"  # "draft": its tokens also share the draft model's run (DraftRun)
    # Tokens its proposer's drafts for this request gained per verification lately (None: none
    # verified yet): the fairness gate counts the request's own expected gain up to it (own_gain).
    realized: float | None = None

    def own_gain(self, count: int) -> float:
        """What the fairness gate counts for the request's own first `count` drafts: their
        expected gain, at most what its drafts realized lately. The expected gain leans on the
        rate pooled over all requests (PRIOR_TRIALS), so a request whose drafts are all rejected
        among requests whose drafts pass would go on expecting about 0.6 a draft."""
        gained = sum(self.gains[:count])
        return gained if self.realized is None else min(gained, self.realized)


@dataclass
class DraftRun:
    """What running the draft model costs a step beyond its tokens' own price."""

    fixed: float  # seconds, once per step in which it drafts anything
    per_depth: float  # seconds per position drafted in sequence (the deepest request sets it)

    def seconds(self, depth: int) -> float:
        return self.fixed + self.per_depth * depth if depth > 0 else 0.0


def break_even_gain(step_seconds: float, batch_size: int, token_seconds: float) -> float:
    """The least gain a token costing token_seconds must bring (plain decoding's tokens per
    second times its cost)."""
    if step_seconds <= 0:
        return 0.0  # nothing measured yet: tokens look free
    return token_seconds * batch_size / step_seconds


def gate_shut(standing: Iterable[float], step_seconds: float, cheapest_plan_seconds: float,
              tolerance: float = TOLERANCE) -> bool:
    """Whether the standing gains alone buy no drafted token: the least (with the tolerance) pays
    less than the cheapest plan (one verified token, and the controller's proposing and planning
    of it), so any plan in which that request waits for another's drafts without drafting itself
    is trimmed to nothing (plan_step) or costs more to find than the budget. Plans it misses:
    that request drafting alone, which the others' standing might pay for, and every request
    drafting, each paying with its own expected gain (_fair); the controller's probe steps plan
    anyway, and find the second. Alone (fewer than two standing gains), never shut."""
    values = list(standing)
    return len(values) >= 2 and step_seconds * (min(values) + tolerance) < cheapest_plan_seconds


def worth(candidate: Candidate, step_seconds: float, batch_size: int) -> tuple[int, float]:
    """(tokens that break even, their summed net gain in tokens) for one candidate."""
    option = _option(candidate, step_seconds, batch_size)
    return option.count, option.net[-1]


@dataclass
class _Option:
    candidate: Candidate
    count: int  # tokens that break even
    net: list[float]  # net[j]: summed net gain of the first j tokens
    gained: list[float]  # gained[j]: summed gain of the first j tokens


def _option(candidate: Candidate, step_seconds: float, batch_size: int) -> _Option:
    """Its tokens while each breaks even (gains never increase, so the first that does not ends
    them), with running sums of net gain and gain."""
    threshold = break_even_gain(step_seconds, batch_size, candidate.token_seconds)
    net, gained = [0.0], [0.0]
    for gain in candidate.gains:
        if gain < threshold or gain <= 0:
            break
        net.append(net[-1] + gain - threshold)
        gained.append(gained[-1] + gain)
    return _Option(candidate, len(net) - 1, net, gained)


def plan_step(options: list[list[Candidate]], *, step_seconds: float, batch_size: int,
              standing: Mapping[str, float], tolerance: float = TOLERANCE,
              draft_run: DraftRun | None = None) -> dict[str, tuple[Candidate, int]]:
    """Per request (options[i]: its proposers' candidates, one per proposer), the proposer chosen
    and how many of its tokens to draft. standing: per request, what its drafts gained it per
    step on average (the fairness gate's; a request missing from it has gained nothing)."""
    priced = [[_option(c, step_seconds, batch_size) for c in per_request] for per_request in options]
    max_depth = max((o.count for per_request in priced for o in per_request if o.candidate.method == "draft"),
                    default=0)
    run = draft_run if draft_run is not None else DraftRun(0.0, 0.0)
    best_plan: list[tuple[_Option, int]] = []
    best_rate = -1.0
    for depth in range(max_depth + 1):
        plan = _plan_at_depth(priced, depth)
        if step_seconds <= 0:  # nothing measured: every token looks free, the deepest plan wins
            best_plan = plan
            continue
        extra, gained = _price(plan, run)
        if not _fair(plan, extra, step_seconds, tolerance, standing):
            # One budget for all, the least standing gain's (a request's own drafts count
            # against it too here: simpler than the exact check, and never unfair).
            floor = min((standing.get(o.candidate.req_id, 0.0) for o, _ in plan), default=0.0)
            plan = _trim(plan, step_seconds * (floor + tolerance), run, standing)
            extra, gained = _price(plan, run)
        rate = (batch_size + gained) / (step_seconds + extra)
        if rate > best_rate * (1 + 1e-12):
            best_plan, best_rate = plan, rate
    return {o.candidate.req_id: (o.candidate, count) for o, count in best_plan}


def _plan_at_depth(priced: list[list[_Option]], depth: int) -> list[tuple[_Option, int]]:
    """Each request's best option with draft-model tokens capped at depth. On a tie of net gain
    one that has drafts wins (it can probe), then the first."""
    plan = []
    for per_request in priced:
        choices = [(o, min(o.count, depth) if o.candidate.method == "draft" else o.count) for o in per_request]
        plan.append(max(choices, key=lambda oc: (oc[0].net[oc[1]], bool(oc[0].candidate.gains))))
    return plan


def _run_seconds(plan: list[tuple[_Option, int]], run: DraftRun) -> float:
    """The draft model's run in a plan: to the depth of its deepest request."""
    return run.seconds(max((count for o, count in plan if o.candidate.method == "draft"), default=0))


def _price(plan: list[tuple[_Option, int]], run: DraftRun) -> tuple[float, float]:
    """(extra seconds, expected tokens gained) of a plan."""
    extra = _run_seconds(plan, run) + sum(count * o.candidate.token_seconds for o, count in plan)
    return extra, sum(o.gained[count] for o, count in plan)


def _fair(plan: list[tuple[_Option, int]], extra: float, step_seconds: float,
          tolerance: float, standing: Mapping[str, float]) -> bool:
    """Whether no request is expected to be slowed: the step's extra seconds <= step_seconds *
    (what its own drafts this step are expected to gain it, Candidate.own_gain, + its standing
    gain + tolerance); a request that makes 1 + g tokens in step_seconds + extra is not slower
    than plain decoding while extra <= g * step_seconds. A request alone is never gated: no one
    else waits, and its plan is the one with the most tokens per second."""
    if len(plan) < 2:
        return True
    for o, count in plan:
        own = o.candidate.own_gain(count)
        if extra > step_seconds * (own + standing.get(o.candidate.req_id, 0.0) + tolerance) * (1 + 1e-9):
            return False
    return True


def _trim(plan: list[tuple[_Option, int]], budget: float, run: DraftRun,
          standing: Mapping[str, float]) -> list[tuple[_Option, int]]:
    """Only the tokens that fit in budget seconds: every request's first draft before any second
    one, the least standing first (the best first on a tie): the budget is set by the least
    standing gain, and only drafts of its own can raise it (best-first kept giving a tie's budget
    to the same requests while the others' standing faded). A request's tokens come in order
    (gains never increase and ties keep their position), so what is kept of each is a prefix; a
    draft-model token also pays for starting the run and for every position it deepens."""
    def order(item: tuple[float, int, int]) -> tuple:
        gain, j, i = item
        return (j, standing.get(plan[i][0].candidate.req_id, 0.0), -gain)

    tokens = sorted(((o.candidate.gains[j], j, i) for i, (o, count) in enumerate(plan) for j in range(count)),
                    key=order)
    kept = [0] * len(plan)
    depth = 0
    for _, j, i in tokens:
        candidate = plan[i][0].candidate
        if j != kept[i]:
            continue
        cost = candidate.token_seconds
        if candidate.method == "draft" and j + 1 > depth:
            cost += run.seconds(j + 1) - run.seconds(depth)
        if cost <= budget * (1 + 1e-9):  # (rounding)
            budget -= cost
            kept[i] += 1
            if candidate.method == "draft":
                depth = max(depth, j + 1)
    return [(o, k) for (o, _), k in zip(plan, kept)]
