"""The speculation policy: suffix drafts keep the full k, the draft model drafts only tokens likely
to survive at the current batch size, switches itself off for a request whose drafts keep
failing and probes to come back."""

from __future__ import annotations

from engine.config import SpeculativeConfig
from engine.spec_decode.controller import PROBE_EVERY, SpeculationController
from engine.spec_decode.proposer import Proposal, ProposalRequest
from engine.spec_decode.suffix import SuffixProposer


class CountingDraft:
    """A draft proposer that proposes token 7 and records how many tokens it was asked for."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]:
        self.asked += [(r.req_id, r.num_drafts) for r in requests]
        return {r.req_id: Proposal([7] * r.num_drafts) for r in requests}

    def finish(self, req_id: str, output_token_ids: list[int] | None) -> None:
        pass


def request(req_id: str, output: list[int], k: int = 4) -> ProposalRequest:
    return ProposalRequest(req_id, prompt_token_ids=[1, 2, 3], output_token_ids=output, num_drafts=k)


def controller(method: str) -> tuple[SpeculationController, CountingDraft]:
    draft = CountingDraft()
    suffix = SuffixProposer() if method in ("suffix", "hybrid") else None
    config = SpeculativeConfig(method=method, num_speculative_tokens=4)
    return SpeculationController(config, suffix=suffix, draft=draft), draft


def test_suffix_drafts_are_not_capped_by_a_poor_draft_model() -> None:
    spec, _ = controller("hybrid")
    for _ in range(10):  # the draft model keeps failing for this request
        spec.propose([request("a", [9])], batch_size=1)
        spec.record("a", 4, 0)
    # A context that repeats: the suffix proposer continues it with the full k.
    repeating = [5, 6, 7, 8] * 6
    proposals = spec.propose([request("a", repeating)], batch_size=1)
    assert proposals["a"].token_ids == [5, 6, 7, 8]


def test_draft_model_length_follows_acceptance_and_batch() -> None:
    spec, draft = controller("draft")
    spec.propose([request("a", [9])], batch_size=1)
    assert draft.asked[-1] == ("a", 1)  # prior acceptance 0.5: 0.5 >= 0.4 > 0.5^2
    for _ in range(20):
        spec.record("a", 4, 4)
    spec.propose([request("a", [9])], batch_size=1)
    assert draft.asked[-1] == ("a", 4)
    spec.propose([request("a", [9])], batch_size=8)
    assert draft.asked[-1] == ("a", 2)  # k halved from 8 running requests


def test_a_failing_draft_model_switches_off_and_probes() -> None:
    spec, draft = controller("draft")
    for _ in range(20):
        spec.propose([request("a", [9])], batch_size=8)
        spec.record("a", 1, 0)
    draft.asked.clear()
    drafted = []
    for _ in range(2 * PROBE_EVERY):
        proposals = spec.propose([request("a", [9])], batch_size=8)
        drafted.append(len(proposals["a"].token_ids))
    assert sum(drafted) == 2 and max(drafted) == 1  # one single-token probe every PROBE_EVERY steps
    # Probes that succeed bring the drafts back.
    for _ in range(20):
        spec.record("a", 1, 1)
    assert len(spec.propose([request("a", [9])], batch_size=1)["a"].token_ids) >= 1


def test_not_adaptive_always_drafts_k() -> None:
    draft = CountingDraft()
    config = SpeculativeConfig(method="draft", num_speculative_tokens=4, adaptive=False)
    spec = SpeculationController(config, suffix=None, draft=draft)
    for _ in range(5):
        spec.propose([request("a", [9])], batch_size=32)
        spec.record("a", 4, 0)
    assert all(k == 4 for _, k in draft.asked)
