"""Which proposer drafts for a request, and how many tokens: the speculation policy.

Every drafted token is a bet: it gains a token if the target accepts it and costs seconds either
way (verifying it and, for a draft model, producing it). The controller prices both from
measurements and drafts only the tokens that pay (the arithmetic is in policy.py):

- Cost: the model runner reports every target step's wall time, token count and attention work;
  a StepCostModel fits t = a + b * tokens + c * keys read, so one more verified token of a request
  at context L costs b + c * L seconds (about 0 on a GPU at small batch, a few percent of a step
  on a CPU at batch 8, and more at long contexts, where attention dominates). The controller times
  every draft-model call; a DraftCostModel fits its seconds = fixed + per_depth * positions drafted
  in sequence + per_token * tokens: the draft model's run is priced per step and per position,
  its tokens per token (policy.DraftRun). A step is not a line in its token count on a CPU whose
  few-row kernels run 1-8 rows at one row's cost and then pay a pass per 8 rows more: in a batch,
  a plan is priced again by the steps seen at its token counts (the secant from a plain step,
  cost_model.py's surcharge) and the plan with the most tokens per second by those steps, no
  drafts included, is taken (_price_by_steps_seen). Where the runner swept the step by row count
  when it built speculation (engine/worker/step_sweep.py; StepCostModel.sweep: the sweep's shape
  at the level of the steps seen), every row count is priced from the first step, and a batch's
  plan is the one with the most tokens per second with its step read off that table
  (_plan_batch; the rows a stair leaves free cost almost nothing, the row past it a pass over
  the weights).
- Gain: the probability the token is accepted. Each request keeps, per proposer, a decaying count
  of accepted drafts and of verification trials (a draft is a trial when every draft before it was
  accepted), and p = (accepted + PRIOR_TRIALS * pooled) / (trials + PRIOR_TRIALS) is the chance
  that one more draft survives (pooled: the same counts over all requests; the request's own
  evidence moves it, a short run of rejections does not switch it off), and the j-th draft
  of a draft model gains p^j. Suffix drafts are counted as a first draft and its continuation
  apart (rates(): a repeated stretch goes on or ends at once), so the j-th gains
  first * continued^(j-1); they also carry their vote's own confidence, and the gain is the
  smaller of the two. Suffix drafts followed in a fixed corpus (corpus.py; Proposal.from_corpus;
  source "corpus", apart from the context's and recent outputs', SUFFIX_SOURCES) are priced by
  their votes instead (VOTE_CALIBRATED): the chance of each is learnt, pooled, from its vote's
  share and its position (calibration.py's VoteCalibration), where the request's rates told a
  corpus draft that would be accepted from one that would not no better than chance; their
  verifications go there and keep no rates. A pooled suffix rate below the prior that no
  verification tries moves back toward the prior, plan by plan (UNTRIED_DECAY), or a few early
  rejections could keep it low, and so untried, for good.
- Decision: a token is drafted while its gain pays its cost at plain decoding's tokens per second,
  the draft model runs to the depth that makes the most tokens per second (or not at all), and
  what the drafts add to a request's step (they delay it too) must be paid by what its own drafts
  in it are expected to gain it (at most what they gained per verification lately) and its
  standing gain: the drafted tokens the target accepted for it per step over its recent steps
  (those without drafts count 0), with a fading prior at the rate pooled over all requests
  (policy.py's fairness gate). Steps on which the standing gains alone buy no drafted token skip
  proposing and planning but on probe steps; a plan's least cost being one verified token plus
  proposing and planning it (measured per step: proposing_seconds), a budget that buys a token
  but not the work of finding it is shut too.
  With a swept step, a batch proposes while what its accepted drafts were worth (a token: a plain
  step over the batch) has paid what proposing them cost (proposing and planning, and the rows
  they added), over the steps that proposed; else it skips proposing and explores once every
  few steps (_proposing_does_not_pay), the draft model left out. Alone in a step, a request's
  plan is the candidate and count that make the most tokens per second, each step priced by the
  steps seen at its number of rows (_plan_alone): a CPU's step is a staircase in its rows, which
  the slope prices as a line.
  "hybrid" takes, per request, whichever proposer's plan nets more. A request left without drafts
  for PROBE_EVERY steps probes with one on a probe step (every PROBE_EVERY-th, the same steps for
  all, so a draft model starts once for every probe; spaced out further while a probe step would
  cost more than PROBE_SHARE of the steps between two), so its estimate can recover when its text
  turns predictable (a probe is always allowed: without it an estimate could never recover).
  Each probe the target rejects doubles the request's probe interval, up to MAX_PROBE_INTERVAL
  (it then probes on steps that are multiples of its interval, so the probe steps of a longer
  interval are probe steps of every shorter one and the draft model still starts once for all);
  an accepted probe, or drafts the plan chose, bring it back to PROBE_EVERY.
- Alternatives (a draft model that can name runners-up for its first token; verified by
  engine/worker/alternatives.py in two rows each): the r-th runner-up gains a token when the
  target's token is exactly it, which happens at a pooled, decaying rate per rank; it is asked for
  while that rate pays for its two rows at break-even (a pooled rank that stopped paying is
  probed every PROBE_EVERY steps, by one request that drafts). What the paying ones net is added
  to the first draft's gain, so a draft run can pay through its alternatives.
- Confidence (a draft model that knows it, supports_confidence: the EAGLE head): the plan says
  which requests the draft model drafts for and how deep at least; the head then stops each
  request's drafts where the chance that all of them are accepted (its own probability of each
  token, calibrated online: calibration.py) falls below the break-even gain of one more token,
  and a request alone drafts on up to its cap while that chance pays (_confidence_floors).
  Alone, it also runs on steps where the plan drafts nothing, while its tokens' acceptance over
  all requests' recent verifications pays (_head_pays_alone): the request's own rate falls after
  a few rejections that say little about the next draft, and the head's confidence tells its
  sure drafts apart.
- A draft model only runs for the requests it drafts for; it catches up on the tokens it skipped
  when it drafts again (draft_model.py, eagle.py), so a switched-off draft costs little (an EAGLE
  head keeps the target's states of every row, one copy a step). An EAGLE head's catch-up over
  positions it skipped is not billed to its drafts' price per token: it is what staying ready
  costs. A batch's account of what proposing costs (_account_proposing) does include it: after
  steps the account skipped, it is what proposing again costs.

Caps: a draft model drafts at most num_speculative_tokens per request per step, suffix matching
at most num_suffix_tokens (longer: its drafts cost no model compute, and where text repeats a
match runs long; on the agent workload at one stream, bf16, suffix drafting made 2.76x with a cap
of 4, 3.10x with 8 and 3.64x with 16, docs/speculative.md), a cap that shrinks in a batch
(suffix_cap).

adaptive=False: every proposer drafts up to its cap, always.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from engine.config import SpeculativeConfig
from engine.spec_decode.calibration import ConfidenceCalibration, VoteCalibration
from engine.spec_decode.cost_model import DraftCostModel, StepCostModel
from engine.spec_decode.policy import TOLERANCE, Candidate, DraftRun, break_even_gain, gate_shut, plan_step
from engine.spec_decode.proposer import Proposal, ProposalRequest
from engine.spec_decode.suffix import SuffixProposer

REQUEST_DECAY = 0.8  # weight of a request's past verifications per new one (recent text counts most)
POOLED_DECAY = 0.95  # the same for the estimate pooled over all requests (a new request's prior)
# Suffix evidence ages with the steps too. The pooled counts decay per verification, so while a
# rate is not tried its accepted / trials ratio stands still; and it is the rate that decides
# whether it is tried: in hybrid chat, a few early suffix rejections set the pooled first-draft
# rate at 0.25-0.3, the head then won the plan at nearly every step, the rate was rarely tried
# again, and one fresh engine's round ran 576-596 steps where another, whose early suffix drafts
# went well, ran 549 (the same 8 prompts, 807 tokens, float32: rounds of ~1.24x against ~1.32x).
# So on every planned step a pooled suffix rate (the first draft's, the later ones') that no
# verification tried moves back toward the prior by this much: about 7 such steps halve the
# past's weight; one tried on every step keeps its plain per-verification decay. With 0.97, five
# fresh rounds ran 538-549 steps; with 0.9, 527-535 (0.8: 520-537; 0.99 split again, 541-585),
# and side by side 0.9 made 1.228x of `none` against 0.97's 1.222x (6 rounds, 5 of them ahead).
# The draft model's rate is left to its probes, which back off while they are rejected
# (PROBE_EVERY below), and alone to its calibrated confidence.
UNTRIED_DECAY = 0.9
# Weight, in trials, of the pooled estimate in every request's; unlike the request's own counts
# it never decays. Replaying the shipped head's first drafts (one per step, 8 prompts each, bf16):
# a chat draft's acceptance does not depend on the previous one's (0.22 after an accepted draft,
# 0.21 after a rejected one, 0.24 after three rejections), a code draft's does a little (0.50,
# 0.42, 0.32). Predicting each next outcome, the earlier estimate (a prior of 2 trials decaying
# with the request's counts) scored worst of those tried (log-loss chat 0.61, code 0.72); a
# standing prior of 8 trials scores near the best for both (0.53, 0.67; the pooled rate alone:
# 0.52, 0.69). A request left to its own few recent trials turned its drafts off after a run of
# rejections that said nothing about the next one.
PRIOR_TRIALS = 8.0
MAX_ACCEPTANCE = 0.99  # a draft is never sure: keeps p^j decreasing
PROBE_EVERY = 16  # steps between single-draft probes of a request left without drafts
# The longest wait between one request's probes, after rejected ones. At 8 streams on a CPU a
# probe step costs a quarter to a third of a step more (the draft model's run, 8 more verified
# tokens): probing every PROBE_EVERY steps took 1.5% of a chat batch's time (float32), where the
# head's drafts rarely paid.
MAX_PROBE_INTERVAL = 8 * PROBE_EVERY
# Share of a batch's time that probing may take: probe steps are PROBE_EVERY steps apart, doubled
# (up to MAX_PROBE_INTERVAL) while a probe step's price, every request probing, is more than this
# share of the steps between two of them. At 8 chat streams on a CPU, where the head's drafts
# rarely pay, probe steps every PROBE_EVERY (backing off per request as below) cost the draft
# engine 1.3% of its time (float32: 0.975x of none against 0.99x without probes); four times
# fewer, 0.99x. Alone on a step of a weight-bound CPU they cost about this share at PROBE_EVERY.
PROBE_SHARE = 0.005
# Alone (one request in the step), a plan is priced by the step table (StepCostModel.envelope)
# once a step of at most this many rows was seen (_plan_alone). A CPU's step is a staircase in its
# rows: one pass of hybrid code at one stream (float32, AVX2 EPYC; each row count's median step)
# took 19.6-19.9 ms at 1-3 rows, 21.3 at 6, 24.9 at 7 (the panel kernel's second pass over the
# weights) and 28.8 at 11, where the fitted slope priced every row at ~1.4 ms: the plan drafted a
# 6th corpus token on 24 of ~400 steps, 3.6 ms each for 0.9 tokens in all. Priced by the table,
# with corpus drafts priced by their votes (VOTE_CALIBRATED), code made 1.710x of none against
# 1.675x (three rounds side by side, each ahead: 1.825/1.796, 1.699/1.660, 1.710/1.675; another
# run 1.698x against 1.687x), agent turns 2.050x against 2.018x, chat 1.366x against 1.358x.
ALONE_TABLE_ROWS = 4
REPRICINGS = 3  # plans priced again by the steps seen (_price_by_steps_seen)
# A batch whose drafts have not paid for their proposing skips it, and explores (proposes anyway)
# on as few steps as keep what exploring costs (its measured proposing and the rows it added)
# within this share of the steps skipped, at most every MAX_EXPLORE_INTERVAL steps
# (_proposing_does_not_pay). Side by side (8 streams, 4 rounds, variants rotated over engines):
# 0.25% and 32, priced by the exploring steps' measured cost, made code 1.090x of none against
# 1.065x with PROBE_SHARE and PROBE_EVERY priced by proposing_seconds (every round ahead:
# 1.087/1.047, 1.067/1.033, 1.094/1.082, 1.141/1.099), chat 0.979x against 0.977x: exploring
# steps catch the suffix index up over the steps skipped and draft rows that rarely pay there.
EXPLORE_SHARE = 0.0025
MAX_EXPLORE_INTERVAL = 2 * PROBE_EVERY
# Exploring starts this many steps after the gate shuts and doubles its interval after every
# exploring step while the account stays unpaid (up to what EXPLORE_SHARE allows), back to this
# once it is paid: a batch's first steps tell little (a code answer repeats nothing yet), and at
# one exploring step every ~30 a group of 128-token answers explored ~4 times, so whether the
# account ever opened was chance (code rounds at 8 streams 0.96-1.09x of none). With probe
# steps no longer opening it either (they had made it explore every 16), side by side (8
# streams, variants rotated over engines, 4 rounds): code 1.115x against 1.022x (1.015-1.120
# against 0.981-1.092), chat 0.981x against 0.968x; chat again, 6 rounds: 0.977x against 0.972x.
FIRST_EXPLORE_INTERVAL = 4
# After an exploring step whose plan drafted nothing of its own (one first draft drafted all the
# same: _best_first_draft), the next is EXPLORE_SHARE's interval up to this many steps, not
# MAX_EXPLORE_INTERVAL: one draft is worth a plain step's seconds over the batch when accepted
# and costs the head's catch-up and pass (at 8 chat streams on an AMX Xeon ~3 ms, 26 ms steps),
# so such a step never pays the account back; it only keeps one request's rate measured.
MAX_FORCED_EXPLORE_INTERVAL = 4 * MAX_EXPLORE_INTERVAL
EXPLORE_DECAY = 0.8  # weight of the past in the measured cost of an exploring step
# Weight of a request's past steps in its standing gain (the fairness gate's): about the last 20
# steps count, long enough to span the gaps between a code answer's repeated stretches.
STANDING_DECAY = 0.95
# Weight, in steps, of the rate pooled over all requests' steps in a new request's standing gain:
# it starts from what requests are gaining (a code answer's first steps rarely repeat anything
# yet, though most of it will), and its own steps take over as the weight fades.
STANDING_PRIOR_STEPS = 8.0
# Weight of the past in the measured seconds of proposing and planning a step (the suffix
# proposer, the plan, without the draft model's run, which is priced by its own cost model).
PROPOSING_DECAY = 0.9
MAX_ALTERNATIVES = 3  # runners-up for a first draft at most (top-4 covers most of the head's hits)
ALTERNATIVE_PRIOR = 0.1  # a rank's hit rate before any was verified (weighing PRIOR_TRIALS, decaying)


@dataclass
class TokensPerStep:
    """Decaying counts of tokens gained (accepted drafts) and of steps, and the weight in steps
    of a prior rate (it fades like the counts)."""

    tokens: float = 0.0
    steps: float = 0.0
    prior_steps: float = 0.0

    def new_step(self, num_steps: float = 1.0) -> None:
        self.tokens *= STANDING_DECAY
        self.steps = STANDING_DECAY * self.steps + num_steps
        self.prior_steps *= STANDING_DECAY

    def rate(self, prior: float = 0.0) -> float:
        weight = self.steps + self.prior_steps
        return (self.tokens + self.prior_steps * prior) / weight if weight > 0 else prior


@dataclass
class Acceptance:
    """Decaying counts of accepted drafts and of trials; p = accepted / trials. The first draft
    of each verification is also counted apart (first_accepted / first_trials), so that the rate
    of the drafts after it, given the one before was accepted, is known too (first_p, continued_p)."""

    accepted: float
    trials: float
    first_accepted: float = 0.0
    first_trials: float = 0.0

    @property
    def p(self) -> float:
        return _rate(self.accepted, self.trials)

    @property
    def first_p(self) -> float:
        return _rate(self.first_accepted, self.first_trials)

    @property
    def continued_p(self) -> float:
        return _rate(self.continued_accepted, self.continued_trials)

    @property
    def continued_accepted(self) -> float:
        return self.accepted - self.first_accepted

    @property
    def continued_trials(self) -> float:
        return self.trials - self.first_trials

    def age_toward(self, prior: Acceptance, decay: float, *, first: bool, continued: bool) -> None:
        """Moves the first draft's counts (first) and the later drafts' (continued) toward the
        prior's, each as x <- decay * x + (1 - decay) * prior's x, where its rate is below the
        prior's."""
        continued_accepted, continued_trials = self.continued_accepted, self.continued_trials
        first = first and self.first_p < prior.first_p
        continued = continued and self.continued_p < prior.continued_p
        if first:
            self.first_accepted = decay * self.first_accepted + (1 - decay) * prior.first_accepted
            self.first_trials = decay * self.first_trials + (1 - decay) * prior.first_trials
        if continued:
            continued_accepted = decay * continued_accepted + (1 - decay) * prior.continued_accepted
            continued_trials = decay * continued_trials + (1 - decay) * prior.continued_trials
        self.accepted = self.first_accepted + continued_accepted
        self.trials = self.first_trials + continued_trials

    def update(self, num_drafted: int, num_accepted: int, decay: float) -> None:
        # Drafts after the first rejected one were never tried: they say nothing about p.
        trials = num_accepted + (1 if num_accepted < num_drafted else 0)
        self.accepted = decay * self.accepted + num_accepted
        self.trials = decay * self.trials + trials
        self.first_accepted = decay * self.first_accepted + (1 if num_accepted else 0)
        self.first_trials = decay * self.first_trials + 1


# Where every pooled rate starts, and where an untried one returns: 0.5 for the first draft and for
# the later ones, weighing one trial each.
POOLED_PRIOR = Acceptance(1.0, 2.0, 0.5, 1.0)
# Where suffix drafts come from, each learnt apart: the request's context and recent outputs
# ("suffix"), or the fixed corpus (corpus.py). A corpus's drafts follow the model's idiom in other
# answers, and on chat they were accepted far less often than the votes said; pooled with the
# context's, they pulled agent turns' estimates down too.
SUFFIX_SOURCES = ("suffix", "corpus")
# Suffix sources whose drafts are priced by their votes' calibrated shares (VoteCalibration)
# rather than by accepted/trials rates; the other methods (RATED) keep rates per request and pooled.
VOTE_CALIBRATED = ("corpus",)
RATED = tuple(method for method in (*SUFFIX_SOURCES, "draft") if method not in VOTE_CALIBRATED)


class SpeculationController:
    def __init__(self, config: SpeculativeConfig, *, suffix: SuffixProposer | None, draft=None,
                 step_sweep: dict[int, float] | None = None) -> None:
        """step_sweep: the target step's seconds by row count, swept by the runner
        (engine/worker/step_sweep.py): batches are then planned by the step table (_plan_batch)."""
        self.config = config
        self._step_sweep = dict(step_sweep or {})
        self.suffix = suffix
        self.draft = draft  # DraftModelProposer or None
        self._acceptance: dict[tuple[str, str], Acceptance] = {}  # (req_id, method) -> estimate
        self._method: dict[str, str] = {}  # req_id -> which proposer drafted its pending tokens
        self._idle_steps: dict[str, int] = {}  # req_id -> steps since it last got drafts or probed
        self._probe_interval: dict[str, int] = {}  # req_id -> its wait between probes, if not PROBE_EVERY
        self._probing: set[str] = set()  # requests whose pending drafts are a probe
        self._standing: dict[str, TokensPerStep] = {}  # req_id -> what its drafts gain it per step
        # req_id -> the proposer's probabilities of its pending drafts (a draft model's softmax, a
        # suffix vote's shares)
        self._token_probs: dict[str, list[float]] = {}
        self.proposer_seconds = 0.0
        self._start_learning()

    def _start_learning(self) -> None:
        """What is learnt across requests starts here: step and draft-model costs, and pooled
        acceptance (a prior of p = 0.5)."""
        self.cost = StepCostModel()
        self.cost.sweep(self._step_sweep)  # (a property of the machine, not learnt: kept by reset)
        self.draft_cost = DraftCostModel()
        self._pooled = {method: replace(POOLED_PRIOR) for method in RATED}
        # Which pooled suffix rates ("first", "continued") verifications tried since the last plan.
        self._suffix_tried: set[str] = set()
        # Per rank of runner-up: how often the target's token was exactly it (pooled).
        self._alternative_hits = [Acceptance(ALTERNATIVE_PRIOR * PRIOR_TRIALS, PRIOR_TRIALS)
                                  for _ in range(MAX_ALTERNATIVES)]
        # Adaptive steps planned: the probe steps of idle requests fall on multiples of their
        # (budgeted) interval, those of the runner-up rank past the paying ones on multiples of
        # PROBE_EVERY.
        self._planned_steps = 0
        # Batch sizes that drafted before a plain step of theirs was seen (_price_by_steps_seen).
        self._drafted_unseen: set[int] = set()
        # What proposing and planning a step costs (decaying mean of the steps that did it).
        self.proposing_seconds = 0.0
        self._pooled_standing = TokensPerStep()  # over all requests' steps
        # In a batch with the step swept (_proposing_does_not_pay): over the steps that proposed,
        # decaying alike, what their accepted drafts were worth (a token: a plain step's seconds
        # over the batch) and what they cost (proposing, planning, the draft model's run, the
        # step's added rows by the step table); and the worth of a token on the last of them.
        self._proposing_paid = 0.0
        self._proposing_cost = 0.0
        self._token_worth = 0.0
        self._shut_steps = 0  # steps skipped in a row by _proposing_does_not_pay
        self._explore_seconds = 0.0  # what an exploring step costs (decaying mean)
        self._explore_interval = FIRST_EXPLORE_INTERVAL  # (backing off while exploring finds nothing)
        self._explore_forced = False  # the last exploring step's plan drafted nothing of its own
        # The chance a draft model's token is accepted, given its own probability of it (pooled);
        # a draft model that stops by confidence reads it (calibration.py).
        self.calibration = ConfidenceCalibration()
        # Per suffix source, the chance its draft is accepted given its vote's share and position.
        self.votes = {source: VoteCalibration() for source in VOTE_CALIBRATED}
        if self._knows_confidence:
            self.draft.calibration = self.calibration

    @property
    def _knows_confidence(self) -> bool:
        """Whether the draft model stops its drafts by confidence (ProposalRequest.min_confidence)."""
        return self.draft is not None and getattr(self.draft, "supports_confidence", False)

    @property
    def _names_alternatives(self) -> bool:
        """Whether the draft model names runners-up for its first draft."""
        return self.draft is not None and getattr(self.draft, "supports_alternatives", False)

    @property
    def max_drafts(self) -> int:
        """The most tokens any of its proposers drafts for a request in a step."""
        return max(self.draft_tokens, self.suffix_tokens)

    @property
    def draft_tokens(self) -> int:
        """The draft model's cap per request per step (0: no draft model)."""
        return self.config.num_speculative_tokens if self.draft is not None else 0

    @property
    def suffix_tokens(self) -> int:
        """Suffix matching's cap per request per step (0: no suffix proposer)."""
        return self.suffix.max_drafts if self.suffix is not None else 0

    def suffix_cap(self, batch_size: int) -> int:
        """Suffix matching's cap this step: num_suffix_tokens alone, shrinking with the batch
        (num_suffix_tokens // batch_size), never under num_speculative_tokens (nor over
        num_suffix_tokens). In a batch, one request's long drafts are paid by every request of the
        step (they wait for their verification), and the fairness gate only keeps a request from
        getting slower than without speculation, not from losing its own drafts' gains to the
        others': at 8 streams (bf16, two scratch rounds) code and agent turns made 1.02-1.07x and
        1.21-1.23x with suffix drafts up to 16 against 1.11-1.13x and 1.35-1.37x with 4, while
        alone 16 made 3.64x on agent turns against 2.76x (docs/speculative.md, "Two caps")."""
        suffix_tokens = self.suffix_tokens
        floor = min(suffix_tokens, self.config.num_speculative_tokens)
        return max(floor, suffix_tokens // max(1, batch_size))

    # ---- measurements ------------------------------------------------------------------------
    def observe_step(self, num_tokens: int, seconds: float, attention: float = 0.0) -> None:
        """Wall time of one target step (forward, sampling, verification) over num_tokens tokens
        whose attention read `attention` keys in all (cost_model.attention_work)."""
        self.cost.observe(num_tokens, seconds, attention)

    def record(self, req_id: str, num_drafted: int, num_accepted: int) -> None:
        """Verification result of the drafts a request proposed last step."""
        method = self._method.get(req_id)
        token_probs = self._token_probs.pop(req_id, None)
        if req_id in self._probing and num_drafted > 0:
            self._probing.discard(req_id)
            interval = self._probe_interval.get(req_id, PROBE_EVERY)
            if num_accepted:
                self._probe_interval.pop(req_id, None)
            else:
                self._probe_interval[req_id] = min(2 * interval, MAX_PROBE_INTERVAL)
        if num_drafted == 0 or method is None:
            return
        if req_id in self._standing:
            self._standing[req_id].tokens += num_accepted
            self._pooled_standing.tokens += num_accepted
        self._proposing_paid += num_accepted * self._token_worth
        if method in self.votes:
            if token_probs:
                self.votes[method].update(token_probs[:num_drafted], num_accepted)
            return
        self._estimate(req_id, method).update(num_drafted, num_accepted, REQUEST_DECAY)
        self._pooled[method].update(num_drafted, num_accepted, POOLED_DECAY)
        if method == "suffix":
            self._suffix_tried.add("first")
            if num_accepted and num_drafted > 1:  # a later draft was verified
                self._suffix_tried.add("continued")
        if method == "draft" and token_probs:
            self.calibration.update(token_probs[:num_drafted], num_accepted)

    def record_alternatives(self, alternatives: list[int], target_token: int) -> None:
        """The runners-up verified last step and the target's own token at their position."""
        for rank, token in enumerate(alternatives):  # one trial per rank: a hit or a miss
            self._alternative_hits[rank].update(1, int(token == target_token), POOLED_DECAY)

    def alternative_hit_rates(self) -> list[float]:
        return [estimate.p for estimate in self._alternative_hits]

    def acceptance(self, req_id: str, method: str) -> float:
        """The request's own decaying counts, shrunk toward the pooled estimate by PRIOR_TRIALS."""
        own = self._estimate(req_id, method)
        return _shrunk(own.accepted, own.trials, self._pooled[method].p)

    def rates(self, req_id: str, method: str) -> tuple[float, float]:
        """(first, continued) for a proposer's drafts to the request: the chance the first is
        accepted, and that each later one is, given the one before it was; each the request's own
        counts shrunk toward the pooled rate by PRIOR_TRIALS. The plan uses them for suffix
        drafts (the draft model's fall with depth about geometrically: it keeps p^j, and these
        rates for it measured no better, docs/speculative.md). A suffix draft is right or wrong
        as a whole more than token by token (the repeated stretch goes on, or the text went
        elsewhere at once), which one rate p^j gets wrong both ways: at 8 code streams with
        drafts up to 16 it expected 0.53 at the 6th-13th drafts, where 0.31-0.41 came (bf16), and
        drafting them lost to drafting 4."""
        own, pooled = self._estimate(req_id, method), self._pooled[method]
        return (_shrunk(own.first_accepted, own.first_trials, pooled.first_p),
                _shrunk(own.continued_accepted, own.continued_trials, pooled.continued_p))

    def _realized(self, req_id: str, method: str) -> float | None:
        """Tokens the method's drafts for the request gained per verification over its recent
        ones (decaying like its rates), or None before any was verified, and for sources priced by
        their votes, which keep no rates (Candidate.realized)."""
        estimate = self._acceptance.get((req_id, method))
        if estimate is None or estimate.first_trials <= 0:
            return None
        return estimate.accepted / estimate.first_trials

    def _estimate(self, req_id: str, method: str) -> Acceptance:
        estimate = self._acceptance.get((req_id, method))
        if estimate is None:
            estimate = self._acceptance[(req_id, method)] = Acceptance(0.0, 0.0)
        return estimate

    # ---- per step ----------------------------------------------------------------------------
    def propose(self, requests: list[ProposalRequest], batch_size: int) -> dict[str, Proposal]:
        """Drafts for the requests that will decode next, by req_id (a request left out drafts
        nothing: on a step the gate keeps shut, all are); request.num_drafts is set to what is
        actually drafted (the runner trims proposals to it)."""
        if not requests:
            return {}
        started = time.perf_counter()
        method = self.config.method
        unpriced = self.config.adaptive and not self.cost.identified
        if unpriced:
            # Until the step's price per token is known (the prefill and the first plain decode
            # step tell it), tokens look free and the plan would draft k for every request, and
            # ask every runner-up (two rows each): at 8 streams on a CPU that first step cost
            # over a step more for a fraction of a step's tokens. One draft each, no runners-up,
            # still supplies the spread of token counts the fit needs; and the draft model drafts
            # for one request at most (_one_unpriced_draft).
            for request in requests:
                request.num_drafts = min(request.num_drafts, 1)
        step_seconds, probe_every, standing, exploring = 0.0, PROBE_EVERY, {}, False
        if self.config.adaptive:
            mean_context = _mean_context(requests)
            step_seconds = self._plain_step_seconds(mean_context, batch_size)
            self._planned_steps += 1
            if batch_size >= 2 and self.cost.swept:
                # (A probe step does not open it: exploring is this gate's probe.)
                shut = not unpriced and self._proposing_does_not_pay(step_seconds)
            else:
                probe_every = self._probe_every(len(requests), mean_context, step_seconds)
                standing = self._standing_gains(requests)
                # The least a plan costs: one verified token, and proposing and planning it (the
                # suffix index, the vote, the plan: at 8 chat streams ~0.3-0.5 ms of a 29 ms step
                # on this CPU, on the steps where the gate's budget bought about one token).
                cheapest_plan = self.cost.token_seconds(0) + self.proposing_seconds
                probe_step = self._planned_steps % probe_every == 0
                shut = (not (unpriced or probe_step) and batch_size >= 2
                        and gate_shut(standing.values(), step_seconds, cheapest_plan))
            if shut:
                # (Nothing else on these steps: at 8 chat streams the gate is shut on ~95% of
                # them, and their Python runs with caches the step's weights streamed through.)
                self._skip_step(requests)
                self.proposer_seconds += time.perf_counter() - started
                return {}
            exploring = self._shut_steps > 0  # (see _proposing_does_not_pay and _plan)
            self._shut_steps = 0
            if batch_size >= 2 and self.cost.swept:
                probe_every = self._probe_every(len(requests), mean_context, step_seconds)
                standing = self._standing_gains(requests)
        if self.config.adaptive:
            self._age_untried()  # (steps the gate keeps shut do not count: no plan reads the rates)
        once = 0.0  # seconds of work done once per request, not a step's cost
        suffix = {}
        if method in ("suffix", "hybrid"):
            indexing = time.perf_counter()
            self.suffix.index_prompts(requests)
            once = time.perf_counter() - indexing
            suffix = self.suffix.propose(requests, self.suffix_cap(batch_size))
        alternatives = {} if unpriced or exploring else self._alternatives_to_ask(requests, batch_size, step_seconds)
        if self.config.adaptive:
            chosen = self._plan(requests, suffix, batch_size, step_seconds, alternatives, standing, probe_every,
                                exploring=exploring)
            if unpriced:
                chosen = _one_unpriced_draft(chosen, requests)
        else:  # everything, always: suffix where it has a proposal, else the draft model
            chosen = {r.req_id: ("suffix", r.num_drafts) if method == "suffix" or (
                          method == "hybrid" and suffix[r.req_id].token_ids)
                      else ("draft", min(r.num_drafts, self.draft_tokens)) for r in requests}
        proposals: dict[str, Proposal] = {}
        need_draft = []
        # Taken by the first request that drafts: two rows, on its own clock (the idle requests'
        # probe budget is for starting the draft model and verifying their tokens).
        probe_rank = self.config.adaptive and self._planned_steps % PROBE_EVERY == 0 and self._names_alternatives
        rooms = {request.req_id: request.num_drafts for request in requests}
        for request in requests:
            which, count = chosen[request.req_id]
            request.num_drafts = count
            request.num_alternatives = 0
            self._method[request.req_id] = which
            if which == "draft" and count > 0:
                request.num_alternatives = len(alternatives.get(request.req_id, ()))
                if probe_rank and request.num_alternatives < min(MAX_ALTERNATIVES, request.max_alternatives):
                    # One request probes the rank past the paying ones: the rate is pooled, and
                    # every probe costs two rows.
                    request.num_alternatives += 1
                    probe_rank = False
                need_draft.append(request)
            else:
                proposal = suffix.get(request.req_id, Proposal([]))
                proposals[request.req_id] = Proposal(proposal.token_ids[:count], None,
                                                     sum(proposal.confidence[:count]), proposal.confidence[:count])
                if count > 0 and which in self.votes:
                    self._token_probs[request.req_id] = proposal.token_probs[:count]
        draft_seconds = 0.0
        if need_draft:
            if self.config.adaptive and not unpriced and self._knows_confidence:
                self._confidence_floors(need_draft, rooms, batch_size, step_seconds)
            draft_started = time.perf_counter()
            drafted = self.draft.propose(need_draft)
            draft_seconds = time.perf_counter() - draft_started
            lengths = [len(p.token_ids) for p in drafted.values()]
            # Priced by the positions it ran: one that stops by confidence may have run a
            # position past its last kept draft (measured as depth, that pass would have
            # inflated the fit's fixed cost and kept the head off in steps where it pays).
            depth = max(max(lengths, default=0), getattr(self.draft, "positions_run", 0))
            # Not billed: an EAGLE head's KV-only passes over positions it skipped (eagle.py).
            billed = draft_seconds - getattr(self.draft, "kv_only_seconds", 0.0)
            self.draft_cost.observe(depth, sum(lengths), billed)
            proposals.update(drafted)
            for request in need_draft:
                proposal = drafted.get(request.req_id)
                request.num_drafts = min(request.num_drafts, len(proposal.token_ids) if proposal else 0)
                if proposal is not None and proposal.token_probs:
                    self._token_probs[request.req_id] = proposal.token_probs
        seconds = time.perf_counter() - started
        self.proposer_seconds += seconds
        self._note_proposing(seconds - draft_seconds - once)
        if self.config.adaptive and batch_size >= 2 and self.cost.swept:
            self._account_proposing(batch_size, step_seconds,
                                    sum(r.num_drafts + 2 * r.num_alternatives for r in requests),
                                    seconds - once, exploring)
        else:
            self._token_worth = 0.0  # (alone: its drafts are not the batch's account)
        return proposals

    def _note_proposing(self, seconds: float) -> None:
        """A step that proposed and planned took `seconds` outside the draft model's run."""
        if self.proposing_seconds <= 0.0:
            self.proposing_seconds = seconds
        else:
            self.proposing_seconds = PROPOSING_DECAY * self.proposing_seconds + (1 - PROPOSING_DECAY) * seconds

    def _confidence_floors(self, drafting: list[ProposalRequest], rooms: dict[str, int], batch_size: int,
                           step_seconds: float) -> None:
        """For a draft model that stops by confidence: each drafting request's min_confidence,
        the gain one more of its drafts must bring at break-even (verifying it, the draft model's
        price per token, and a share of one more position's pass: the pass serves every request
        still drafting, so each pays its share of it). Alone (batch_size 1), the plan's count is
        only where the drafts start: the request may draft up to its cap while the head is sure
        enough, since no other request waits for its tokens (in a batch they would, and the plan's
        fairness gate has budgeted what they may wait; there the floor only trims).
        Alone, the floor is for drafts after the first (always kept), so their verified tokens
        are priced by the steps seen with one draft and with more, up to the cap (the step
        table's secant, attention added), where two such were seen: the fitted slope is pulled
        up by long suffix drafts (17 rows cost 2.4 one-row steps on a CPU, where 2 to 5 rows
        cost about what 2 do), and priced by it the head stopped where its drafts still paid:
        chat at one stream 1.31x of none against 1.24x, code 1.69x against 1.66x (float32, AVX2
        EPYC, two rounds side by side).
        (What it gained in the speculative benchmark: docs/speculative.md, "Confidence".)"""
        depth_share = self.draft_cost.per_depth / len(drafting)
        row = self._alone_row_seconds() if batch_size == 1 else None
        for request in drafting:
            seconds = self._verify_seconds(request, row) + self.draft_cost.per_token + depth_share
            request.min_confidence = break_even_gain(step_seconds, batch_size, seconds)
            if batch_size == 1:
                request.num_drafts = min(rooms[request.req_id], self.draft_tokens)

    def _alone_row_seconds(self) -> float | None:
        """Alone, what a verified row past a step's first draft costs, attention excluded: the
        step table's secant from a step with one draft (2 tokens) to the furthest seen up to the
        draft model's cap (None while no two such were seen)."""
        secants = (self.cost.secant_seconds(2, n - 2) for n in range(self.draft_tokens + 1, 2, -1))
        return next((seconds for seconds in secants if seconds is not None), None)

    def _verify_seconds(self, request: ProposalRequest, row: float | None) -> float:
        """One more verified token of the request: row (_alone_row_seconds) plus its attention,
        or, without one, the fitted slope at its context."""
        context = _context_len(request)
        return self.cost.token_seconds(context) if row is None else row + self.cost.c * (context + 1)

    def _proposing_does_not_pay(self, step_seconds: float) -> bool:
        """In a batch with the step swept: whether this step skips proposing, because over the
        steps that proposed what their accepted drafts were worth was less than what proposing
        them cost (_account_proposing). step_seconds: plain decoding's step, attention included.
        Once every explore_every skipped steps it proposes anyway, so that the worth stays
        measured: as many as keep what an exploring step costs (measured: its proposing and the
        rows it added) within EXPLORE_SHARE of the steps skipped, at most MAX_EXPLORE_INTERVAL;
        sooner while the account is young: FIRST_EXPLORE_INTERVAL steps after it shuts, twice as
        many after each exploring step that left it unpaid.
        Before, the fairness gate (gate_shut) took the least standing gain over all steps,
        skipped ones counting nothing: once shut it stayed shut, and at 8 code streams drafts the
        target took 70% of the time were never proposed; opened by gross gains instead, at 8 chat
        streams it proposed for 4% more tokens a step that cost 5% more time (proposing 0.8 ms,
        rows 0.4, of a 26 ms step)."""
        if self._proposing_paid >= self._proposing_cost:
            self._explore_interval = FIRST_EXPLORE_INTERVAL
            return False
        if step_seconds <= 0:
            return False  # (nothing priced yet)
        explore_cost = self._explore_seconds if self._explore_seconds > 0 else self.proposing_seconds
        cap = MAX_FORCED_EXPLORE_INTERVAL if self._explore_forced else MAX_EXPLORE_INTERVAL
        explore_every = min(cap, self._explore_interval,
                            max(2, math.ceil(explore_cost / (EXPLORE_SHARE * step_seconds))))
        self._shut_steps += 1
        if self._shut_steps < explore_every:
            return True
        self._explore_interval = min(2 * self._explore_interval, cap)
        return False

    def _account_proposing(self, batch_size: int, step_seconds: float, num_rows_added: int, seconds: float,
                           exploring: bool) -> None:
        """A step in a batch proposed: its cost is `seconds` of proposing and planning (the draft
        model's run included, its catch-up over the positions it skipped too; not a request's
        first indexing of its prompt, paid once) and the rows it added to the step, by the step
        table. Until 2026-12-06 an EAGLE head's catch-up was left out as paid once; but after the
        steps the account skipped it is the price of proposing again, and side by side (8 streams,
        rotated, 4 rounds) billing it made chat 0.997x of none against 0.984x (the account had
        opened on chat drafts accepted 13-40% of the time), code 1.058x against 1.025x. What its
        drafts gain, each accepted token a plain step's seconds (step_seconds, attention
        included) over the batch, is added as they are verified (record). exploring: the step
        explored (what that costs prices exploring: _proposing_does_not_pay)."""
        steps = self.cost.envelope(batch_size + num_rows_added)
        cost = seconds + steps[batch_size + num_rows_added - 1] - steps[batch_size - 1]
        self._proposing_cost = STANDING_DECAY * self._proposing_cost + cost
        self._proposing_paid *= STANDING_DECAY
        self._token_worth = step_seconds / batch_size
        if exploring:
            self._explore_seconds = cost if self._explore_seconds <= 0 else (
                EXPLORE_DECAY * self._explore_seconds + (1 - EXPLORE_DECAY) * cost)

    def _plain_step_seconds(self, mean_context: float, batch_size: int) -> float:
        """Plain decoding's step: every running request one token, at its context (mean_context:
        the proposing requests'; those still prefilling are counted at it)."""
        return self.cost.step_seconds(batch_size, batch_size * mean_context)

    def _probe_every(self, num_requests: int, mean_context: float, step_seconds: float) -> int:
        """Steps between probe steps: PROBE_EVERY, doubled while a probe step (every request
        probing one token: its verification and the draft model's run) would cost more than
        PROBE_SHARE of the plain steps between two of them."""
        if step_seconds <= 0:
            return PROBE_EVERY
        seconds = num_requests * self.cost.token_seconds(int(mean_context))
        if self.draft is not None:
            seconds += self.draft_cost.seconds(1, num_requests)
        every = PROBE_EVERY
        while every < MAX_PROBE_INTERVAL and seconds > PROBE_SHARE * every * step_seconds:
            every *= 2
        return every

    def _alternatives_to_ask(self, requests: list[ProposalRequest], batch_size: int,
                             step_seconds: float) -> dict[str, list[float]]:
        """Per request that could get runners-up: the net gain, in tokens, of each one worth
        asking for (ranks in order; see the module docstring). step_seconds: plain decoding's."""
        eligible = [r for r in requests if r.max_alternatives > 0]
        if not self._names_alternatives or not eligible:
            return {}
        if not self.config.adaptive:
            return {r.req_id: [0.0] * min(MAX_ALTERNATIVES, r.max_alternatives) for r in eligible}
        hit_rates = self.alternative_hit_rates()
        chosen: dict[str, list[float]] = {}
        for request in eligible:
            # Two rows (the pair), each priced like one more verified token at its context. (Not
            # by _alone_row_seconds: the pairs' rows come after the chain's, where a CPU's rows
            # cost more again; priced by it, all three ranks were asked and one stream lost 4-6%.)
            threshold = break_even_gain(step_seconds, batch_size, 2 * self.cost.token_seconds(_context_len(request)))
            nets: list[float] = []
            for hit in hit_rates[: request.max_alternatives]:
                if hit < threshold:  # this rank and every later one (rates fall with rank)
                    break
                nets.append(hit - threshold)
            if nets:
                chosen[request.req_id] = nets
        return chosen

    def _age_untried(self) -> None:
        """Pooled suffix rates no verification tried since the last plan move toward the prior
        (UNTRIED_DECAY)."""
        first, continued = "first" not in self._suffix_tried, "continued" not in self._suffix_tried
        if first or continued:
            self._pooled["suffix"].age_toward(POOLED_PRIOR, UNTRIED_DECAY, first=first, continued=continued)
        self._suffix_tried.clear()

    def _skip_step(self, requests: list[ProposalRequest]) -> None:
        """A step the gate keeps shut: no proposer runs (the suffix index and a draft model
        catch up on these tokens when they next propose); the requests only wait toward their
        next probe. At 8 chat streams on a CPU the gate is shut on most steps, and proposing
        and planning for nothing cost 2-4% of each (hybrid: both proposers)."""
        for request in requests:
            request.num_drafts = 0
            request.num_alternatives = 0
            self._idle_steps[request.req_id] = self._idle_steps.get(request.req_id, 0) + 1

    def _plan(self, requests: list[ProposalRequest], suffix: dict[str, Proposal],
              batch_size: int, step_seconds: float, alternatives: dict[str, list[float]],
              standing: dict[str, float], probe_every: int, exploring: bool = False) -> dict[str, tuple[str, int]]:
        """(proposer, number of tokens) per request: see the module docstring. exploring: a
        step the account's gate explores (_proposing_does_not_pay). It leaves the draft model
        out where another proposer has a proposal: the draft model's run after skipped steps
        catches up on all of them (an EAGLE head at 8 chat streams: ~4 ms, a sixth of a step),
        to measure what is mostly measured alone anyway. And where the plan drafts nothing, the
        one first draft most likely accepted is drafted all the same (_best_first_draft)."""
        contexts = {r.req_id: _context_len(r) for r in requests}
        options: list[list[Candidate]] = []
        for request in requests:
            verify = self.cost.token_seconds(contexts[request.req_id])
            per_request: list[Candidate] = []
            if request.req_id in suffix:
                proposal = suffix[request.req_id]
                source = "corpus" if proposal.from_corpus else "suffix"
                if source in VOTE_CALIBRATED:
                    gains = self.votes[source].chances(proposal.token_probs[: request.num_drafts])
                else:
                    first, continued = self.rates(request.req_id, source)
                    confidence = proposal.confidence[: request.num_drafts]
                    gains = [min(c, first * continued ** j) for j, c in enumerate(confidence)]
                per_request.append(Candidate(request.req_id, gains, verify, source,
                                             self._realized(request.req_id, source)))
            if self.draft is not None and (not exploring or not per_request):  # (its only proposer: "draft")
                p = self.acceptance(request.req_id, "draft")
                gains = [p ** j for j in range(1, min(request.num_drafts, self.draft_tokens) + 1)]
                if gains:  # the runners-up ride on the first draft (first order: their net)
                    gains[0] += sum(alternatives.get(request.req_id, ()))
                per_request.append(Candidate(request.req_id, gains, verify + self.draft_cost.per_token, "draft",
                                             self._realized(request.req_id, "draft")))
            options.append(per_request)
        run = DraftRun(self.draft_cost.fixed, self.draft_cost.per_depth)
        plan = None
        if batch_size == 1 and len(requests) == 1:
            plan = self._plan_alone(options[0], _context_len(requests[0]), run)
        elif self.cost.swept and len(requests) == batch_size:
            plan = self._plan_batch(options, [contexts[r.req_id] for r in requests], standing, run)
        if plan is None:
            plan = plan_step(options, step_seconds=step_seconds, batch_size=batch_size, draft_run=run,
                             standing=standing)
            plan = self._price_by_steps_seen(plan, options, batch_size, step_seconds, run, standing)
        if exploring:
            self._explore_forced = not any(count for _, count in plan.values())
            if self._explore_forced:
                plan.update(_best_first_draft(options))
        rooms = {r.req_id: r.num_drafts for r in requests}
        head_alone = batch_size == 1 and self._head_pays_alone(requests[0], step_seconds)
        chosen: dict[str, tuple[str, int]] = {}
        self._probing.clear()
        for req_id, (candidate, count) in plan.items():
            which = candidate.method
            if count == 0 and head_alone and rooms[req_id] > 0:
                which, count = "draft", 1  # its confidence then sets the depth (_confidence_floors)
            if count > 0 or not candidate.gains:
                self._idle_steps.pop(req_id, None)
                if count > 0:
                    self._probe_interval.pop(req_id, None)
            else:
                idle = self._idle_steps.get(req_id, 0) + 1
                # On the same steps for every idle request: a draft model started for one probe
                # costs its whole start (at 8 streams, staggered probes ran the head on half of
                # all steps for one token each). Intervals are PROBE_EVERY times powers of 2.
                interval = max(self._probe_interval.get(req_id, PROBE_EVERY), probe_every)
                if self._planned_steps % interval == 0 and idle >= PROBE_EVERY:
                    count, idle = 1, 0
                    self._probing.add(req_id)
                self._idle_steps[req_id] = idle
            chosen[req_id] = (which, count)
        return chosen

    def _plan_alone(self, candidates: list[Candidate], context: int,
                    run: DraftRun) -> dict[str, tuple[Candidate, int]] | None:
        """Alone: the candidate and count that make the most tokens per second, each step priced
        by the steps seen at its number of rows (StepCostModel.envelope; its attention added):
        a CPU's step is a staircase in its rows, and the slope's break-even drafted into the next
        stair (see ALONE_TABLE_ROWS). None until a step of at most ALONE_TABLE_ROWS rows was seen,
        unless the step was swept."""
        known = self.cost.swept or any(self.cost.seen(n) for n in range(1, ALONE_TABLE_ROWS + 1))
        if not candidates or not known:
            return None
        steps = self.cost.envelope(1 + max(len(c.gains) for c in candidates))  # steps[n - 1]: n rows
        attention = self.cost.c * (context + 1)  # per row
        best, best_rate = (candidates[0], 0), 1.0 / (steps[0] + attention)
        for candidate in candidates:
            gained = 0.0
            for count, gain in enumerate(candidate.gains, 1):
                gained += gain
                seconds = steps[count] + attention * (1 + count)
                if candidate.method == "draft":
                    seconds += run.seconds(count) + count * self.draft_cost.per_token
                rate = (1.0 + gained) / seconds
                if rate > best_rate:
                    best, best_rate = (candidate, count), rate
        return {best[0].req_id: best}

    def _plan_batch(self, options: list[list[Candidate]], contexts: list[int], standing: dict[str, float],
                    run: DraftRun) -> dict[str, tuple[Candidate, int]]:
        """In a batch, with the step swept (StepCostModel.sweep): the plan with the most tokens per
        second, each step priced by the step table at its rows (the envelope; attention added per
        row), among the fair ones. For each depth the draft model could run to (0: not at all),
        each request takes the candidate that gains more within it; their tokens are taken best
        first (gains never increase along a candidate, so each request's are a prefix), and the
        best count of them wins. Fair: the step's extra seconds are paid, for every request, by
        what its own tokens in the plan are expected to gain it (Candidate.own_gain), its
        standing gain and the tolerance (policy.py's fairness gate). Priced by the slope instead,
        a step's rows past the batch all cost a row's average: at 8 streams on an AVX2 EPYC
        (float32) the 4 rows after 8 cost 1.2 ms for all of them, 4% of the step, where the
        slope priced each at about 1.4 ms and the gate let none through."""
        batch_size = len(options)
        attention = [self.cost.c * (context + 1) for context in contexts]  # per row of each request
        longest = sum(max((len(c.gains) for c in per_request), default=0) for per_request in options)
        steps = self.cost.envelope(batch_size + longest)  # steps[n - 1]: a step of n rows
        plain = steps[batch_size - 1] + sum(attention)
        budgets = [plain * (standing.get(per_request[0].req_id, 0.0) + TOLERANCE) for per_request in options]
        # Drafting nothing: each request's first candidate with drafts (its probe's, _plan).
        idle = [next((c for c in per_request if c.gains), per_request[0]) for per_request in options]
        best = {candidate.req_id: (candidate, 0) for candidate in idle}
        best_rate = batch_size / plain
        max_depth = max((len(c.gains) for per_request in options for c in per_request if c.method == "draft"),
                        default=0)
        improved_at = 0  # the last depth whose plan was the best so far
        for depth in range(max_depth + 1):
            if depth > improved_at + 1:
                # A run one position shallower did not pay: deeper ones, paying that run and
                # more, for tokens less likely than those, are not tried (half of planning's
                # time at 8 streams went to depths that never paid).
                break
            picks: list[tuple[Candidate, int] | None] = []
            for per_request in options:
                usable = [(c, min(depth, len(c.gains)) if c.method == "draft" else len(c.gains)) for c in per_request]
                usable = [(c, n) for c, n in usable if n > 0]
                picks.append(max(usable, key=lambda cn: sum(cn[0].gains[: cn[1]])) if usable else None)
            tokens = sorted(((pick[0].gains[j], j, i) for i, pick in enumerate(picks) if pick is not None
                             for j in range(pick[1]) if pick[0].gains[j] > 0), key=lambda t: (-t[0], t[1], t[2]))
            counts = [0] * batch_size
            # What each request may wait, in seconds: its budget and its own tokens' gain so far.
            pays = list(budgets)
            gained = 0.0
            seconds_less_rows = plain - steps[batch_size - 1]  # attention, the draft model's run
            deepest = 0
            for added, (gain, j, i) in enumerate(tokens, 1):
                if j != counts[i]:  # (never: each request's tokens come in order)
                    break
                counts[i] += 1
                pays[i] = budgets[i] + plain * picks[i][0].own_gain(counts[i])
                gained += gain
                seconds_less_rows += attention[i]
                if picks[i][0].method == "draft":
                    seconds_less_rows += self.draft_cost.per_token
                    if j + 1 > deepest:  # the run goes a position deeper
                        seconds_less_rows += run.seconds(j + 1) - run.seconds(deepest)
                        deepest = j + 1
                seconds = steps[batch_size + added - 1] + seconds_less_rows
                rate = (batch_size + gained) / seconds
                if rate <= best_rate * (1 + 1e-12):
                    continue
                extra = (seconds - plain) * (1 - 1e-9)  # (rounding)
                if extra <= min(pays):
                    best_rate, improved_at = rate, depth
                    best = {candidate.req_id: (picks[k][0], counts[k]) if counts[k] else (candidate, 0)
                            for k, candidate in enumerate(idle)}
        return best

    def _head_pays_alone(self, request: ProposalRequest, step_seconds: float) -> bool:
        """Alone, whether a draft model that stops by confidence should run whenever the plan
        drafts nothing: its tokens, at the rate the target accepted them over the calibration's
        last ~200 verifications, pay for a verified token and a run of the draft model to depth
        1. The request's own rate decides too little: after a few rejections it fell to 0.17-0.29
        where the head's next first draft was accepted about as often as any (0.32-0.50 on code,
        calibration.py), and the plan ran plain steps there while the head's own confidence
        would have told a sure draft from a guess. The pooled rate (about the last 20
        verifications) fell as low in runs of rejections. With this rule, code at one stream made
        1.64x of none against 1.56x without it (float32, AVX2 EPYC, two rounds side by side; chat
        1.25x against 1.22x, agent turns 2.13x against 2.12x); it keeps a head that is mostly
        wrong (or whose costs here are out of proportion) off."""
        if not (self._knows_confidence and self.config.adaptive) or step_seconds <= 0:
            return False
        seconds = self.cost.token_seconds(_context_len(request)) + self.draft_cost.seconds(1, 1)
        return self.calibration.overall >= break_even_gain(step_seconds, 1, seconds)

    def _price_by_steps_seen(self, plan: dict[str, tuple[Candidate, int]], options: list[list[Candidate]],
                             batch_size: int, step_seconds: float, run: DraftRun,
                             standing: dict[str, float]) -> dict[str, tuple[Candidate, int]]:
        """The slope prices a token as if a step were a line in its token count; a CPU's is a
        staircase (its few-row kernels run 1-8 rows at one row's cost, then pay a pass per 8
        more). So the plan is priced again by the steps seen (cost_model.py's surcharge: the
        secant from a plain step to one with the plan's tokens), up to REPRICINGS times, and of
        the plans found, and no drafts at all, the one whose tokens per second by those steps is
        highest is taken. A batch size whose plain step was never seen drafts once as priced, then
        runs one plain step (the base of every secant)."""
        if (batch_size < 2 or step_seconds <= 0 or not self.cost.identified
                or not any(count for _, count in plan.values())):
            # Nothing priced yet: the first drafts are how the line gets fitted. Alone, the plan's
            # count is not what runs (a confident head drafts on, _confidence_floors), and the
            # slope's plans measured better: code at one stream, one round, float32, AVX2 EPYC,
            # hybrid 1.61x against 1.38x priced by the steps seen.
            return plan
        plain = {req_id: (candidate, 0) for req_id, (candidate, _) in plan.items()}
        if not self.cost.seen(batch_size):
            # The first plan at a batch size drafts as priced (its drafts' acceptance is what
            # opens the fairness gate), the next one runs plain once, to be the base.
            if batch_size in self._drafted_unseen:
                return plain
            self._drafted_unseen.add(batch_size)
            return plan
        best, best_rate = plain, self._rate_by_steps_seen(plain, batch_size, run)
        tried: set[int] = set()
        for _ in range(REPRICINGS):
            drafted = sum(count for _, count in plan.values())
            rate = self._rate_by_steps_seen(plan, batch_size, run)
            if rate > best_rate:
                best, best_rate = plan, rate
            surcharge = self.cost.surcharge(batch_size, drafted)
            if drafted == 0 or drafted in tried or surcharge <= 0:
                break
            tried.add(drafted)
            repriced = [[replace(c, token_seconds=c.token_seconds + surcharge) for c in per_request]
                        for per_request in options]
            plan = plan_step(repriced, step_seconds=step_seconds, batch_size=batch_size, draft_run=run,
                             standing=standing)
        return best

    def _rate_by_steps_seen(self, plan: dict[str, tuple[Candidate, int]], batch_size: int,
                            run: DraftRun) -> float:
        """Expected tokens per second of a plan, its step's seconds read off the steps seen (from the
        plain step, which was seen, by the slope where the table does not reach: more tokens than
        any step seen)."""
        drafted = sum(count for _, count in plan.values())
        seconds = self.cost.table_seconds(batch_size + drafted)
        if seconds is None:
            seconds = self.cost.table_seconds(batch_size) + self.cost.b * drafted
        gained = sum(sum(candidate.gains[:count]) for candidate, count in plan.values())
        depth = max((count for candidate, count in plan.values() if candidate.method == "draft"), default=0)
        return (batch_size + gained) / max(seconds + run.seconds(depth), 1e-9)

    def _standing_gains(self, requests: list[ProposalRequest]) -> dict[str, float]:
        """Per request, the drafted tokens the target accepted for it per step over its recent
        steps, this one included (steps without drafts gain nothing), with a prior of
        STANDING_PRIOR_STEPS steps at the rate pooled over all requests' steps, which fades like
        its own counts (a request whose drafts never pay ends up gating the batch however well
        the others' do). Measured rather than expected: acceptance estimates lean on the pooled
        rate while a request's own trials are few, and at 8 chat streams that put the requests
        that set a batch's pace at 0.1-0.16 tokens a step where their drafts made 0.02 (3 of 22
        accepted): drafting slowed the batch by 4%. (In a batch with the step swept, only the steps
        that proposed count: the others skip this.)"""
        pooled = self._pooled_standing
        pooled.new_step(len(requests))
        prior = pooled.rate()
        standing = {}
        for request in requests:
            own = self._standing.get(request.req_id)
            if own is None:
                own = self._standing[request.req_id] = TokensPerStep(prior_steps=STANDING_PRIOR_STEPS)
            own.new_step()
            standing[request.req_id] = own.rate(prior)
        return standing

    def reset(self) -> None:
        """Forgets what earlier requests taught: pooled acceptance, measured step and draft-model costs,
        the suffix index of their outputs. A fresh engine's state, so a benchmark can compare methods
        on the same prompts without building engines again. Only between requests."""
        if self._method or self._acceptance or self._standing:
            raise RuntimeError("reset_speculation needs an idle engine: requests are running")
        self._start_learning()
        if self.suffix is not None:
            self.suffix.forget_outputs()

    def finish(self, req_id: str, output_token_ids: list[int] | None) -> None:
        for method in RATED:
            self._acceptance.pop((req_id, method), None)
        self._idle_steps.pop(req_id, None)
        self._standing.pop(req_id, None)
        self._probe_interval.pop(req_id, None)
        self._probing.discard(req_id)
        self._method.pop(req_id, None)
        self._token_probs.pop(req_id, None)
        if self.suffix is not None:
            self.suffix.finish(req_id, output_token_ids)
        if self.draft is not None:
            self.draft.finish(req_id, output_token_ids)


def _best_first_draft(options: list[list[Candidate]]) -> dict[str, tuple[Candidate, int]]:
    """{req_id: (its candidate, 1)} for the candidate whose first draft is the likeliest accepted
    of all, or {} where none has a draft."""
    candidates = [c for per_request in options for c in per_request if c.gains]
    if not candidates:
        return {}
    best = max(candidates, key=lambda c: c.gains[0])
    return {best.req_id: (best, 1)}


def _one_unpriced_draft(chosen: dict[str, tuple[str, int]], requests: list[ProposalRequest],
                        ) -> dict[str, tuple[str, int]]:
    """An unpriced step's plan with the draft model drafting for one request at most, the one with
    the shortest context: its first draft for a request is a catch-up over the whole context (an
    EAGLE head's over every prompt position), and at 8 streams a fresh engine's first decode step
    drafting for all of them took 55-68 ms where a plain step took 31 (float32, AVX2 EPYC), on
    a batch where the head's drafts then rarely paid. One request's draft still gives the fit its
    spread of token counts, where the suffix proposals give none."""
    drafting = [r for r in requests if chosen[r.req_id][0] == "draft" and chosen[r.req_id][1] > 0]
    keep = min(drafting, key=_context_len, default=None)
    return {req_id: (which, 0) if which == "draft" and keep is not None and req_id != keep.req_id
            else (which, count) for req_id, (which, count) in chosen.items()}


def _rate(accepted: float, trials: float) -> float:
    """accepted / trials, capped; 0.5 before any trial."""
    return min(MAX_ACCEPTANCE, accepted / trials) if trials > 0 else 0.5


def _shrunk(accepted: float, trials: float, prior: float) -> float:
    """A request's own rate, with PRIOR_TRIALS trials at the prior rate."""
    return min(MAX_ACCEPTANCE, (accepted + PRIOR_TRIALS * prior) / (trials + PRIOR_TRIALS))


def _context_len(request: ProposalRequest) -> int:
    return len(request.prompt_token_ids) + len(request.output_token_ids)


def _mean_context(requests: list[ProposalRequest]) -> float:
    return sum(_context_len(r) for r in requests) / len(requests)
