"""A tiny distillation run: the KL goes down, and a resumed run continues the same trajectory
(in process, and after a real kill -9 of the CLI)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from drafts.checkpoint import DraftMeta, load_checkpoint
from drafts.data.corpus import Corpus
from drafts.init_draft import DraftInit, init_from_target
from drafts.target import Target, wrap_engine_model
from drafts.teacher import OnTheFlyTeacher, TeacherCache
from drafts.train import Distiller, TrainConfig, lr_at
from drafts.vocab import target_to_draft_map

REPO = Path(__file__).resolve().parents[2]


def _corpus(seed: int = 0, num_docs: int = 12) -> Corpus:
    """Documents with structure a 2-layer draft can pick up: repeated random phrases."""
    rng = np.random.default_rng(seed)
    phrases = [list(rng.integers(0, 256, size=rng.integers(3, 8))) for _ in range(10)]
    documents = []
    for _ in range(num_docs):
        ids: list[int] = []
        while len(ids) < 80:
            ids += [int(t) for t in phrases[int(rng.integers(0, 10))]]
        documents.append(("stdlib", ids))
    return Corpus.from_documents(documents, seq_len=32)


def _distiller(target: Target, run_dir: Path, config: TrainConfig, *, vocab: bool = True) -> Distiller:
    vocab_ids = torch.tensor(sorted(set(range(0, 259, 2)) | {256, 257, 258})) if vocab else None
    init = DraftInit((0, 3), True, vocab_ids)
    draft = init_from_target(target, init)
    meta = DraftMeta(target.name, draft.arch, True, [0, 3], vocab_ids)
    teacher = OnTheFlyTeacher(wrap_engine_model(target.engine_model), top_k=16, autocast_dtype=None)
    mapping = None if vocab_ids is None else target_to_draft_map(vocab_ids, target.arch.vocab_size)
    return Distiller(draft, teacher, _corpus(), config, str(run_dir), meta, target_to_draft=mapping,
                     autocast_dtype=None, progress=False)


def test_tiny_distillation_reduces_kl(tiny_target: Target, tmp_path: Path) -> None:
    config = TrainConfig(steps=40, batch_size=4, lr=3e-3, warmup_steps=4, checkpoint_every=100, log_every=10)
    distiller = _distiller(tiny_target, tmp_path / "run", config)
    losses = distiller.train()
    assert len(losses) == 40
    first, last = np.mean(losses[:4]), np.mean(losses[-4:])
    assert last < 0.6 * first, (first, last)
    log = [json.loads(line) for line in open(tmp_path / "run" / "log.jsonl")]
    assert [entry["step"] for entry in log] == [10, 20, 30, 40]


def test_resume_continues_the_same_trajectory(tiny_target: Target, tmp_path: Path) -> None:
    config = TrainConfig(steps=10, batch_size=3, lr=2e-3, warmup_steps=2, checkpoint_every=4)
    straight = _distiller(tiny_target, tmp_path / "straight", config).train()

    first = _distiller(tiny_target, tmp_path / "resumed", config)
    head = first.train(stop_at=6)
    assert load_checkpoint(str(tmp_path / "resumed"))["step"] == 6
    # A new process would build everything again from scratch: a fresh draft and optimizer.
    second = _distiller(tiny_target, tmp_path / "resumed", config)
    assert second.step == 6
    tail = second.train()
    assert head + tail == straight  # bitwise: same batches, same weights, same AdamW moments


def test_batches_are_a_function_of_the_step(tiny_target: Target, tmp_path: Path) -> None:
    config = TrainConfig(steps=50, batch_size=5, seed=3)
    distiller = _distiller(tiny_target, tmp_path / "run", config)
    num_windows = distiller.corpus.num_windows
    epoch = [i for step in range(num_windows) for i in distiller.batch_indices(step)][:num_windows]
    assert sorted(epoch) == list(range(num_windows))  # every window once per epoch
    assert distiller.batch_indices(7) == distiller.batch_indices(7)


def test_schedule() -> None:
    config = TrainConfig(steps=100, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, config) == pytest.approx(1e-4)
    assert lr_at(9, config) == pytest.approx(1e-3)
    assert lr_at(10, config) == pytest.approx(1e-3)
    assert lr_at(55, config) == pytest.approx(0.55e-3)
    assert lr_at(100, config) == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="lr"):
        TrainConfig(lr=0)


def test_teacher_cache_equals_online_teacher_and_resumes(tiny_target: Target, tmp_path: Path) -> None:
    corpus = _corpus()
    online = OnTheFlyTeacher(wrap_engine_model(tiny_target.engine_model), top_k=8, autocast_dtype=None)
    cache = TeacherCache(str(tmp_path), corpus, 8, tiny_target.name)
    cache.precompute(online, batch_size=3, device=torch.device("cpu"))
    assert cache.complete
    indices = [0, 5, corpus.num_windows - 1]
    from drafts.teacher import pad_windows

    input_ids, _ = pad_windows(corpus, indices, torch.device("cpu"))
    want_ids, want_lp = online.targets(indices, input_ids)
    got_ids, got_lp = cache.targets(indices, input_ids)
    for row, index in enumerate(indices):
        n = len(corpus.window(index))
        assert torch.equal(got_ids[row, :n], want_ids[row, :n])
        torch.testing.assert_close(got_lp[row, :n], want_lp[row, :n], atol=2e-2, rtol=1e-3)  # stored in fp16

    # Interrupted after 3 windows: rows beyond are garbage, progress says 3; precompute redoes them.
    ids_file = np.load(tmp_path / "teacher_k8_ids.npy", mmap_mode="r+")
    start = int(corpus.window_starts[3])
    ids_file[start:] = -7
    ids_file.flush()
    del ids_file
    with open(tmp_path / "teacher_k8.json", "w") as f:
        json.dump({"target": tiny_target.name, "num_tokens": corpus.num_tokens, "windows_done": 3}, f)
    resumed = TeacherCache(str(tmp_path), corpus, 8, tiny_target.name)
    assert resumed.windows_done == 3 and not resumed.complete
    resumed.precompute(online, batch_size=3, device=torch.device("cpu"))
    again_ids, _ = resumed.targets(indices, input_ids)
    assert torch.equal(again_ids, got_ids)
    # Another target's cache is never reused.
    assert TeacherCache(str(tmp_path), corpus, 8, "another-model").windows_done == 0


@pytest.mark.slow
def test_kill_9_then_resume(tiny_target_dir: str, tmp_path: Path) -> None:
    """The CLI, killed with SIGKILL between checkpoints, resumes to the same final state (three
    processes: about a minute on a busy 2-core machine, hence slow)."""
    data = tmp_path / "data"
    data.mkdir()
    _corpus(num_docs=30).save(str(data))
    common = [sys.executable, "-m", "drafts", "distill", "--target", tiny_target_dir, "--data", str(data),
              "--layers", "0,3", "--draft-vocab-size", "64", "--top-k", "8", "--teacher", "online", "--device", "cpu",
              "--threads", "1", "--steps", "30", "--batch-size", "2", "--lr", "0.002", "--warmup-steps", "5",
              "--checkpoint-every", "5", "--log-every", "5"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    reference = subprocess.run(common + ["--run", str(tmp_path / "reference")], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr[-2000:]

    run = tmp_path / "killed"
    process = subprocess.Popen(common + ["--run", str(run)], cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            payload = load_checkpoint(str(run)) if (run / "checkpoint.pt").exists() else None
            if payload is not None and payload["step"] >= 5:
                break
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=30)
    killed_at = load_checkpoint(str(run))["step"]
    assert killed_at < 30, "the run finished before it could be killed"
    resumed = subprocess.run(common + ["--run", str(run)], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    final, expected = load_checkpoint(str(run)), load_checkpoint(str(tmp_path / "reference"))
    assert final["step"] == expected["step"] == 30
    assert final["losses"] == expected["losses"]
    for name, tensor in expected["model"].items():
        assert torch.equal(final["model"][name], tensor), name


def test_chunked_head_gives_the_same_step(tiny_target: Target, tmp_path: Path) -> None:
    """The head and loss in chunks of 7 positions: the same loss and the same update as in one piece."""
    whole = _distiller(tiny_target, tmp_path / "whole", TrainConfig(steps=2, batch_size=3, loss_chunk_tokens=4096))
    chunked = _distiller(tiny_target, tmp_path / "chunked", TrainConfig(steps=2, batch_size=3, loss_chunk_tokens=7))
    a, b = whole.train_step(), chunked.train_step()
    assert a["tokens"] == b["tokens"] > 7
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert a["top1"] == pytest.approx(b["top1"])
    for (name, p), q in zip(whole.draft.named_parameters(), chunked.draft.parameters()):
        if p.requires_grad:
            torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=name)
