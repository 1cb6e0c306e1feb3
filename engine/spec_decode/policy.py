"""How many tokens to draft, given what they are expected to gain and what they cost.

Pure arithmetic, no state (the controller keeps the estimates; tests pin the decisions).

- A drafted token's gain is the probability that the target accepts it (the j-th draft only
  counts if the j - 1 before it were accepted, so gains never increase along a proposal).
- Its cost is the seconds it adds: verifying one more token (the cost model's slope b) plus, for
  a draft model, producing it. Plain decoding makes batch_size tokens per step_seconds; a token
  that adds c seconds must therefore gain at least c * batch_size / step_seconds tokens, else the
  same seconds would have made more tokens without it. This is throughput break-even: alone on a
  weight-bound step (c << step) nearly any draft pays; at batch 8 on a CPU only confident ones do.
- Fairness gate: the step's extra seconds delay every request in it, also those that draft
  nothing. So the whole step's extra time must be paid by the request that gains least
  (extra <= step_seconds * (least expected accepted + tolerance)); when some request in the batch
  gains nothing, drafting shrinks to the best tokens that fit in the tolerance alone. Without this
  a batch that runs until its slowest request finishes (a tool-loop round, a benchmark group) gets
  slower: drafts finish the predictable requests early while the unpredictable one, which sets
  the pace, pays for them every step.
"""

from __future__ import annotations

from dataclasses import dataclass

# Share of a step by which speculation may slow a request that gains nothing from it. A GPU's
# verification tokens cost about this much noise; a CPU's cost more, so there it is a gate.
TOLERANCE = 0.02


@dataclass
class Candidate:
    req_id: str
    gains: list[float]  # expected accepted tokens added by each successive draft, non-increasing
    token_seconds: float  # what one more drafted token adds to the step (verification + proposing)


def break_even_gain(step_seconds: float, batch_size: int, token_seconds: float) -> float:
    """The least gain a token costing token_seconds must bring (plain decoding's tokens per
    second times its cost)."""
    if step_seconds <= 0:
        return 0.0  # nothing measured yet: tokens look free
    return token_seconds * batch_size / step_seconds


def worth(candidate: Candidate, step_seconds: float, batch_size: int) -> tuple[int, float]:
    """(tokens that break even, their summed net gain in tokens) for one candidate."""
    threshold = break_even_gain(step_seconds, batch_size, candidate.token_seconds)
    count, value = 0, 0.0
    for gain in candidate.gains:
        if gain < threshold or gain <= 0:
            break
        count += 1
        value += gain - threshold
    return count, value


def plan_drafts(candidates: list[Candidate], *, step_seconds: float, batch_size: int,
                tolerance: float = TOLERANCE) -> dict[str, int]:
    """How many tokens to draft for each candidate (every request that will decode next step)."""
    counts = {c.req_id: worth(c, step_seconds, batch_size)[0] for c in candidates}
    if not candidates or step_seconds <= 0:
        return counts
    extra = sum(counts[c.req_id] * c.token_seconds for c in candidates)
    least = min(sum(c.gains[: counts[c.req_id]]) for c in candidates)
    if extra <= step_seconds * (least + tolerance):
        return counts
    # Someone gains too little to pay for the others' drafts: keep only the best tokens that fit
    # in the tolerance. Best first; a candidate's tokens come in order (gains never increase and
    # ties keep their position), so what is kept of each is a prefix.
    budget = step_seconds * tolerance
    tokens = sorted(((gain, j, c) for c in candidates for j, gain in enumerate(c.gains[: counts[c.req_id]])),
                    key=lambda item: (-item[0], item[1]))
    kept = {c.req_id: 0 for c in candidates}
    for _, j, candidate in tokens:
        if j == kept[candidate.req_id] and candidate.token_seconds <= budget * (1 + 1e-9):  # (rounding)
            budget -= candidate.token_seconds
            kept[candidate.req_id] += 1
    return kept
