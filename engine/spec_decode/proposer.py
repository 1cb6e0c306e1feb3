"""The proposer contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass
class ProposalRequest:
    """A request that just sampled and will decode next step."""

    req_id: str
    # The runner's own lists (not copies; read-only here): prompt, then every output so far,
    # the last one just sampled.
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    num_drafts: int  # how many tokens to propose at most (adaptive; 0: none this step)
    block_ids: list[int] = field(default_factory=list)  # its KV blocks (lookahead slots included)
    # Runners-up for the first drafted token the runner could verify (0: none; see
    # engine/worker/alternatives.py); the controller sets how many to ask for in num_alternatives.
    max_alternatives: int = 0
    num_alternatives: int = 0
    # A draft model that knows its own confidence (supports_confidence) stops drafting for the
    # request where the chance that all its drafts so far are accepted falls below this (the
    # gain one more drafted token must bring to pay for itself); its first draft is always kept.
    # 0: draft num_drafts.
    min_confidence: float = 0.0


@dataclass
class Proposal:
    token_ids: list[int]  # may be shorter than asked, or empty
    # [len(token_ids), vocab_size] float32: the distributions the drafts were drawn from; None for
    # deterministic drafts (one-hot), which the rejection sampler treats exactly.
    probs: torch.Tensor | None = None
    # The proposer's own estimate of how many of these tokens the target will accept.
    expected_accepted: float = 0.0
    # Its estimate, per token, of the probability that the target accepts it (and so all before
    # it): non-increasing, sums to expected_accepted; empty when the proposer makes none.
    confidence: list[float] = field(default_factory=list)
    # Other candidates for the first token (distinct from token_ids[0], most likely first), when
    # the request asked for num_alternatives: the target verifies each in a row of its own.
    alternatives: list[int] = field(default_factory=list)
    # The proposer's own probability of each drafted token: a draft model's softmax, where it
    # knows one, or a suffix vote's share: what the controller calibrates its confidence on
    # (engine/spec_decode/calibration.py).
    token_probs: list[float] = field(default_factory=list)
    # Suffix drafts followed in a fixed corpus (engine/spec_decode/corpus.py) rather than in the
    # request's context or recent outputs: the controller learns their acceptance apart.
    from_corpus: bool = False


class Proposer(Protocol):
    """Proposes draft tokens for requests in decode.

    propose(): called after sampling for the requests that will decode next (only those the
    controller wants drafts for); finish(): a request left the engine (finished, aborted or
    preempted), with its outputs when it finished normally.
    Implementations must never block and may return fewer tokens than asked.
    """

    def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]: ...

    def finish(self, req_id: str, output_token_ids: list[int] | None) -> None: ...
