"""The command line end to end on a tiny target: data -> distill -> export -> eval."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from drafts.cli import main


def test_pipeline_commands(tiny_target_dir: str, tmp_path: Path) -> None:
    data, run, draft, out = tmp_path / "data", tmp_path / "run", tmp_path / "draft", tmp_path / "eval"
    assert main(["data", "--target", tiny_target_dir, "--out", str(data), "--device", "cpu", "--engine-dtype", "float32",
                 "--kv-cache-memory", "16MiB", "--stdlib-tokens", "3000", "--num-chat", "2", "--num-code-tasks", "1", "--num-code-completions", "1",
                 "--num-tool", "2", "--max-new-tokens", "4", "--seq-len", "128", "--num-eval-prompts", "1",
                 "--generation-batch-size", "2"]) == 0
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["tokens_per_kind"]["tool"] > 0 and manifest["tokens_per_kind"]["chat"] > 0
    assert len((data / "transcripts" / "train_tool.jsonl").read_text().splitlines()) == 2

    assert main(["distill", "--target", tiny_target_dir, "--data", str(data), "--run", str(run), "--device", "cpu",
                 "--layers", "2", "--draft-vocab-size", "40", "--top-k", "8", "--steps", "3", "--batch-size", "2",
                 "--export", str(draft), "--export-dtype", "float32"]) == 0
    assert (data / "teacher_k8_ids.npy").exists()  # the default teacher is precomputed
    vocab = load_file(str(draft / "draft_vocab.safetensors"))["draft_vocab_ids"]
    assert len(vocab) == 40 and {256, 257, 258} <= set(vocab.tolist())  # special tokens always in
    options = json.loads((run / "options.json").read_text())
    assert options["layer_ids"] == [0, 3]

    assert main(["export", "--run", str(run), "--out", str(tmp_path / "again"), "--dtype", "float32"]) == 0
    for name, tensor in load_file(str(draft / "model.safetensors")).items():
        assert torch.equal(tensor, load_file(str(tmp_path / "again" / "model.safetensors"))[name])

    assert main(["eval", "--target", tiny_target_dir, "--data", str(data), "--identity", "--device", "cpu", "--kv-cache-memory", "16MiB",
                 "--out", str(out), "--max-new-tokens", "6", "--max-k", "3", "--engine-dtype", "float32"]) == 0
    identity = json.loads((out / "report.json").read_text())
    assert identity["greedy"]["all"]["3"]["acceptance_rate"] >= 0.98
    assert identity["num_prompts"] == {"code": 1, "chat": 1, "tool": 1}
    assert main(["eval", "--target", tiny_target_dir, "--data", str(data), "--draft", str(draft), "--device", "cpu", "--kv-cache-memory", "16MiB",
                 "--out", str(out), "--report", str(out / "draft.json"), "--max-new-tokens", "6", "--max-k", "3",
                 "--engine-dtype", "float32"]) == 0
    report = json.loads((out / "draft.json").read_text())
    assert report["greedy"]["all"]["3"]["acceptance_rate"] < 1.0  # a 2-layer draft of a random model
    assert set(report) >= {"greedy", "t1_sampled_draft", "t1_greedy_draft", "greedy_target_agreement"}
