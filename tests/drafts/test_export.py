"""The draft folder format: files, names, shapes; loadable by the engine's loader, by
transformers (an independent reader of the names and layouts) and back by drafts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from draft_harness import engine_logits
from safetensors.torch import load_file

from drafts.checkpoint import DraftMeta
from drafts.export import export_draft, load_draft, read_draft_folder
from drafts.init_draft import DraftInit, init_from_target
from drafts.pipeline import export_run
from drafts.target import Target
from drafts.train import Distiller, TrainConfig
from drafts.teacher import OnTheFlyTeacher
from drafts.target import wrap_engine_model
from engine.model.loader import load_model
from engine.model.resolve import resolve_model

VOCAB_IDS = torch.tensor([0, 1, 5, 9, 17, 40, 100, 200, 256, 257, 258])
SEQUENCE = [5, 17, 200, 3, 44, 90, 91, 12, 7, 250, 33, 1]


def _trained_looking_draft(target: Target, vocab_ids: torch.Tensor | None) -> torch.nn.Module:
    """Layers 0 and 3 of the target, perturbed so the draft differs from any target slice."""
    draft = init_from_target(target, DraftInit((0, 3), True, vocab_ids))
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for param in draft.parameters():
            if param.requires_grad:
                param.add_(0.02 * torch.randn(param.shape, generator=generator))
    return draft


def _draft_logits(draft: torch.nn.Module, ids: list[int]) -> torch.Tensor:  # [len(ids), num_outputs]
    with torch.no_grad():
        return draft.logits(draft(torch.tensor([ids])))[0]


def test_shared_embedding_folder(tiny_target: Target, tmp_path: Path) -> None:
    draft = _trained_looking_draft(tiny_target, VOCAB_IDS)
    export_draft(draft, str(tmp_path), target_name="tiny-llama", shared_embedding=True, dtype=torch.bfloat16)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "draft_vocab.safetensors", "model.safetensors"]
    config = json.loads((tmp_path / "config.json").read_text())
    arch = tiny_target.arch
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["draftgate"] == {"target": "tiny-llama", "shared_embedding": True, "draft_vocab_size": len(VOCAB_IDS)}
    assert config["hidden_size"] == arch.hidden_size and config["num_hidden_layers"] == 2
    assert config["vocab_size"] == arch.vocab_size and config["tie_word_embeddings"] is True
    tensors = load_file(str(tmp_path / "model.safetensors"))
    q, kv, h, inter = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim, \
        arch.hidden_size, arch.intermediate_size
    expected = {"model.norm.weight": (h,)}
    for i in range(2):
        p = f"model.layers.{i}."
        expected.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                         p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                         p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                         p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                         p + "mlp.down_proj.weight": (h, inter)})
    assert {name: tuple(t.shape) for name, t in tensors.items()} == expected
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    vocab = load_file(str(tmp_path / "draft_vocab.safetensors"))["draft_vocab_ids"]
    assert vocab.dtype == torch.int64 and torch.equal(vocab, VOCAB_IDS)
    # The q rows are the first shard of the fused projection, k the second.
    fused = draft.layers[1].self_attn.qkv_proj.weight
    torch.testing.assert_close(tensors["model.layers.1.self_attn.k_proj.weight"], fused[q: q + kv].bfloat16(),
                               atol=0, rtol=0)


@pytest.mark.parametrize("vocab_ids", [None, VOCAB_IDS], ids=["full_vocab", "reduced_vocab"])
def test_standalone_copy_loads_in_the_engine(tiny_target: Target, tmp_path: Path, vocab_ids: torch.Tensor | None) -> None:
    draft = _trained_looking_draft(tiny_target, vocab_ids)
    export_draft(draft, str(tmp_path), target_name="tiny-llama", shared_embedding=False, dtype=torch.float32)
    model, arch = load_model(resolve_model(str(tmp_path)), torch.float32, "cpu", progress=False)
    assert arch.num_hidden_layers == 2
    logits = engine_logits(model, [SEQUENCE])[0]  # [len, vocab]
    if vocab_ids is not None:
        logits = logits[:, vocab_ids]  # the draft's logits are over its vocabulary only
    torch.testing.assert_close(logits, _draft_logits(draft, SEQUENCE), atol=2e-5, rtol=1e-5)


def test_standalone_copy_loads_in_transformers(tiny_target: Target, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    draft = _trained_looking_draft(tiny_target, None)
    export_draft(draft, str(tmp_path), target_name="tiny-llama", shared_embedding=False, dtype=torch.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(torch.tensor([SEQUENCE])).logits[0]
    torch.testing.assert_close(_draft_logits(draft, SEQUENCE), expected, atol=2e-5, rtol=1e-5)


def test_load_draft_round_trip(tiny_target: Target, tmp_path: Path) -> None:
    draft = _trained_looking_draft(tiny_target, VOCAB_IDS)
    export_draft(draft, str(tmp_path), target_name="tiny-llama", shared_embedding=True, dtype=torch.float32)
    loaded, meta = load_draft(str(tmp_path), tiny_target)
    assert meta.shared_embedding and torch.equal(meta.vocab_ids, VOCAB_IDS)
    torch.testing.assert_close(_draft_logits(loaded, SEQUENCE), _draft_logits(draft, SEQUENCE), atol=0, rtol=0)
    # The engine's draft loader reads the same folder (when the engine side is present).
    spec = pytest.importorskip("engine.spec_decode.draft_model")
    engine_draft = spec.load_draft_model(str(tmp_path), tiny_target.engine_model, tiny_target.arch,
                                         torch.float32, torch.device("cpu"))
    hidden = engine_logits_hidden(engine_draft.model, SEQUENCE)
    rows = torch.nn.functional.linear(hidden, engine_draft.head_weight)
    torch.testing.assert_close(rows, _draft_logits(draft, SEQUENCE), atol=2e-5, rtol=1e-5)


def engine_logits_hidden(model: torch.nn.Module, sequence: list[int]) -> torch.Tensor:  # [len, hidden]
    from engine.model.attention_metadata import AttentionMetadata

    arch = model.arch
    kv = [torch.zeros(2, 8, arch.num_key_value_heads, 4, arch.head_dim) for _ in range(arch.num_hidden_layers)]
    meta = AttentionMetadata.build(query_lens=[len(sequence)], seq_lens=[len(sequence)], block_ids=[[3, 1, 6]],
                                   block_size=4, device="cpu")
    with torch.inference_mode():
        return model(torch.tensor(sequence), torch.arange(len(sequence)), kv, meta)


def test_folder_errors(tiny_target: Target, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        read_draft_folder(str(tmp_path))
    draft = _trained_looking_draft(tiny_target, None)
    export_draft(draft, str(tmp_path), target_name="t", shared_embedding=True, dtype=torch.float32)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["draftgate"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="draftgate"):
        read_draft_folder(str(tmp_path))


def test_export_from_a_run_checkpoint(tiny_target: Target, tmp_path: Path) -> None:
    from draft_harness import corpus_from_text

    corpus = corpus_from_text(tiny_target.tokenizer, ["def f(x):\n    return x + 1\n" * 8] * 3, seq_len=40)
    draft = init_from_target(tiny_target, DraftInit((1, 2), True, VOCAB_IDS))
    meta = DraftMeta(tiny_target.name, draft.arch, True, [1, 2], VOCAB_IDS)
    teacher = OnTheFlyTeacher(wrap_engine_model(tiny_target.engine_model), 8, autocast_dtype=None)
    from drafts.vocab import target_to_draft_map

    distiller = Distiller(draft, teacher, corpus, TrainConfig(steps=3, batch_size=2), str(tmp_path / "run"), meta,
                          target_to_draft=target_to_draft_map(VOCAB_IDS, tiny_target.arch.vocab_size),
                          autocast_dtype=None, progress=False)
    distiller.train()
    export_run(str(tmp_path / "run"), str(tmp_path / "draft"), dtype="float32")
    loaded, _ = load_draft(str(tmp_path / "draft"), tiny_target)
    torch.testing.assert_close(_draft_logits(loaded, SEQUENCE), _draft_logits(draft, SEQUENCE), atol=0, rtol=0)
