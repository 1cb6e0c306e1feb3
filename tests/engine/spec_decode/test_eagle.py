"""The EAGLE head: the engine's paged form (engine/spec_decode/eagle.py) computes what the
training form (drafts/eagle.py) computes, through the exported folder; its KV is written lazily
from the stored target states, only when a request drafts, and only where its records do not
match; drafts roll out the predicted states exactly; a prefix hit catches up from the states a
finished request left."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drafts.eagle import TrainableEagle
from drafts.export import export_draft
from drafts.target import load_target, wrap_engine_model
from engine.spec_decode.calibration import ConfidenceCalibration
from engine.model.layers.quant_linear import Bf16WeightLinear, Int8WeightLinear
from engine.spec_decode.draft_model import _draft_logits, load_draft_model, position_slots
from engine.spec_decode.eagle import KV_ONLY_ROWS_STEP, SPLIT_ROWS, EagleProposer
from engine.spec_decode.proposer import ProposalRequest

VOCAB = 4096
BLOCK = 16
TEXT = ("def read_config(path):\n    with open(path) as f:\n        return json.load(f)\n\n"
        "def write_config(path, config):\n    with open(path, 'w') as f:\n")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, perturbed_eagle_head):
    target = load_target(None, device=torch.device("cpu"), dtype=torch.float32, progress=False)
    head = perturbed_eagle_head(target, seed=0, vocab=VOCAB)
    folder = tmp_path_factory.mktemp("eagle")
    export_draft(head, str(folder), target_name=target.name, shared_embedding=True, dtype=torch.float32)
    draft = load_draft_model(str(folder), target.engine_model, target.arch, torch.float32, torch.device("cpu"))
    ids = target.tokenizer.encode(TEXT)
    with torch.no_grad():
        states = wrap_engine_model(target.engine_model)(torch.tensor([ids]))[0]  # [L, hidden]
    return head.eval(), draft, ids, states


def _proposer(draft) -> EagleProposer:
    return EagleProposer(draft, num_blocks=8, block_size=BLOCK, device=torch.device("cpu"), dtype=torch.float32)


def _observe(proposer: EagleProposer, ids: list[int], states: torch.Tensor, start: int, end: int,
             blocks: list[int] | None = None) -> None:
    """One target step that computed positions [start, end) of a request whose prompt is ids."""
    slots = position_slots(list(range(8)) if blocks is None else blocks, BLOCK, start, end)
    proposer.observe(states[start:end], np.asarray(ids[start:end], dtype=np.int64), slots)


def _count_passes(proposer: EagleProposer) -> list[list[tuple[int, int]]]:
    """Records each pass's chunks as (start, count)."""
    passes: list[list[tuple[int, int]]] = []
    inner = proposer._pass

    def recording(chunks, **kwargs):
        if chunks:
            passes.append([(c.start, c.count) for c in chunks])
        return inner(chunks, **kwargs)

    proposer._pass = recording
    return passes


def _request(ids: list[int], req_id: str = "r", blocks: list[int] | None = None, num_drafts: int = 1,
             **kwargs) -> ProposalRequest:
    return ProposalRequest(req_id, ids, [], num_drafts=num_drafts,
                           block_ids=list(range(8)) if blocks is None else blocks, **kwargs)


def _expected_states(head: TrainableEagle, ids: list[int], states: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return head(torch.tensor([ids[1:]]), states[None, :-1])[0]  # [L - 1, hidden]


def test_the_head_runs_only_when_a_request_drafts(setup) -> None:
    head, draft, ids, states = setup
    length = len(ids)
    expected = _expected_states(head, ids, states)
    proposer = _proposer(draft)
    passes = _count_passes(proposer)
    # Two target steps: their states are stored, the head does not run.
    _observe(proposer, ids, states, 0, 20)
    _observe(proposer, ids, states, 20, length)
    assert passes == [] and (proposer._kv_tokens < 0).all()
    # The newest token has no successor yet: the head's newest output is one position before it.
    # The older positions' KV alone (they are at least SPLIT_ROWS), then the newest.
    newest = proposer._catch_up([_request(ids)])
    assert passes == [[(0, length - 2)], [(length - 2, 1)]]
    position, state = newest["r"]
    assert position == length - 2
    torch.testing.assert_close(state, expected[length - 2], atol=2e-4, rtol=2e-4)
    assert proposer.num_kv_positions == length - 1 and proposer.kv_only_seconds > 0


def test_a_catch_up_runs_only_the_positions_without_head_kv(setup) -> None:
    head, draft, ids, states = setup
    expected = _expected_states(head, ids, states)
    proposer = _proposer(draft)
    passes = _count_passes(proposer)
    _observe(proposer, ids[:20], states[:20], 0, 20)
    proposer.propose([_request(ids[:20], num_drafts=4)])
    # Two more verified positions (the last real token and one accepted draft): the next catch-up
    # runs them alone, rewriting the KV the drafts wrote there from predicted states.
    _observe(proposer, ids[:22], states[:22], 19, 21)
    passes.clear()
    newest = proposer._catch_up([_request(ids[:22])])
    assert passes == [[(19, 2)]]
    torch.testing.assert_close(newest["r"][1], expected[20], atol=2e-4, rtol=2e-4)
    # Nothing new: the newest position alone (its output is the first draft).
    passes.clear()
    proposer._catch_up([_request(ids[:22])])
    assert passes == [[(20, 1)]]


def test_drafted_positions_forget_their_records(setup) -> None:
    _, draft, ids, states = setup
    proposer = _proposer(draft)
    _observe(proposer, ids[:20], states[:20], 0, 20)
    proposal = proposer.propose([_request(ids[:20], num_drafts=4)])["r"]
    assert len(proposal.token_ids) == 4
    # Verified through position 18; the drafts' feeding steps wrote 19..21 from predicted states.
    assert (proposer._kv_tokens[:19] == np.asarray(ids[1:20])).all()
    assert (proposer._kv_tokens[19:] < 0).all()


def _rollout(head: TrainableEagle, ids: list[int], states: torch.Tensor, k: int) -> list[int]:
    """The training form's drafts after context ids: each appends (token, predicted state) and reruns."""
    tokens, feats = list(ids[1:]), states[: len(ids) - 1]
    out = []
    with torch.no_grad():
        for _ in range(k):
            predicted = head(torch.tensor([tokens]), feats[None])[0, -1]  # [hidden]
            token = int(head.vocab_ids[head.logits(predicted).argmax()])
            out.append(token)
            tokens.append(token)
            feats = torch.cat([feats, predicted[None]])
    return out


@pytest.mark.parametrize("context", [48, 12, 3])
def test_drafts_roll_out_predicted_states(setup, context: int) -> None:
    # 48: drafted before at 40 (its catch-up wrote the KV of positions up to 38, its drafts 39..41
    # from predicted states): the catch-up rewrites from 39; 12: propose writes all but the
    # newest one's KV alone, then runs the newest (catch-up and first draft in one pass); 3: a
    # chunk shorter than SPLIT_ROWS runs whole.
    head, draft, ids, states = setup
    ids, states = ids[:context], states[:context]
    proposer = _proposer(draft)
    _observe(proposer, ids, states, 0, context)
    if context == 48:
        assert len(proposer.propose([_request(ids[:40], num_drafts=4)])["r"].token_ids) == 4
    proposal = proposer.propose([_request(ids, num_drafts=4)])["r"]
    assert proposal.token_ids == _rollout(head, ids, states, 4)


def _propose_with_floor(draft, ids: list[int], states: torch.Tensor, floor: float,
                        calibration: ConfidenceCalibration | None = None):
    """(proposal, head forwards run after the catch-up) for num_drafts=4 and min_confidence=floor."""
    proposer = _proposer(draft)
    proposer.calibration = calibration
    _observe(proposer, ids, states, 0, len(ids))
    request = _request(ids, num_drafts=4, min_confidence=floor)
    newest = proposer._catch_up([request])
    forwards = []
    inner = proposer._forward
    proposer._forward = lambda *args, **kwargs: forwards.append(1) or inner(*args, **kwargs)
    proposal = proposer._draft([request], newest)["r"]
    assert proposer.positions_run == 1 + len(forwards)  # what the controller prices: the first from the catch-up
    return proposal, len(forwards)


def test_drafts_stop_where_the_chance_that_all_survive_falls_below_the_floor(setup) -> None:
    head, draft, ids, states = setup
    ids, states = ids[:12], states[:12]
    rollout = _rollout(head, ids, states, 4)
    proposal, forwards = _propose_with_floor(draft, ids, states, 0.0)
    assert proposal.token_ids == rollout and forwards == 3
    # Without a calibration, a draft's chance is the head's probability of it: the chance that
    # all survive is their running product.
    probs = proposal.token_probs
    assert len(probs) == 4 and all(0.0 < p <= 1.0 for p in probs)
    expected = [float(np.prod(probs[: j + 1])) for j in range(4)]
    assert proposal.confidence == pytest.approx(expected)
    assert proposal.expected_accepted == pytest.approx(sum(expected))
    # A floor between the second and the third: two drafts; the third was computed (its chance
    # is only known then; without a calibration the next draft is taken to be sure), the fourth
    # never was.
    assert expected[2] < expected[1]
    proposal, forwards = _propose_with_floor(draft, ids, states, (expected[1] + expected[2]) / 2)
    assert proposal.token_ids == rollout[:2] and forwards == 2
    # Out of reach: the first draft is kept (the plan priced it) and no position is run for a
    # second one that could not pay.
    proposal, forwards = _propose_with_floor(draft, ids, states, 1.5)
    assert proposal.token_ids == rollout[:1] and forwards == 0
    # With a calibration, its chances: one that believes every draft (bins learnt at 0.99).
    believing = ConfidenceCalibration()
    for _ in range(2000):
        believing.update([(b + 0.5) / 10 for b in range(10)][::-1], 10)
    believing.next_chance = 0.99  # as if learnt from such drafts
    proposal, _ = _propose_with_floor(draft, ids, states, 0.9, believing)
    assert proposal.token_ids == rollout
    chances = [believing.acceptance(prob) for prob in proposal.token_probs]
    assert min(chances) > 0.95
    assert proposal.confidence == pytest.approx([float(np.prod(chances[: j + 1])) for j in range(4)])


def test_kv_only_passes_write_what_full_passes_write(setup, monkeypatch: pytest.MonkeyPatch) -> None:
    _, draft, ids, states = setup
    assert draft.model.layers[0].self_attn.kv_proj is not None  # KV-only passes skip q (llama.py)
    written = []
    for split_rows in (SPLIT_ROWS, 10 ** 6):  # the older positions' KV alone first, or all in one full pass
        monkeypatch.setattr("engine.spec_decode.eagle.SPLIT_ROWS", split_rows)
        proposer = _proposer(draft)
        _observe(proposer, ids[:20], states[:20], 0, 20)
        newest = proposer._catch_up([_request(ids[:20])])
        written.append((proposer.kv_caches[0][:, :2].clone(), newest["r"]))
    (kv_split, (pos_split, out_split)), (kv_whole, (pos_whole, out_whole)) = written
    assert pos_split == pos_whole == 18
    # kv [2, blocks, kv heads, BLOCK, head_dim]: positions 0..15 in block 0, 16..18 in block 1's
    # first slots; the same ops either way (matmuls over fewer rows may round differently).
    torch.testing.assert_close(kv_split[:, 0], kv_whole[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kv_split[:, 1, :, :19 - BLOCK], kv_whole[:, 1, :, :19 - BLOCK], atol=1e-5, rtol=1e-5)
    assert kv_whole[:, 0].abs().amin(dim=-1).gt(0).any()  # written, not both left at zero
    torch.testing.assert_close(out_split, out_whole, atol=2e-5, rtol=2e-5)


def _record_forward_rows(proposer: EagleProposer) -> list[tuple[int, bool]]:
    """Records each head forward's (row count, kv_only)."""
    rows: list[tuple[int, bool]] = []
    inner = proposer._forward

    def recording(input_ids, *args, **kwargs):
        rows.append((len(input_ids), kwargs.get("kv_only", False)))
        return inner(input_ids, *args, **kwargs)

    proposer._forward = recording
    return rows


def test_a_kv_only_pass_pads_its_rows_into_the_spare_blocks(setup) -> None:
    """On a CPU a KV-only pass runs a multiple of KV_ONLY_ROWS_STEP rows (oneDNN builds kernels
    per row count): the padding rows store only in the blocks past the target's, and the real
    rows' KV is what a pass without padding writes (test_kv_only_passes_write_what_full_passes_write)."""
    _, draft, ids, states = setup
    proposer = _proposer(draft)
    _observe(proposer, ids[:20], states[:20], 0, 20)
    rows = _record_forward_rows(proposer)
    proposer._catch_up([_request(ids[:20])])  # positions 0..17 KV-only, 18 in the full pass
    assert KV_ONLY_ROWS_STEP == 64 and rows == [(64, True), (1, False)]
    cache = proposer.kv_caches[0]  # [2, 8 blocks + 4 spare ones, kv heads, BLOCK, head_dim]
    assert cache.shape[1] == 8 + 4
    assert not cache[:, 2:8].any()  # nothing past the request's positions
    assert not cache[:, 1, :, 19 - BLOCK:].any()
    spare = cache[:, 8:].transpose(1, 2).reshape(2, cache.shape[2], 4 * BLOCK, -1)  # [2, kv heads, spare slots, head_dim]
    assert spare[:, :, : 64 - 18].abs().amax(dim=-1).gt(0).all()  # 46 padding rows
    assert not spare[:, :, 64 - 18:].any()


def test_a_long_kv_only_catch_up_runs_in_several_passes(setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most KV_ONLY_MAX_ROWS rows a pass (so a few row counts cover any catch-up), writing
    what one pass writes."""
    _, draft, ids, states = setup
    written = []
    for max_rows, step in ((8, 8), (10 ** 6, 1)):
        monkeypatch.setattr("engine.spec_decode.eagle.KV_ONLY_MAX_ROWS", max_rows)
        monkeypatch.setattr("engine.spec_decode.eagle.KV_ONLY_ROWS_STEP", step)
        proposer = _proposer(draft)
        _observe(proposer, ids[:20], states[:20], 0, 20)
        rows = _record_forward_rows(proposer)
        newest = proposer._catch_up([_request(ids[:20])])  # positions 0..17 KV-only, 18 in the full pass
        written.append((rows, proposer.kv_caches[0][:, :2].clone(), newest["r"][1]))
    (rows_split, kv_split, out_split), (rows_whole, kv_whole, out_whole) = written
    assert rows_split == [(8, True), (8, True), (8, True), (1, False)]  # 8 + 8 + 2 padded to 8
    assert rows_whole == [(18, True), (1, False)]
    torch.testing.assert_close(kv_split, kv_whole, atol=1e-5, rtol=1e-5)
    assert kv_whole[:, 1, :, 18 - BLOCK].abs().amax().gt(0)  # position 17's KV written
    torch.testing.assert_close(out_split, out_whole, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("drafted", [False, True])
def test_a_prefix_hit_catches_up_from_a_finished_requests_states(setup, drafted: bool) -> None:
    head, draft, ids, states = setup
    expected = _expected_states(head, ids, states)
    proposer = _proposer(draft)
    passes = _count_passes(proposer)
    _observe(proposer, ids[:BLOCK + 1], states[:BLOCK + 1], 0, BLOCK + 1)  # states of positions 0..16
    if drafted:  # head KV for positions 0..15, and 16..18 from predicted states
        proposer.propose([_request(ids[:BLOCK + 1], num_drafts=4)])
    proposer.finish("r", [ids[BLOCK + 1]])
    # A new request with the same prefix in the same blocks (a prefix-cache hit of one block, so
    # the target computes from position 16): its head reads the finished request's states.
    _observe(proposer, ids, states, BLOCK, len(ids))
    passes.clear()
    newest = proposer._catch_up([_request(ids, "s")])
    start = BLOCK if drafted else 0
    assert passes == [[(start, len(ids) - 2 - start)], [(len(ids) - 2, 1)]]
    torch.testing.assert_close(newest["s"][1], expected[len(ids) - 2], atol=2e-4, rtol=2e-4)


def test_positions_without_states_are_skipped(setup) -> None:
    """Blocks cached before this head was built (set_speculative_method builds a new one) hold
    no states for it: it drafts from the positions it has."""
    _, draft, ids, states = setup
    proposer = _proposer(draft)
    passes = _count_passes(proposer)
    _observe(proposer, ids, states, BLOCK, len(ids))
    proposer._catch_up([_request(ids)])
    assert passes == [[(BLOCK, len(ids) - 2 - BLOCK)], [(len(ids) - 2, 1)]]


def test_requests_sharing_a_block_keep_each_others_kv_at_its_last_slot(setup) -> None:
    """The KV at a block's last slot reads the next block's first token: two requests that share
    the block and then differ would otherwise rewrite each other's KV from there at every step."""
    _, draft, ids, states = setup
    assert len(ids) > BLOCK + 4
    proposer = _proposer(draft)
    passes = _count_passes(proposer)
    # r: the text; s: the same first block (shared), its own second block with other tokens.
    other = ids[:BLOCK] + ids[BLOCK:][::-1]
    _observe(proposer, ids, states, 0, len(ids), blocks=[0, 1, 2])
    _observe(proposer, other, states, BLOCK, len(other), blocks=[0, 3, 4])
    r, s = _request(ids, blocks=[0, 1, 2]), _request(other, "s", blocks=[0, 3, 4])
    proposer._catch_up([r])
    proposer._catch_up([s])  # writes the shared block's last slot for its own successor
    passes.clear()
    proposer._catch_up([r, s])
    assert passes == [[(len(ids) - 2, 1), (len(other) - 2, 1)]]  # the newest positions alone


def test_fresh_blocks_forget_their_states_and_kv(setup) -> None:
    _, draft, ids, states = setup
    proposer = _proposer(draft)
    _observe(proposer, ids[:20], states[:20], 0, 20)
    proposer.propose([_request(ids[:20], num_drafts=2)])
    proposer.forget_blocks([0])  # another request's now
    assert (proposer._kv_tokens[:BLOCK] < 0).all() and (proposer._state_tokens[:BLOCK] < 0).all()
    assert (proposer._state_tokens[BLOCK: 20] >= 0).all()


def test_observed_states_are_copied_late_and_newest_last(setup) -> None:
    """observe defers the copy into the state pool: a slot observed twice (a rejected draft's
    row, then its verified token) ends with the newer state, a pass sees every pending state,
    and drafts equal those of a proposer that copied each step at once."""
    _, draft, ids, states = setup
    length = 40
    proposer, eager = _proposer(draft), _proposer(draft)
    eager_observe = eager.observe

    def observe_now(hidden, tokens, slots):
        eager_observe(hidden, tokens, slots)
        eager._store_pending()

    eager.observe = observe_now
    for p in (proposer, eager):
        _observe(p, ids, states, 0, length - 1)
        # A stale row at the newest position first (another state, another token), then the real one.
        slot = position_slots(list(range(8)), BLOCK, length - 1, length)
        p.observe(states[:1] * 3.0, np.asarray([ids[0] + 1], dtype=np.int64), slot)
        _observe(p, ids, states, length - 1, length)
    assert len(proposer._pending) == 3 and len(eager._pending) == 0
    drafted = proposer.propose([_request(ids[:length], num_drafts=3)])["r"].token_ids
    assert proposer._pending == []
    assert torch.equal(proposer.states, eager.states)
    assert torch.equal(proposer.states[slot[0]], states[length - 1])
    assert drafted == eager.propose([_request(ids[:length], num_drafts=3)])["r"].token_ids


def test_pending_states_are_copied_once_enough_rows_wait(setup, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.spec_decode.eagle as eagle

    _, draft, ids, states = setup
    monkeypatch.setattr(eagle, "PENDING_ROWS", 8)
    proposer = _proposer(draft)
    _observe(proposer, ids, states, 0, 5)
    assert proposer._pending_rows == 5 and not proposer.states.any()
    _observe(proposer, ids, states, 5, 9)
    assert proposer._pending == [] and proposer._pending_rows == 0
    assert torch.equal(proposer.states[position_slots(list(range(8)), BLOCK, 0, 9)], states[:9])


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


def _full_and_held(setup, tmp_path, held: str):
    """The setup's head exported in bf16 and loaded twice under a float32 target, in float32 and
    with its weights held so; and each one's output at the newest position after one catch-up
    over the same states ([hidden] each)."""
    head, _, ids, states = setup
    target = load_target(None, device=torch.device("cpu"), dtype=torch.float32, progress=False)
    export_draft(head, str(tmp_path), target_name=target.name, shared_embedding=True, dtype=torch.bfloat16)
    args = (str(tmp_path), target.engine_model, target.arch, torch.float32, torch.device("cpu"))
    full, held_draft = load_draft_model(*args), load_draft_model(*args, held=held)
    newest = []
    for draft in (full, held_draft):
        proposer = _proposer(draft)
        _observe(proposer, ids, states, 0, len(ids))
        newest.append(proposer._catch_up([_request(ids)])["r"][1])
    return full, held_draft, newest


def test_bf16_weights_change_only_the_rounding_of_the_output_head(setup, tmp_path) -> None:
    """bf16-held weights (float32 drafts on AVX2 CPUs and wider, model_runner.draft_weight_format): a head
    exported in bf16 computes its layers as before (the products are the widened weights'), and
    its reduced output head, rows of the target's float32 head, is the float32 one rounded."""
    full, half, newest = _full_and_held(setup, tmp_path, "bf16")
    assert half.held == "bf16" and full.held is None
    linears = [m for m in half.model.layers.modules() if isinstance(m, Bf16WeightLinear)]
    assert len(linears) >= 5 and all(m.weight_bf16.dtype == torch.bfloat16 for m in linears)
    assert torch.equal(half.head_weight, full.head_weight.bfloat16())
    assert torch.equal(half.fc_weight.float(), full.fc_weight)  # exported in bf16: nothing to round
    torch.testing.assert_close(newest[1], newest[0], atol=1e-4, rtol=1e-4)  # summation order only
    hidden = newest[0][None]  # [1, hidden]
    torch.testing.assert_close(_draft_logits(half, hidden), hidden @ full.head_weight.bfloat16().float().t(),
                               atol=1e-5, rtol=1e-5)
    assert not torch.allclose(_draft_logits(half, hidden), _draft_logits(full, hidden), atol=1e-6, rtol=0)


def test_int8_weights_are_the_rounded_weights_scaled_per_row(setup, tmp_path) -> None:
    """int8-held weights (draft_weights "int8", the default for drafts on AVX2 CPUs and wider): the
    layers, the fc and the reduced output head compute over the int8 weights times their row's
    scale, which stays close to the full-precision head's output."""
    full, quarter, newest = _full_and_held(setup, tmp_path, "int8")
    assert quarter.held == "int8"
    linears = [m for m in quarter.model.layers.modules() if isinstance(m, Int8WeightLinear)]
    assert len(linears) >= 5 and all(m.weight_int8.dtype == torch.int8 for m in linears)
    for weight, scales, reference in ((quarter.head_weight, quarter.head_scales, full.head_weight),
                                      (quarter.fc_weight, quarter.fc_scales, full.fc_weight)):
        assert weight.dtype == torch.int8 and scales.shape == (weight.shape[0],)
        # Each row rounded to 127 steps of its largest magnitude: within half a step.
        assert ((weight.float() * scales[:, None] - reference).abs() <= scales[:, None] * 0.5 + 1e-7).all()
    assert not torch.equal(newest[1], newest[0])
    assert torch.nn.functional.cosine_similarity(newest[1], newest[0], dim=0) > 0.99
    hidden = newest[0][None]  # [1, hidden]
    dequantized = quarter.head_weight.float() * quarter.head_scales[:, None]
    torch.testing.assert_close(_draft_logits(quarter, hidden), hidden @ dequantized.t(), atol=1e-4, rtol=1e-4)


def test_draft_weight_format_follows_the_config() -> None:
    from engine.config import SpeculativeConfig
    from engine.worker.model_runner import draft_weight_format
    from kernels import small_rows_linear
    cpu = torch.device("cpu")
    kernel = small_rows_linear.held_weights_enabled()  # (AVX2 CPUs and wider, where the kernels built)
    auto = SpeculativeConfig(method="hybrid")
    assert draft_weight_format(auto, torch.float32, cpu) == ("int8" if kernel else None)
    bf16 = SpeculativeConfig(method="hybrid", draft_weights="bf16")
    if kernel:
        assert draft_weight_format(bf16, torch.float32, cpu) == "bf16"
    else:  # asked for by name where it cannot apply: said, not ignored
        with pytest.raises(ValueError, match="draft_weights 'bf16'"):
            draft_weight_format(bf16, torch.float32, cpu)
    assert draft_weight_format(SpeculativeConfig(method="hybrid", draft_weights="dtype"), torch.float32, cpu) is None
    # An explicit dtype is all of the draft in it, unless draft_weights says otherwise.
    assert draft_weight_format(SpeculativeConfig(method="hybrid", draft_dtype="float32"), torch.float32, cpu) is None
    assert draft_weight_format(auto, torch.bfloat16, cpu) is None
    with pytest.raises(ValueError, match="draft_weights 'int8' needs a float32 draft"):
        draft_weight_format(SpeculativeConfig(method="hybrid", draft_weights="int8"), torch.bfloat16, cpu)
    with pytest.raises(ValueError, match="draft_weights"):
        SpeculativeConfig(method="hybrid", draft_weights="int4")
