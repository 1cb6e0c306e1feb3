"""engine.benchmarks.step_forms: each form is the embedded model (the held forms the same weights,
read through the compiled stack where this CPU takes them), and a short sweep gives a table row
per count."""

from __future__ import annotations

import torch

from engine.benchmarks import step_forms
from engine.model.attention_metadata import AttentionMetadata
from engine.worker.kv_cache import KVCacheSpec, allocate_kv_caches
from kernels.small_rows_linear import held_weights_enabled


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    arch, dtype = model.arch, model.embed_tokens.weight.dtype
    spec = KVCacheSpec(num_layers=arch.num_hidden_layers, num_kv_heads=arch.num_key_value_heads,
                       head_dim=arch.head_dim, block_size=16, dtype=dtype)
    caches = allocate_kv_caches(spec, 2, torch.device("cpu"))
    meta = AttentionMetadata.build(query_lens=[len(ids)], seq_lens=[len(ids)], block_ids=[[0, 1]], block_size=16,
                                   device=torch.device("cpu"))
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), caches, meta)  # [len(ids), hidden]
        return model.compute_logits(hidden).float()  # [len(ids), vocab]


def test_every_form_is_the_same_model_and_a_sweep_gives_a_row_per_count() -> None:
    forms = step_forms._forms()
    assert "float32" in forms
    if held_weights_enabled():
        assert {"float32 over bf16-held layers", "float32 over int8-held layers"} <= set(forms)
        for name in ("float32 over bf16-held layers", "float32 over int8-held layers"):
            assert forms[name]._fused_decoder() is not None  # (what the form is there to time)
    ids = [1, 504, 3458, 314, 253, 1345, 30, 4]  # [8]
    reference = _logits(forms["float32"], ids)
    for name, model in forms.items():
        logits = _logits(model, ids)
        similarity = torch.nn.functional.cosine_similarity(logits, reference, dim=-1)  # [8]
        assert similarity.min() > 0.98, name  # rounded weights (or activations), not another model
    results = step_forms.measure(forms, max_rows=2, rounds=1)
    assert set(results) == set(forms)
    assert all(set(seconds) == {1, 2} and min(seconds.values()) > 0 for seconds in results.values())
    text = step_forms.table(results)
    assert len(text.splitlines()) == 2 + 2 and text.splitlines()[2].startswith("| 1 |")
