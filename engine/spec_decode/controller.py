"""Which proposer drafts for a request, and how many tokens: the speculation policy.

- "draft" and "suffix" use one proposer; "hybrid" asks the (cheap) suffix proposer first and
  keeps its drafts when it expects at least as many accepted tokens as the draft model's recent
  record for that request, else asks the draft model.
- Adaptive length: each request keeps an exponential moving average of the draft model's
  per-token acceptance a; since the i-th draft survives with probability about a^i, drafting
  stops where a^i falls below MIN_SURVIVAL (k = floor(log(MIN_SURVIVAL) / log(a)), at least 1).
  Larger batches make verification tokens less free (a step's cost grows with its tokens once the
  matmuls are no longer bandwidth-bound), so k shrinks with the batch size.
"""

from __future__ import annotations

import math
import time

from engine.config import SpeculativeConfig
from engine.spec_decode.proposer import Proposal, ProposalRequest
from engine.spec_decode.suffix import SuffixProposer

# Stop drafting where the chance that the next draft is still reached falls below this.
MIN_SURVIVAL = 0.3
EMA_WEIGHT = 0.3  # weight of the newest step in a request's acceptance average
INITIAL_ACCEPTANCE = 0.6  # prior before a request has been verified
# Batch sizes from which k is halved, and quartered (CPU and GPU alike: conservative).
HALVE_AT_BATCH = 8
QUARTER_AT_BATCH = 24


class SpeculationController:
    def __init__(self, config: SpeculativeConfig, *, suffix: SuffixProposer | None, draft=None) -> None:
        self.config = config
        self.suffix = suffix
        self.draft = draft  # DraftModelProposer or None
        self._acceptance: dict[str, float] = {}  # req_id -> EMA of the draft model's acceptance
        self._method: dict[str, str] = {}  # req_id -> which proposer drafted its pending tokens
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

    def num_drafts(self, req_id: str, batch_size: int) -> int:
        k = self.max_drafts
        if not self.config.adaptive:
            return k
        if self.config.uses_draft_model:
            rate = min(self._acceptance.get(req_id, INITIAL_ACCEPTANCE), 0.99)
            k = min(k, max(1, int(math.log(MIN_SURVIVAL) / math.log(rate)) if rate > 0 else 1))
        if batch_size >= QUARTER_AT_BATCH:
            k = max(1, k // 4)
        elif batch_size >= HALVE_AT_BATCH:
            k = max(1, k // 2)
        return k

    def propose(self, requests: list[ProposalRequest], batch_size: int) -> dict[str, Proposal]:
        if not requests:
            return {}
        started = time.perf_counter()
        for request in requests:
            request.num_drafts = min(request.num_drafts, self.num_drafts(request.req_id, batch_size))
        method = self.config.method
        proposals: dict[str, Proposal] = {}
        if method in ("suffix", "hybrid"):
            assert self.suffix is not None
            proposals = self.suffix.propose(requests)
        if method == "hybrid":
            need_draft = [r for r in requests
                          if proposals[r.req_id].expected_accepted < self._expected_draft(r.req_id, r.num_drafts)]
            for request in requests:
                self._method[request.req_id] = "suffix"
            if need_draft:
                proposals.update(self.draft.propose(need_draft))
                for request in need_draft:
                    self._method[request.req_id] = "draft"
        elif method == "draft":
            proposals = self.draft.propose(requests)
            for request in requests:
                self._method[request.req_id] = "draft"
        self.proposer_seconds += time.perf_counter() - started
        return proposals

    def _expected_draft(self, req_id: str, k: int) -> float:
        rate = self._acceptance.get(req_id, INITIAL_ACCEPTANCE)
        return sum(rate ** i for i in range(1, k + 1))

    def finish(self, req_id: str, output_token_ids: list[int] | None) -> None:
        self._acceptance.pop(req_id, None)
        self._method.pop(req_id, None)
        if self.suffix is not None:
            self.suffix.finish(req_id, output_token_ids)
        if self.draft is not None:
            self.draft.finish(req_id, output_token_ids)
