"""Training an EAGLE head on a tiny target: the stored states are the target's, the loss goes
down, a resumed run continues the same trajectory, and the exported folder loads in the engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from drafts.checkpoint import DraftMeta
from drafts.eagle import EagleDistiller, init_eagle
from drafts.export import export_draft
from drafts.features import FeatureCache
from drafts.target import Target, wrap_engine_model
from drafts.teacher import OnTheFlyTeacher, pad_windows
from drafts.train import TrainConfig
from drafts.vocab import target_to_draft_map
from engine.spec_decode.draft_model import load_draft_model
from test_distill import _corpus


def _features(target: Target, folder: Path) -> FeatureCache:
    corpus = _corpus()
    cache = FeatureCache(str(folder), corpus, target.arch.hidden_size, target.name)
    cache.precompute(wrap_engine_model(target.engine_model), batch_size=5, device=torch.device("cpu"),
                     autocast_dtype=None, progress=False)
    return cache


def _distiller(target: Target, run_dir: Path, features: FeatureCache, config: TrainConfig,
               unroll: int = 2) -> EagleDistiller:
    vocab_ids = torch.tensor(sorted(set(range(0, 259, 2)) | {256, 257, 258}))
    head = init_eagle(target, 3, vocab_ids)
    meta = DraftMeta(target.name, head.arch, True, [3], vocab_ids, kind="eagle")
    teacher = OnTheFlyTeacher(wrap_engine_model(target.engine_model), top_k=16, autocast_dtype=None)
    return EagleDistiller(head, teacher, features.corpus, config, str(run_dir), meta, features=features,
                          target_to_draft=target_to_draft_map(vocab_ids, target.arch.vocab_size),
                          autocast_dtype=None, unroll=unroll, progress=False)


def test_feature_cache_holds_the_target_states_and_resumes(tiny_target: Target, tmp_path: Path) -> None:
    cache = _features(tiny_target, tmp_path)
    corpus = cache.corpus
    indices = [0, 3, corpus.num_windows - 1]
    input_ids, lengths = pad_windows(corpus, indices, torch.device("cpu"))
    with torch.no_grad():
        expected = wrap_engine_model(tiny_target.engine_model)(input_ids)
    stored = cache.windows(indices, input_ids.shape[1])
    for row, length in enumerate(lengths):
        torch.testing.assert_close(stored[row, :length], expected[row, :length], atol=2e-3, rtol=2e-3)
        assert not stored[row, length:].any()
    # Cut the progress back: a new precompute redoes only the windows after it.
    progress = json.loads((tmp_path / f"features_h{tiny_target.arch.hidden_size}.json").read_text())
    assert progress["windows_done"] == corpus.num_windows
    progress["windows_done"] = 5
    (tmp_path / f"features_h{tiny_target.arch.hidden_size}.json").write_text(json.dumps(progress))
    again = FeatureCache(str(tmp_path), corpus, tiny_target.arch.hidden_size, tiny_target.name)
    assert again.windows_done == 5 and not again.complete
    again.precompute(wrap_engine_model(tiny_target.engine_model), batch_size=5, device=torch.device("cpu"),
                     autocast_dtype=None, progress=False)
    assert again.complete
    torch.testing.assert_close(again.windows(indices, input_ids.shape[1]), stored)


def test_one_target_pass_fills_the_teacher_and_state_caches(tiny_target: Target, tmp_path: Path) -> None:
    """TeacherCache.precompute(features=...) stores what the two separate passes store."""
    from drafts.teacher import TeacherCache
    apart = _features(tiny_target, tmp_path / "apart")
    corpus = apart.corpus
    teacher = OnTheFlyTeacher(wrap_engine_model(tiny_target.engine_model), top_k=8, autocast_dtype=None)
    apart_top = TeacherCache(str(tmp_path / "apart"), corpus, 8, tiny_target.name)
    apart_top.precompute(teacher, batch_size=5, device=torch.device("cpu"))
    states = FeatureCache(str(tmp_path / "one"), corpus, tiny_target.arch.hidden_size, tiny_target.name)
    top = TeacherCache(str(tmp_path / "one"), corpus, 8, tiny_target.name)
    top.precompute(teacher, batch_size=5, device=torch.device("cpu"), features=states)
    assert states.complete and top.complete
    indices = list(range(corpus.num_windows))
    input_ids, _ = pad_windows(corpus, indices, torch.device("cpu"))
    torch.testing.assert_close(states.windows(indices, input_ids.shape[1]), apart.windows(indices, input_ids.shape[1]))
    for got, want in zip(top.targets(indices, input_ids), apart_top.targets(indices, input_ids)):
        torch.testing.assert_close(got, want)
    # Apart (the state cache ahead of the teacher's): the teacher pass leaves it alone.
    again = FeatureCache(str(tmp_path / "again"), corpus, tiny_target.arch.hidden_size, tiny_target.name)
    TeacherCache(str(tmp_path / "again"), corpus, 8, tiny_target.name).precompute(
        teacher, batch_size=5, device=torch.device("cpu"), features=_features(tiny_target, tmp_path / "again"))
    assert again.complete


def test_head_learns_and_resumes(tiny_target: Target, tmp_path: Path) -> None:
    features = _features(tiny_target, tmp_path / "data")
    config = TrainConfig(steps=40, batch_size=4, lr=3e-3, warmup_steps=4, checkpoint_every=100, log_every=10)
    losses = _distiller(tiny_target, tmp_path / "run", features, config).train()
    assert np.mean(losses[-4:]) < 0.7 * np.mean(losses[:4]), (losses[:4], losses[-4:])
    log = [json.loads(line) for line in open(tmp_path / "run" / "log.jsonl")]
    assert log[-1]["top1"] > log[0]["top1"] and "top1_second" in log[-1]

    short = TrainConfig(steps=8, batch_size=3, lr=2e-3, warmup_steps=2, checkpoint_every=4)
    straight = _distiller(tiny_target, tmp_path / "straight", features, short).train()
    first = _distiller(tiny_target, tmp_path / "resumed", features, short)
    head_losses = first.train(stop_at=4)
    second = _distiller(tiny_target, tmp_path / "resumed", features, short)
    assert second.step == 4
    assert head_losses + second.train() == straight


def test_exported_head_loads_in_the_engine(tiny_target: Target, tmp_path: Path) -> None:
    features = _features(tiny_target, tmp_path / "data")
    distiller = _distiller(tiny_target, tmp_path / "run", features, TrainConfig(steps=2, batch_size=2), unroll=1)
    distiller.train()
    export_draft(distiller.draft, str(tmp_path / "head"), target_name=tiny_target.name, shared_embedding=True,
                 dtype=torch.float32)
    loaded = load_draft_model(str(tmp_path / "head"), tiny_target.engine_model, tiny_target.arch, torch.float32,
                              torch.device("cpu"))
    assert loaded.fc_weight is not None
    torch.testing.assert_close(loaded.fc_weight, distiller.draft.fc.weight.detach())
    assert loaded.arch.num_hidden_layers == 1
    # --init-checkpoint with --eagle: a new head (another draft vocabulary) continues this one's
    # layer, norm and fc exactly.
    from drafts.pipeline import _warm_start_eagle
    other_vocab = torch.tensor(sorted(set(range(1, 259, 3)) | {256, 257, 258}))
    continued = init_eagle(tiny_target, 0, other_vocab)
    _warm_start_eagle(continued, str(tmp_path / "head"), tiny_target)
    trained = dict(distiller.draft.named_parameters())
    for name, param in continued.named_parameters():
        if name.startswith(("layers.", "norm.", "fc.")):
            torch.testing.assert_close(param, trained[name].detach(), msg=name)
    assert not torch.equal(continued.layers[0].self_attn.qkv_proj.weight,
                           init_eagle(tiny_target, 0, other_vocab).layers[0].self_attn.qkv_proj.weight)


def test_eval_replays_the_head_through_the_engine(tiny_target: Target, tmp_path: Path) -> None:
    from drafts.evaluate import eagle_rollout_matches, evaluate_eagle_acceptance, greedy_steps
    from engine.spec_decode.eagle import EagleProposer

    features = _features(tiny_target, tmp_path / "data")
    distiller = _distiller(tiny_target, tmp_path / "run", features, TrainConfig(steps=20, batch_size=4, lr=3e-3))
    distiller.train()
    export_draft(distiller.draft, str(tmp_path / "head"), target_name=tiny_target.name, shared_embedding=True,
                 dtype=torch.float32)
    loaded = load_draft_model(str(tmp_path / "head"), tiny_target.engine_model, tiny_target.arch, torch.float32,
                              torch.device("cpu"))
    proposer = EagleProposer(loaded, num_blocks=16, block_size=8, device=torch.device("cpu"), dtype=torch.float32)
    corpus = features.corpus
    window = [int(t) for t in corpus.window(0)]
    prompt, continuation = window[:12], window[12:]
    teacher = wrap_engine_model(tiny_target.engine_model)
    with torch.no_grad():
        states = teacher(torch.tensor([window]))[0]
        # The first draft of every start comes from the target's own states: teacher-forced.
        head = distiller.draft.eval()
        rows = head.logits(head(torch.tensor([window[1:]]), states[None, :-1])[0]).argmax(-1)
        first_drafts = head.vocab_ids[rows].tolist()  # first_drafts[p]: the draft of token p + 2
    matches = eagle_rollout_matches(proposer, states, prompt, continuation, max_k=4)
    assert [m[0] for m in matches] == [first_drafts[len(prompt) + t - 2] == continuation[t]
                                       for t in range(len(continuation))]
    assert all(len(m) == min(4, len(continuation) - t) for t, m in enumerate(matches))
    report = evaluate_eagle_acceptance(proposer, teacher, [("code", prompt)], [continuation], max_k=4,
                                       progress=False)
    k1 = greedy_steps([m[0] for m in matches], 1).summary()
    assert report["greedy"]["code"][1] == k1
    assert set(report["greedy"]) == {"code", "all"}


def test_a_continued_head_can_keep_its_draft_vocabulary(tiny_target: Target, tmp_path: Path) -> None:
    """--draft-vocab-from: the vocabulary comes from a draft folder, not from the corpus counts;
    with both options, a folder without a reduced vocabulary, or one lacking a special token,
    a clear error."""
    from drafts.pipeline import DistillOptions, build_draft
    corpus = _corpus()
    specials = sorted(tiny_target.tokenizer.all_special_ids)
    kept = torch.tensor(sorted(set(range(1, 200, 7)) | set(specials)))
    export_draft(init_eagle(tiny_target, 3, kept), str(tmp_path / "head"), target_name=tiny_target.name,
                 shared_embedding=True, dtype=torch.float32)
    options = DistillOptions(target=None, data_dir="", run_dir=str(tmp_path / "run"), eagle=True,
                             init_checkpoint=str(tmp_path / "head"), draft_vocab_from=str(tmp_path / "head"))
    head, meta = build_draft(options, tiny_target, corpus)
    assert torch.equal(meta.vocab_ids, kept) and torch.equal(head.vocab_ids, kept)
    by_counts, _ = build_draft(DistillOptions(target=None, data_dir="", run_dir=str(tmp_path / "run2"), eagle=True,
                                              draft_vocab_size=len(kept)), tiny_target, corpus)
    assert not torch.equal(by_counts.vocab_ids, kept)  # the corpus's most frequent tokens differ

    with pytest.raises(ValueError, match="not both"):
        DistillOptions(target=None, data_dir="", run_dir="r", draft_vocab_size=8, draft_vocab_from="x")
    export_draft(init_eagle(tiny_target, 3, None), str(tmp_path / "full"), target_name=tiny_target.name,
                 shared_embedding=True, dtype=torch.float32)
    with pytest.raises(ValueError, match="no reduced vocabulary"):
        build_draft(DistillOptions(target=None, data_dir="", run_dir=str(tmp_path / "run3"), eagle=True,
                                   draft_vocab_from=str(tmp_path / "full")), tiny_target, corpus)
    export_draft(init_eagle(tiny_target, 3, torch.tensor([1, 2, 3])), str(tmp_path / "bare"),
                 target_name=tiny_target.name, shared_embedding=True, dtype=torch.float32)
    assert set(specials) - {1, 2, 3}  # the harness's ChatML specials are 256-258
    with pytest.raises(ValueError, match="special tokens"):
        build_draft(DistillOptions(target=None, data_dir="", run_dir=str(tmp_path / "run4"), eagle=True,
                                   draft_vocab_from=str(tmp_path / "bare")), tiny_target, corpus)
