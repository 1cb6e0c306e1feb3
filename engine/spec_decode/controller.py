"""Which proposer drafts for a request, and how many tokens: the speculation policy.

- "draft" and "suffix" use one proposer; "hybrid" asks the (cheap) suffix proposer first and
  keeps its drafts unless the draft model's recent record for that request expects more accepted
  tokens by more than the draft model's cost (DRAFT_TOKEN_COST per drafted token).
- Suffix drafts cost no model compute and stop by themselves where their vote gets uncertain,
  so they get the full k (scaled by batch size only).
- Draft-model drafts cost a draft forward each, and verifying them costs more as the batch
  grows (a step's cost grows with its tokens once the matmuls stop being bandwidth-bound). Each
  request keeps an exponential moving average a of its draft acceptance; since the i-th draft
  survives with probability about a^i, the model drafts while a^i stays at or above a survival
  threshold that rises with the batch (0.4 alone, 0.6 from 8 running requests, 0.8 from 24).
  When not even one draft clears it, the request decodes plainly and probes with a single draft
  every PROBE_EVERY steps, so a request whose text turns predictable gets its drafts back.
- k itself is halved from 8 running requests and quartered from 24.
"""

from __future__ import annotations

import math
import time

from engine.config import SpeculativeConfig
from engine.spec_decode.proposer import Proposal, ProposalRequest
from engine.spec_decode.suffix import SuffixProposer

# (smallest batch, survival threshold of a draft-model token), largest batch first.
SURVIVAL_BY_BATCH = ((24, 0.8), (8, 0.6), (1, 0.4))
EMA_WEIGHT = 0.3  # weight of the newest step in a request's acceptance average
INITIAL_ACCEPTANCE = 0.5  # prior before a request has been verified
# What one draft-model token costs, in target tokens of expected gain: hybrid takes the model's
# drafts only when they expect more accepted tokens than the suffix's by more than their cost.
DRAFT_TOKEN_COST = 0.15
# Batch sizes from which k is halved, and quartered (CPU and GPU alike: conservative).
HALVE_AT_BATCH = 8
QUARTER_AT_BATCH = 24
PROBE_EVERY = 8  # steps between single-draft probes of a request the draft model is off for


class SpeculationController:
    def __init__(self, config: SpeculativeConfig, *, suffix: SuffixProposer | None, draft=None) -> None:
        self.config = config
        self.suffix = suffix
        self.draft = draft  # DraftModelProposer or None
        self._acceptance: dict[str, float] = {}  # req_id -> EMA of the draft model's acceptance
        self._method: dict[str, str] = {}  # req_id -> which proposer drafted its pending tokens
        self._idle_steps: dict[str, int] = {}  # req_id -> steps since the draft model last drafted for it
        self.proposer_seconds = 0.0

    @property
    def max_drafts(self) -> int:
        return self.config.num_speculative_tokens

    # ---- per step ----------------------------------------------------------------------------
    def record(self, req_id: str, num_drafted: int, num_accepted: int) -> None:
        """Verification result of the drafts a request proposed last step."""
        if num_drafted == 0 or self._method.get(req_id) != "draft":
            return
        rate = num_accepted / num_drafted
        previous = self._acceptance.get(req_id, INITIAL_ACCEPTANCE)
        self._acceptance[req_id] = (1 - EMA_WEIGHT) * previous + EMA_WEIGHT * rate

    def num_drafts(self, batch_size: int) -> int:
        """The most tokens any proposer may draft for this request this step (batch-scaled k)."""
        k = self.max_drafts
        if not self.config.adaptive:
            return k
        if batch_size >= QUARTER_AT_BATCH:
            return max(1, k // 4)
        if batch_size >= HALVE_AT_BATCH:
            return max(1, k // 2)
        return k

    def num_model_drafts(self, req_id: str, k: int, batch_size: int) -> int:
        """How many of k tokens the draft model should draft: those likely to survive (0: none)."""
        if not self.config.adaptive:
            return k
        rate = min(self._acceptance.get(req_id, INITIAL_ACCEPTANCE), 0.99)
        threshold = next(t for smallest, t in SURVIVAL_BY_BATCH if batch_size >= smallest)
        worth = int(math.log(threshold) / math.log(rate)) if rate > 0 else 0
        if worth >= 1:
            self._idle_steps.pop(req_id, None)
            return min(k, worth)
        idle = self._idle_steps.get(req_id, 0) + 1
        self._idle_steps[req_id] = idle
        return 1 if idle % PROBE_EVERY == 0 else 0

    def propose(self, requests: list[ProposalRequest], batch_size: int) -> dict[str, Proposal]:
        if not requests:
            return {}
        started = time.perf_counter()
        for request in requests:
            request.num_drafts = min(request.num_drafts, self.num_drafts(batch_size))
        method = self.config.method
        proposals: dict[str, Proposal] = {}
        if method in ("suffix", "hybrid"):
            assert self.suffix is not None
            proposals = self.suffix.propose(requests)
        if method == "hybrid":
            for request in requests:
                self._method[request.req_id] = "suffix"
            need_draft = []
            for request in requests:
                model_k = self.num_model_drafts(request.req_id, request.num_drafts, batch_size)
                gain = self._expected_draft(request.req_id, model_k) - DRAFT_TOKEN_COST * model_k
                if model_k > 0 and proposals[request.req_id].expected_accepted < gain:
                    request.num_drafts = model_k
                    need_draft.append(request)
            if need_draft:
                proposals.update(self.draft.propose(need_draft))
                for request in need_draft:
                    self._method[request.req_id] = "draft"
        elif method == "draft":
            for request in requests:
                request.num_drafts = self.num_model_drafts(request.req_id, request.num_drafts, batch_size)
                self._method[request.req_id] = "draft"
            drafting = [r for r in requests if r.num_drafts > 0]
            proposals = self.draft.propose(drafting) if drafting else {}
            proposals.update({r.req_id: Proposal([]) for r in requests if r.num_drafts == 0})
        self.proposer_seconds += time.perf_counter() - started
        return proposals

    def _expected_draft(self, req_id: str, k: int) -> float:
        rate = self._acceptance.get(req_id, INITIAL_ACCEPTANCE)
        return sum(rate ** i for i in range(1, k + 1))

    def finish(self, req_id: str, output_token_ids: list[int] | None) -> None:
        self._acceptance.pop(req_id, None)
        self._idle_steps.pop(req_id, None)
        self._method.pop(req_id, None)
        if self.suffix is not None:
            self.suffix.finish(req_id, output_token_ids)
        if self.draft is not None:
            self.draft.finish(req_id, output_token_ids)
