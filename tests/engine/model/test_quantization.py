"""Quantize-at-load on tiny random models: every linear swapped, the output close to the
unquantized model's (int8 and fp8 closely, int4 loosely), greedy tokens kept where the margin
allows; the float32 and bf16 prepacks change nothing but the speed; fp8 KV caches; option validation."""

from __future__ import annotations

import pytest
import torch

from engine.config import build_engine_config
from engine.model.layers.linear import Linear
from engine.model.layers.quant_linear import Int4Linear, Int8Linear, PackedLinear
from engine.model.llama import LlamaForCausalLM
from engine.model import quantization
from engine.model.quantization import prepacked_form, prepare_for_inference
from engine.worker.kv_cache import KVCacheSpec, allocate_kv_caches
from kernels import FP8KVCache
from kernels.onednn_linear import onednn_available, onednn_bf16_available
from model_harness import PagedDriver, random_prompts, tiny_model

pytest.importorskip("transformers")


def _model(family: str = "qwen2_bias", dtype: torch.dtype = torch.float32, **overrides) -> LlamaForCausalLM:
    return tiny_model(family, dtype, **overrides)


def _logits(model: LlamaForCausalLM, prompts: list[list[int]], kv_fp8: bool = False) -> list[torch.Tensor]:
    driver = PagedDriver(model, model.arch)
    if kv_fp8:
        spec = KVCacheSpec(model.arch.num_hidden_layers, model.arch.num_key_value_heads, model.arch.head_dim,
                           driver.block_size, torch.float32, torch.float8_e4m3fn)
        driver.kv_caches = allocate_kv_caches(spec, driver.num_blocks, torch.device("cpu"))
    out = driver.step({i: p for i, p in enumerate(prompts)})
    return [out[i] for i in range(len(prompts))]


@pytest.mark.parametrize("method,tolerance", [("int8", 0.03), ("fp8", 0.12), ("int4", 0.25)])
def test_quantized_logits_track_the_full_precision_model(method: str, tolerance: float) -> None:
    prompts = random_prompts([9, 5], 300, seed=1)
    reference = _logits(_model(), prompts)
    model = _model()
    prepare_for_inference(model, method, torch.device("cpu"), int4_group_size=32)
    assert not any(isinstance(m, Linear) for m in model.modules())
    got = _logits(model, prompts)
    for ours, ref in zip(got, reference):
        spread = ref.std().item()
        error = (ours - ref).abs().mean().item()
        assert error < tolerance * spread, (method, error, spread)


def test_int4_keeps_the_lm_head_in_int8() -> None:
    model = _model("llama_tied")
    prepare_for_inference(model, "int4", torch.device("cpu"), int4_group_size=32)
    assert isinstance(model.layers[0].mlp.down_proj, Int4Linear)
    assert isinstance(model.lm_head.inner, Int8Linear)
    # Tied: the head still exposes the embedding's tensor (draft models read its rows).
    assert model.lm_head.weight is model.embed_tokens.weight
    assert model.compute_logits(torch.randn(2, 64)).dtype == torch.float32


def test_untied_head_drops_its_full_precision_weight() -> None:
    model = _model("qwen2_bias")
    prepare_for_inference(model, "int8", torch.device("cpu"))
    assert isinstance(model.lm_head, Int8Linear) and not hasattr(model.lm_head, "weight")


@pytest.mark.skipif(not onednn_bf16_available(), reason="needs oneDNN and a CPU with native bf16")
def test_bf16_prepack_is_the_default_form_and_keeps_the_output() -> None:
    prompts = random_prompts([7, 3], 300, seed=2)
    reference = _logits(_model(dtype=torch.bfloat16), prompts)
    model = _model(dtype=torch.bfloat16)
    assert prepare_for_inference(model, None, torch.device("cpu")) == "bf16-prepacked"
    assert isinstance(model.layers[0].self_attn.qkv_proj, PackedLinear)
    for ours, ref in zip(_logits(model, prompts), reference):
        torch.testing.assert_close(ours, ref, atol=0.05 * ref.abs().max().item(), rtol=0.02)


@pytest.mark.skipif(not onednn_available(), reason="needs oneDNN")
def test_float32_prepack_is_the_default_form_on_cpu_and_keeps_the_output() -> None:
    prompts = random_prompts([7, 3], 300, seed=2)
    reference = _logits(_model(), prompts)
    model = _model()
    assert prepare_for_inference(model, None, torch.device("cpu")) == "fp32-prepacked"
    assert isinstance(model.layers[0].mlp.down_proj, PackedLinear)
    for ours, ref in zip(_logits(model, prompts), reference):
        # Strict float32, summed in another order: rounding-level differences only.
        torch.testing.assert_close(ours, ref, atol=1e-4 * ref.abs().max().item(), rtol=1e-4)


def test_prepacking_is_cpu_only_and_bf16_needs_native_bf16() -> None:
    assert prepacked_form(torch.float32, torch.device("cuda")) is None
    assert prepacked_form(torch.bfloat16, torch.device("cuda")) is None
    assert prepacked_form(torch.float16, torch.device("cpu")) is None
    expected = "bf16-prepacked" if onednn_bf16_available() else None
    assert prepacked_form(torch.bfloat16, torch.device("cpu")) == expected


def test_float32_model_off_onednn_is_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantization, "onednn_available", lambda: False)
    model = _model()
    assert prepare_for_inference(model, None, torch.device("cpu")) is None
    assert isinstance(model.layers[0].mlp.down_proj, Linear)


def test_fp8_kv_cache_tracks_the_plain_cache() -> None:
    model = _model("qwen3_qk_norm")
    prompts = random_prompts([12, 6], 300, seed=3)
    plain = _logits(model, prompts)
    fp8 = _logits(model, prompts, kv_fp8=True)
    for ours, ref in zip(fp8, plain):
        assert (ours - ref).abs().mean() < 0.05 * ref.std()


def test_fp8_kv_spec_counts_scales_and_allocates_them() -> None:
    spec = KVCacheSpec(2, 3, 64, 16, torch.bfloat16, torch.float8_e4m3fn)
    assert spec.bytes_per_block == 2 * 2 * 16 * 3 * (64 + 4)
    caches = allocate_kv_caches(spec, 5, torch.device("cpu"))
    assert len(caches) == 2 and isinstance(caches[0], FP8KVCache)
    assert caches[0].data.shape == (2, 5, 3, 16, 64) and caches[0].data.dtype == torch.float8_e4m3fn
    assert caches[0].scales.shape == (2, 5, 3, 16) and caches[0].scales.dtype == torch.float32


def test_options_are_validated_by_name() -> None:
    with pytest.raises(ValueError, match="quantization"):
        build_engine_config(quantization="int3")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        build_engine_config(kv_cache_dtype="int8")
    config = build_engine_config(quantization="int4", kv_cache_dtype="fp8")
    assert config.model.quantization == "int4" and config.cache.kv_cache_dtype == "fp8"
