"""The trainable model computes what the engine's inference model computes, on the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from draft_harness import engine_logits, write_tiny_target

from drafts.init_draft import DraftInit, init_from_target, parse_layer_ids, spread_layers
from drafts.target import load_target, wrap_engine_model

FAMILIES = {
    "llama_tied": dict(architecture="LlamaForCausalLM", tie=True),
    "qwen2_bias_untied": dict(architecture="Qwen2ForCausalLM", tie=False, num_layers=3),
    "qwen3_qk_norm_mqa": dict(architecture="Qwen3ForCausalLM", tie=False, num_kv_heads=1, num_layers=2),
    "mistral_window": dict(architecture="MistralForCausalLM", tie=False, num_layers=2, extra_config={"sliding_window": 5}),
}
SEQUENCES = [[5, 17, 200, 3, 44, 90, 91, 12, 7, 250, 33], [100, 2, 9, 77, 64, 31]]


def _padded(sequences: list[list[int]]) -> torch.Tensor:  # [batch, max_len] right-padded with 0
    width = max(len(s) for s in sequences)
    return torch.tensor([s + [0] * (width - len(s)) for s in sequences], dtype=torch.int64)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_teacher_equals_engine_model(tmp_path: Path, family: str) -> None:
    target = load_target(str(write_tiny_target(tmp_path / family, **FAMILIES[family])), device=torch.device("cpu"),
                         progress=False)
    teacher = wrap_engine_model(target.engine_model)
    expected = engine_logits(target.engine_model, SEQUENCES)
    with torch.no_grad():
        logits = teacher.logits(teacher(_padded(SEQUENCES)))  # [batch, max_len, vocab]
    for row, sequence in enumerate(SEQUENCES):
        got = logits[row, : len(sequence)]
        assert got.shape == expected[row].shape
        torch.testing.assert_close(got, expected[row], atol=2e-5, rtol=1e-5)
    # The logits spread: a wrong weight or a dropped norm could not hide under the tolerance.
    assert float(expected[0].std()) > 0.5


def test_teacher_shares_the_engine_tensors(tiny_target) -> None:
    teacher = wrap_engine_model(tiny_target.engine_model)
    engine = dict(tiny_target.engine_model.named_parameters(remove_duplicate=False))
    for name, param in teacher.named_parameters(remove_duplicate=False):
        assert param.data_ptr() == engine[name].data_ptr(), name
        assert not param.requires_grad


def test_draft_from_all_layers_is_the_target(tiny_target) -> None:
    draft = init_from_target(tiny_target, DraftInit(tuple(range(tiny_target.arch.num_hidden_layers)), True))
    expected = engine_logits(tiny_target.engine_model, SEQUENCES)
    with torch.no_grad():
        logits = draft.logits(draft(_padded(SEQUENCES)))
    for row, sequence in enumerate(SEQUENCES):
        torch.testing.assert_close(logits[row, : len(sequence)], expected[row], atol=2e-5, rtol=1e-5)


def test_draft_from_chosen_layers_copies_them_and_freezes_the_shared_embedding(tiny_target) -> None:
    vocab_ids = torch.tensor([0, 3, 10, 256, 257, 258])
    draft = init_from_target(tiny_target, DraftInit((0, 3), True, vocab_ids))
    engine = tiny_target.engine_model
    assert draft.arch.num_hidden_layers == 2
    torch.testing.assert_close(draft.layers[1].mlp.gate_up_proj.weight, engine.layers[3].mlp.gate_up_proj.weight,
                               atol=0, rtol=0)
    # Copies, not views: training the draft never writes into the target.
    assert draft.layers[0].self_attn.qkv_proj.weight.data_ptr() != engine.layers[0].self_attn.qkv_proj.weight.data_ptr()
    assert draft.layers[0].self_attn.qkv_proj.weight.requires_grad
    assert not draft.embed_tokens.weight.requires_grad and not draft.lm_head.weight.requires_grad
    assert draft.embed_tokens.weight.data_ptr() == engine.embed_tokens.weight.data_ptr()
    torch.testing.assert_close(draft.lm_head.weight, engine.lm_head.weight[vocab_ids], atol=0, rtol=0)
    assert set(draft.trainable_state()) == {n for n, p in draft.named_parameters() if p.requires_grad}
    assert not any(name.startswith(("embed_tokens", "lm_head")) for name in draft.trainable_state())


def test_gradients_flow_under_bf16_autocast(tiny_target) -> None:
    draft = init_from_target(tiny_target, DraftInit((0, 2), True))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = draft.logits(draft(_padded(SEQUENCES))).logsumexp(-1).mean()
    loss.backward()
    grads = [p.grad for p in draft.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_layer_choice() -> None:
    assert spread_layers(30, 3) == (0, 14, 29)
    assert spread_layers(30, 1) == (29,)
    assert parse_layer_ids("0,15,-1", 30) == (0, 15, 29)
    assert parse_layer_ids("2", 4) == (0, 3)
    with pytest.raises(ValueError, match="layers"):
        parse_layer_ids("0,30", 30)
    with pytest.raises(ValueError, match="num_layers"):
        spread_layers(4, 5)
