"""Acceptance evaluation: exact step replays, and a draft identical to the target accepts everything."""

from __future__ import annotations

import pytest
import torch

from drafts.evaluate import continuations, evaluate_acceptance, format_report, greedy_steps, sampled_steps
from drafts.init_draft import DraftInit, init_from_target
from drafts.target import load_target, wrap_engine_model


def test_greedy_steps_replay_speculation() -> None:
    matches = [True, True, False, True, True, True, False]
    counts = greedy_steps(matches, k=2)
    # Steps start at 0 (accept 2, then the target's token 2), at 3 (accept 2, token 5), at 6
    # (one token left: drafts 1, rejected).
    assert (counts.steps, counts.drafted, counts.accepted) == (3, 5, 4)
    assert counts.summary()["per_position_acceptance"] == [2 / 3, 1.0]
    counts = greedy_steps(matches, k=8)
    assert (counts.steps, counts.drafted, counts.accepted) == (2, 7 + 4, 2 + 3)  # then token 6 is the bonus
    assert greedy_steps([], k=4).steps == 0


def test_sampled_steps_multiply_acceptance_along_a_step() -> None:
    counts = sampled_steps([0.5, 1.0, 0.2], k=2)
    assert counts.steps == 3 and counts.drafted == 5
    assert counts.accepted == pytest.approx(0.5 + 0.5 + 1.0 + 0.2 + 0.2)
    assert counts.summary()["mean_accepted_drafts"] == pytest.approx(2.4 / 3)
    assert counts.summary()["mean_accepted_length"] == pytest.approx(2.4 / 3 + 1)


@pytest.fixture(scope="module")
def embedded():
    from engine.llm import LLM

    torch.set_num_threads(1)
    target = load_target(None, device=torch.device("cpu"), progress=False)
    llm = LLM(None, dtype="float32", kv_cache_memory="64MiB", num_threads=1)
    tok = target.tokenizer
    prompts = [
        ("code", tok.encode("def read_config(path):\n    \"\"\"Read a JSON config file.\"\"\"\n", add_special_tokens=True)),
        ("chat", tok.encode(tok.apply_chat_template([{"role": "user", "content": "Why is the sky blue?"}]))),
        ("tool", tok.encode(tok.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}])
                            + '<tool_call>\n{"name": "')),
    ]
    ids = [p for _, p in prompts]
    greedy = continuations(llm, ids, temperature=0.0, max_new_tokens=20, seed=0, cache_path=None)
    sampled = continuations(llm, ids, temperature=1.0, max_new_tokens=20, seed=0, cache_path=None)
    return target, prompts, greedy, sampled


def test_identical_draft_accepts_everything(embedded) -> None:
    target, prompts, greedy, sampled = embedded
    teacher = wrap_engine_model(target.engine_model)
    report = evaluate_acceptance(teacher, teacher, prompts, greedy, sampled, max_k=8, progress=False)
    for kind in ("code", "chat", "tool", "all"):
        for k in (1, 4, 8):
            assert report["greedy"][kind][k]["acceptance_rate"] >= 0.98, (kind, k)
            assert report["t1_sampled_draft"][kind][k]["acceptance_rate"] >= 0.999, (kind, k)
    # k = 8 over 20 tokens: 3 steps drafting 8, 8 and 2 tokens, each step's bonus token in
    # between: 18 accepted / 3 steps (less when a continuation stopped early at EOS).
    assert report["greedy"]["all"][8]["mean_accepted_drafts"] >= 5.5
    assert report["greedy_target_agreement"] >= 0.98
    assert "greedy" in format_report(report)


def test_a_cut_draft_is_measured_lower(embedded) -> None:
    target, prompts, greedy, sampled = embedded
    teacher = wrap_engine_model(target.engine_model)
    draft = init_from_target(target, DraftInit((0, 29), True, torch.arange(4096)))
    report = evaluate_acceptance(draft, teacher, prompts, greedy, sampled, max_k=4, progress=False)
    assert report["greedy"]["all"][1]["acceptance_rate"] < 0.5
    assert report["t1_sampled_draft"]["all"][1]["acceptance_rate"] < 0.5
