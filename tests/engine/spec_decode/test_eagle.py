"""The EAGLE head: the engine's paged form (engine/spec_decode/eagle.py) computes what the
training form (drafts/eagle.py) computes, through the exported folder; the eager pass over
chunks equals one pass over the whole context; drafts roll out the predicted states exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drafts.eagle import TrainableEagle, init_eagle
from drafts.export import export_draft
from drafts.target import load_target, wrap_engine_model
from engine.spec_decode.draft_model import load_draft_model
from engine.spec_decode.eagle import EagleProposer
from engine.spec_decode.proposer import ProposalRequest

VOCAB = 4096
BLOCK = 16
TEXT = ("def read_config(path):\n    with open(path) as f:\n        return json.load(f)\n\n"
        "def write_config(path, config):\n    with open(path, 'w') as f:\n")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    torch.manual_seed(0)
    target = load_target(None, device=torch.device("cpu"), dtype=torch.float32, progress=False)
    head = init_eagle(target, 29, torch.arange(VOCAB, dtype=torch.int64))
    with torch.no_grad():  # not the identity init: every weight matters
        for param in head.parameters():
            if param.requires_grad:
                param.add_(0.02 * torch.randn_like(param))
    folder = tmp_path_factory.mktemp("eagle")
    export_draft(head, str(folder), target_name=target.name, shared_embedding=True, dtype=torch.float32)
    draft = load_draft_model(str(folder), target.engine_model, target.arch, torch.float32, torch.device("cpu"))
    ids = target.tokenizer.encode(TEXT)
    with torch.no_grad():
        states = wrap_engine_model(target.engine_model)(torch.tensor([ids]))[0]  # [L, hidden]
    return head.eval(), draft, ids, states


def _proposer(draft) -> EagleProposer:
    return EagleProposer(draft, num_blocks=8, block_size=BLOCK, device=torch.device("cpu"), dtype=torch.float32)


def _observe(proposer: EagleProposer, ids: list[int], states: torch.Tensor, start: int, end: int) -> None:
    """One target step that computed positions [start, end) of a request whose prompt is ids."""
    positions = np.arange(start, end)
    proposer.observe(states[start:end], positions, [0, end - start],
                     [("r", ids, [], list(range(8)), end - start)])


def test_chunked_eager_pass_equals_training_forward(setup) -> None:
    head, draft, ids, states = setup
    length = len(ids)
    with torch.no_grad():
        expected = head(torch.tensor([ids[1:]]), states[None, :-1])[0]  # [L - 1, hidden]
    proposer = _proposer(draft)
    _observe(proposer, ids, states, 0, 20)
    position, state = proposer._newest["r"]
    assert position == 19
    torch.testing.assert_close(state, expected[19], atol=2e-4, rtol=2e-4)
    # The last chunk includes the newest token, which has no successor yet: it stops one short.
    _observe(proposer, ids, states, 20, length)
    position, state = proposer._newest["r"]
    assert position == length - 2
    torch.testing.assert_close(state, expected[length - 2], atol=2e-4, rtol=2e-4)


def test_drafts_roll_out_predicted_states(setup) -> None:
    head, draft, ids, states = setup
    proposer = _proposer(draft)
    _observe(proposer, ids, states, 0, len(ids))
    proposal = proposer.propose([ProposalRequest("r", ids, [], num_drafts=4, block_ids=list(range(8)))])["r"]
    # The training form, rolled out: each draft appends (token, predicted state) and reruns.
    tokens, feats = list(ids[1:]), states[:-1]
    expected = []
    with torch.no_grad():
        for _ in range(4):
            predicted = head(torch.tensor([tokens]), feats[None])[0, -1]  # [hidden]
            draft_token = int(head.vocab_ids[head.logits(predicted).argmax()])
            expected.append(draft_token)
            tokens.append(draft_token)
            feats = torch.cat([feats, predicted[None]])
    assert proposal.token_ids == expected


def test_no_drafts_without_an_observed_state(setup) -> None:
    _, draft, ids, _ = setup
    proposer = _proposer(draft)
    request = ProposalRequest("r", ids, [], num_drafts=4, block_ids=list(range(8)))
    assert proposer.propose([request])["r"].token_ids == []
    proposer.finish("r", None)


def test_folder_kind_is_checked(setup, tmp_path) -> None:
    head, _, _, _ = setup
    target = load_target(None, device=torch.device("cpu"), dtype=torch.float32, progress=False)
    export_draft(head, str(tmp_path), target_name=target.name, shared_embedding=True, dtype=torch.float32)
    import json
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["draftgate"]["kind"] == "eagle"
    config["draftgate"]["kind"] = "medusa"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unknown draftgate kind"):
        load_draft_model(str(tmp_path), target.engine_model, target.arch, torch.float32, torch.device("cpu"))
    assert isinstance(head, TrainableEagle)
