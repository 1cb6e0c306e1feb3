"""The standalone draft model's proposer: drafts stop by confidence exactly where the chance that
all survive falls below the floor, and its per-slot KV records stay right when they do."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.model.loader import load_model
from engine.model.resolve import resolve_model
from engine.spec_decode.draft_model import DraftModelProposer, load_draft_model
from engine.spec_decode.proposer import Proposal, ProposalRequest

BLOCK = 16


@pytest.fixture(scope="module")
def draft(small_draft: str):
    target, arch = load_model(resolve_model(None), dtype=torch.float32, device="cpu", progress=False)
    return load_draft_model(small_draft, target, arch, torch.float32, torch.device("cpu"))


def _propose(proposer: DraftModelProposer, floor: float, context: list[int]) -> tuple[Proposal, int]:
    """(proposal of up to 4 drafts after context, forwards run after the first)."""
    forwards = []
    inner = proposer._forward
    proposer._forward = lambda *args, **kwargs: forwards.append(1) or inner(*args, **kwargs)
    request = ProposalRequest("r", context[:-1], context[-1:], num_drafts=4, block_ids=list(range(8)),
                              min_confidence=floor)
    try:
        proposal = proposer.propose([request])["r"]
    finally:
        proposer._forward = inner
    assert proposer.positions_run == len(forwards)  # what the controller prices
    return proposal, len(forwards) - 1


def test_drafts_stop_below_the_floor_and_the_kv_records_stay_right(draft) -> None:
    context = [1, 504, 3057, 28, 253, 1789, 314, 2003, 30, 198, 504, 3057, 28]
    proposer = DraftModelProposer(draft, num_blocks=8, block_size=BLOCK, device=torch.device("cpu"),
                                  dtype=torch.float32)
    full, forwards = _propose(proposer, 0.0, context)
    assert len(full.token_ids) == 4 and forwards == 3
    expected = [float(np.prod(full.token_probs[: j + 1])) for j in range(4)]
    assert full.confidence == pytest.approx(expected) and expected[2] < expected[1]
    # Two drafts: the third's chance was computed (and its pass run), the fourth never was.
    two, forwards = _propose(proposer, (expected[1] + expected[2]) / 2, context)
    assert two.token_ids == full.token_ids[:2] and forwards == 2
    # Out of reach: the first draft only, no further pass.
    one, forwards = _propose(proposer, 1.5, context)
    assert one.token_ids == full.token_ids[:1] and forwards == 0
    # The slots' records after the stops still say exactly which draft KV is valid: the next
    # proposal over the same context drafts the same tokens, catching up on nothing but the
    # newest token, and one after an accepted draft continues from it.
    before = proposer.num_catch_up_tokens
    again, _ = _propose(proposer, 0.0, context)
    assert again.token_ids == full.token_ids and proposer.num_catch_up_tokens == before
    fresh = DraftModelProposer(draft, num_blocks=8, block_size=BLOCK, device=torch.device("cpu"), dtype=torch.float32)
    longer = context + full.token_ids[:1]
    assert _propose(proposer, 0.0, longer)[0].token_ids == _propose(fresh, 0.0, longer)[0].token_ids
