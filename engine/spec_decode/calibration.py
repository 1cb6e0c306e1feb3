"""How often the target accepts a draft model's token, given the draft's own probability of it.

A draft model knows when it is guessing: the EAGLE head's softmax probability q of its greedy
token predicts whether the target accepts that token. Replaying the shipped head (bf16, one
stream, four drafts a step, the speculative benchmark's chat and code prompts), first drafts with
q < 0.1 were accepted 9% of the time on chat, those with q >= 0.9 12 of 12; on code 6% and 38 of
38; later drafts (given the ones before them accepted) follow the same curve. A draft rate per
request (the controller's acceptance estimate) cannot tell these tokens apart; q can, so the
proposer stops a request's drafts where the chance that they all survive falls below what one
more token costs (EAGLE-2 drafts by the same confidence; engine/spec_decode/eagle.py).

The mapping from q to the chance of acceptance is learnt online, pooled over requests: NUM_BINS
bins of q, decaying counts of accepted drafts and of trials per bin (a draft is a trial when
every draft before it was accepted), each bin starting from PRIOR_TRIALS trials at its own
midpoint (a calibrated draft), made non-decreasing in q by pooling adjacent bins that violate it
(a higher probability never predicts a lower acceptance; noise in a thin bin would say so).

Whether a further position is worth its pass is known only after it ran, so the proposer runs
one for a request while the chance of its drafts so far times next_chance, the mean chance of a
draft after the first (over every such position computed, kept or not), still pays. A draft's
probability says little about the next one's: in the replay above, the next draft's chance
averaged 0.25-0.35 on chat and 0.42-0.51 on code whatever the bin of the one before, so one
mean serves. On a CPU a position's pass costs more than verifying its token, so a rule that ran
the pass whenever the token could still pay (the top bin's chance) gave back more than stopping
saved. Priced with one stream's costs here (bf16: a 27.5 ms step, 0.7 ms per verified token,
2 ms for the head's first pass and 2.2 ms for each further one), the recorded drafts made 1.15x
of none on chat that way, against 1.20x for one draft a step; with next_chance 1.20x, and on code
1.42x against two drafts a step's 1.38x.
"""

from __future__ import annotations

from engine.spec_decode.proposer import Proposal, ProposalRequest

NUM_BINS = 10
PRIOR_TRIALS = 4.0  # weight of a bin's prior (its midpoint), in trials
DECAY = 0.995  # weight of the past per verification (about the last 200 count)
MAX_ACCEPTANCE = 0.99  # a draft is never sure: keeps the chance of a run decreasing
NEXT_DECAY = 0.99  # weight of the past per position in next_chance (about the last 100)
NEXT_PRIOR = 0.5  # next_chance before any position after a first draft was computed
_PRIOR_ACCEPTED = PRIOR_TRIALS * sum((b + 0.5) / NUM_BINS for b in range(NUM_BINS))  # every bin's prior, summed


class ConfidenceCalibration:
    def __init__(self) -> None:
        self.accepted = [0.0] * NUM_BINS
        self.trials = [0.0] * NUM_BINS
        self._table = _monotone(self.accepted, self.trials)
        self.next_chance = NEXT_PRIOR

    @property
    def overall(self) -> float:
        """The chance the target accepts a drafted token, whatever its probability: over the
        same decaying counts (about the last 200 verifications), with every bin's prior."""
        return (sum(self.accepted) + _PRIOR_ACCEPTED) / (sum(self.trials) + PRIOR_TRIALS * NUM_BINS)

    def acceptance(self, prob: float) -> float:
        """The chance the target accepts a drafted token the draft gave probability prob
        (given every draft before it was accepted)."""
        return self._table[_bin(prob)]

    def observe_next(self, chance: float) -> None:
        """The chance of a draft after a request's first, as computed (kept or not)."""
        self.next_chance = NEXT_DECAY * self.next_chance + (1.0 - NEXT_DECAY) * chance

    def update(self, token_probs: list[float], num_accepted: int) -> None:
        """One verification: the draft's probabilities of the tokens it drafted, in order, and
        how many of them the target accepted (the first num_accepted; the one after them was a
        rejected trial; those after that were never tried)."""
        if not token_probs:
            return
        self.accepted = [DECAY * a for a in self.accepted]
        self.trials = [DECAY * t for t in self.trials]
        for j, prob in enumerate(token_probs[: num_accepted + 1]):
            b = _bin(prob)
            self.trials[b] += 1.0
            if j < num_accepted:
                self.accepted[b] += 1.0
        self._table = _monotone(self.accepted, self.trials)


# Positions a suffix vote is calibrated apart for: the first draft, the second, and the later ones
# (VoteCalibration).
VOTE_POSITIONS = 3


class VoteCalibration:
    """How often the target accepts a suffix draft, given its vote's share (the fraction of the
    followed occurrences that continue with it; suffix.py) and its position in the proposal.

    The same monotone, decaying bins as ConfidenceCalibration, one table per position (the
    first draft, the second, the later ones): a repeated stretch that held for a few tokens
    tends to go on, so a later draft with the same share is accepted more often. Logged over one
    hybrid code pass (float32, the speculative benchmark's 8 prompts, the shipped corpus), corpus
    first drafts were accepted 4% of the time with a share under 0.5 (23 of them), 53% with one
    of 0.5-0.8 and 64% above; drafts at the fourth position and later 78-86% whatever the share.
    The request's own accepted/trials rates, which the plan used, told those drafts apart not at
    all (first drafts it rated 0.2 were accepted 64% of the time, those it rated 0.6, 42%)."""

    def __init__(self) -> None:
        self.tables = [ConfidenceCalibration() for _ in range(VOTE_POSITIONS)]

    def chances(self, shares: list[float]) -> list[float]:
        """Per draft, the chance that it and every draft before it are accepted."""
        chance, out = 1.0, []
        for j, share in enumerate(shares):
            chance *= self.tables[min(j, VOTE_POSITIONS - 1)].acceptance(share)
            out.append(chance)
        return out

    def update(self, shares: list[float], num_accepted: int) -> None:
        """One verification of drafts with these shares (in order), of which the first
        num_accepted were accepted."""
        tried = shares[: num_accepted + 1]
        for position in range(min(len(tried), VOTE_POSITIONS)):
            # The trials in this position's table: one at the first positions, the rest at the last.
            last = position == VOTE_POSITIONS - 1
            in_table = tried[position:] if last else tried[position : position + 1]
            accepted = max(0, min(len(in_table), num_accepted - position))
            self.tables[position].update(in_table, accepted)


def _bin(prob: float) -> int:
    return min(NUM_BINS - 1, max(0, int(prob * NUM_BINS)))


def _monotone(accepted: list[float], trials: list[float]) -> list[float]:
    """Per bin, (accepted + prior) / (trials + prior weight), made non-decreasing by pooling
    adjacent violators (weighted by trials + prior), capped at MAX_ACCEPTANCE."""
    blocks: list[list[float]] = []  # [rate, weight, number of bins]
    for b in range(NUM_BINS):
        midpoint = (b + 0.5) / NUM_BINS
        weight = trials[b] + PRIOR_TRIALS
        blocks.append([(accepted[b] + PRIOR_TRIALS * midpoint) / weight, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            rate, weight, count = blocks.pop()
            last = blocks[-1]
            total = last[1] + weight
            last[0] = (last[0] * last[1] + rate * weight) / total
            last[1] = total
            last[2] += count
    table = []
    for rate, _, count in blocks:
        table.extend([min(MAX_ACCEPTANCE, rate)] * int(count))
    return table


class DraftChances:
    """One propose call's bookkeeping for a draft model that stops by confidence (eagle.py,
    draft_model.py): per request, its drafts' probabilities and the chance that all of them so
    far survive (calibrated; without a calibration, the probability itself)."""

    def __init__(self, calibration: ConfidenceCalibration | None, req_ids: list[str]) -> None:
        self.calibration = calibration
        self.token_probs: dict[str, list[float]] = {req_id: [] for req_id in req_ids}
        self.confidence: dict[str, list[float]] = {req_id: [] for req_id in req_ids}

    def keep(self, request: ProposalRequest, prob: float) -> bool:
        """Whether the request's next draft (probability prob) is kept: always its first; a later
        one while the chance that all survive stays at or above its min_confidence."""
        first = not self.confidence[request.req_id]
        chance = self.calibration.acceptance(prob) if self.calibration is not None else prob
        if not first and self.calibration is not None:
            self.calibration.observe_next(chance)
        survive = (1.0 if first else self.confidence[request.req_id][-1]) * chance
        if not first and survive < request.min_confidence:
            return False
        self.token_probs[request.req_id].append(prob)
        self.confidence[request.req_id].append(survive)
        return True

    def worth_another(self, request: ProposalRequest) -> bool:
        """Whether a further position could pay: the chance so far times the draft expected there."""
        next_chance = self.calibration.next_chance if self.calibration is not None else 1.0
        return self.confidence[request.req_id][-1] * next_chance >= request.min_confidence

    def proposal(self, req_id: str, token_ids: list[int], alternatives: list[int] | None = None) -> Proposal:
        confidence = self.confidence.get(req_id, [])
        return Proposal(token_ids, expected_accepted=sum(confidence), confidence=confidence,
                        alternatives=alternatives or [], token_probs=self.token_probs.get(req_id, []))
