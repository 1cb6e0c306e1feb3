"""The EAGLE head's compiled calls (engine/spec_decode/eagle_compiled.py, kernels/cpu/
eagle_head.cpp) compute what its Python path computes: the same predicted states and head KV bit
for bit, the same greedy tokens, their probabilities to float32 rounding; with float32, bf16 and
int8-held weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drafts.export import export_draft
from drafts.target import load_target, wrap_engine_model
from engine.model.attention_metadata import AttentionMetadata
from engine.spec_decode.draft_model import load_draft_model, position_slots, top_draft_tokens_with_prob
from engine.spec_decode.eagle import EagleProposer
from engine.spec_decode.eagle_compiled import CompiledEagleHead
from engine.spec_decode.proposer import ProposalRequest

BLOCK = 16
TEXT = ("import json\n\ndef load(path):\n    with open(path) as f:\n        return json.load(f)\n\n"
        "def save(path, data):\n    with open(path, 'w') as f:\n        json.dump(data, f)\n")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, perturbed_eagle_head):
    target = load_target(None, device=torch.device("cpu"), dtype=torch.float32, progress=False)
    head = perturbed_eagle_head(target, seed=1)
    folder = tmp_path_factory.mktemp("eagle")
    export_draft(head, str(folder), target_name=target.name, shared_embedding=True, dtype=torch.bfloat16)
    ids = target.tokenizer.encode(TEXT)
    with torch.no_grad():
        states = wrap_engine_model(target.engine_model)(torch.tensor([ids]))[0]  # [L, hidden]
    return target, str(folder), ids, states


def _pair(setup, held: str | None) -> tuple[EagleProposer, EagleProposer]:
    """Two proposers over the same head: one with the compiled calls, one kept on the Python path."""
    target, folder, _, _ = setup
    draft = load_draft_model(folder, target.engine_model, target.arch, torch.float32, torch.device("cpu"), held=held)
    compiled, python = (EagleProposer(draft, num_blocks=8, block_size=BLOCK, device=torch.device("cpu"),
                                      dtype=torch.float32) for _ in range(2))
    if compiled.compiled is None:
        pytest.skip("no compiled path here (float32 weights take the few-row kernel on AVX2 CPUs only)")
    python.compiled = None  # the cached property, set: the Python path
    return compiled, python


def _observe(proposer: EagleProposer, ids: list[int], states: torch.Tensor) -> None:
    slots = position_slots(list(range(8)), BLOCK, 0, len(ids))
    proposer.observe(states, np.asarray(ids, dtype=np.int64), slots)


@pytest.mark.parametrize("held", [None, "bf16", "int8"])
def test_drafting_writes_the_same_kv_and_drafts_the_same_tokens(setup, held: str | None) -> None:
    _, _, ids, states = setup
    proposals, probs = [], []
    pair = _pair(setup, held)
    for proposer in pair:
        _observe(proposer, ids, states)
        request = ProposalRequest("r", ids[:30], [], num_drafts=4, block_ids=list(range(8)))
        proposal = proposer.propose([request])["r"]
        proposals.append(proposal.token_ids)
        probs.append(proposal.token_probs)
    assert proposals[0] == proposals[1] and len(proposals[0]) >= 2
    torch.testing.assert_close(torch.tensor(probs[0]), torch.tensor(probs[1]), rtol=1e-5, atol=1e-7)
    compiled, python = pair
    assert torch.equal(compiled.kv_caches[0], python.kv_caches[0])  # the catch-up's and the drafts' KV


@pytest.mark.parametrize("held", [None, "int8"])
def test_a_pass_over_several_rows_is_the_python_pass_bit_for_bit(setup, held: str | None) -> None:
    _, _, ids, states = setup
    compiled, python = _pair(setup, held)
    outputs = []
    for proposer in (compiled, python):
        # Two requests' chunks in one pass: 3 positions of one, 2 of another in other blocks.
        meta = AttentionMetadata.build(query_lens=[3, 2], seq_lens=[20, 7], block_ids=[[0, 1], [5]],
                                       block_size=BLOCK, device="cpu")
        input_ids = torch.tensor(ids[18:21] + ids[6:8])
        rows = torch.cat([states[17:20], states[5:7]])  # [5, hidden]
        positions = torch.tensor([17, 18, 19, 5, 6])
        outputs.append(proposer._forward(input_ids, rows, positions, meta))
    assert torch.equal(outputs[0], outputs[1])
    assert torch.equal(compiled.kv_caches[0], python.kv_caches[0])


@pytest.mark.parametrize("held", [None, "bf16", "int8"])
def test_greedy_tokens_and_probabilities_match_the_python_path(setup, held: str | None) -> None:
    _, _, _, states = setup
    compiled, _ = _pair(setup, held)
    head = compiled.compiled
    tokens, probs = head.top1(states[:6])
    top, best = top_draft_tokens_with_prob(compiled.draft, states[:6], 1)
    assert torch.equal(tokens, top[:, 0])
    torch.testing.assert_close(probs, best, rtol=1e-5, atol=1e-7)


def test_other_dtypes_keep_the_python_path(setup) -> None:
    target, folder, _, _ = setup
    draft = load_draft_model(folder, target.engine_model, target.arch, torch.float32, torch.device("cpu"))
    assert CompiledEagleHead.build(draft, [], torch.device("cpu"), torch.bfloat16) is None
    assert CompiledEagleHead.build(draft, [], torch.device("meta"), torch.float32) is None
