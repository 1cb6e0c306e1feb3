"""The one-call decoder stack (engine/model/fused_decoder.py, kernels/cpu/decoder_layers.cpp)
against the layer-by-layer loop it replaces: the same logits and KV caches bit for bit, across
prefill, decode and verification-shaped steps of several requests, for each family switch it
covers (biases, sliding windows, scaled RoPE, bf16-held draft weights); the loop wherever it
does not apply; the kernels' errors as ValueError."""

from __future__ import annotations

import pytest
import torch

from engine.model.attention_metadata import AttentionMetadata
from engine.model.fused_decoder import FusedDecoder
from engine.model.llama import LlamaForCausalLM
from engine.model.quantization import prepare_draft_layers, prepare_for_inference
from kernels import FP8KVCache, small_rows_linear
from kernels.cpu import cpu_kernels
from model_harness import PagedDriver, random_prompts, tiny_model

pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(cpu_kernels() is None, reason="needs the compiled CPU kernels")


@pytest.fixture(autouse=True)
def few_row_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The few-row kernel in use whatever this CPU is (the engine takes it on AVX2 CPUs only;
    the kernel itself runs on any): linears keep the plain weight the stack reads."""
    monkeypatch.setattr(small_rows_linear, "skinny_enabled", lambda: True)


def _prepared(family: str, *, held: str | None = None) -> LlamaForCausalLM:
    model = tiny_model(family)
    if held is not None:
        assert prepare_draft_layers(model, torch.device("cpu"), held=held)
    else:
        assert prepare_for_inference(model, None, torch.device("cpu")) == "fp32-prepacked"
    return model


def _run(model: LlamaForCausalLM, fused: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Logits of every step of a fixed schedule and the caches after it, with the compiled path
    on or forced off: prefill of three requests (one over SKINNY_MAX_ROWS, which takes the loop
    either way), decode steps, then steps verifying 3-5 tokens per request."""
    built = model._fused_decoder()
    model.__dict__["_fused"] = built if fused else None
    try:
        driver = PagedDriver(model, model.arch, num_blocks=96)
        vocab = model.arch.vocab_size
        prompts = random_prompts([9, 3, small_rows_linear.SKINNY_MAX_ROWS + 5], vocab, seed=3)
        logits = []
        out = driver.step({i: p for i, p in enumerate(prompts)})
        logits += [out[i] for i in range(3)]
        for _ in range(4):
            out = driver.step({i: [int(out[i][-1].argmax())] for i in range(3)})
            logits += [out[i] for i in range(3)]
        for width in (3, 5, 4):
            out = driver.step({i: random_prompts([width + i % 2], vocab, seed=10 * width + i)[0] for i in range(3)})
            logits += [out[i] for i in range(3)]
        return logits, driver.kv_caches
    finally:
        model.__dict__["_fused"] = built


@pytest.mark.parametrize("family", ["llama_tied", "qwen2_bias", "qwen2_sliding", "mistral_window",
                                    "llama_rope_yarn"])
def test_the_stack_in_one_call_equals_the_layer_loop_bit_for_bit(family: str) -> None:
    model = _prepared(family)
    assert isinstance(model._fused_decoder(), FusedDecoder)
    fused_logits, fused_caches = _run(model, fused=True)
    loop_logits, loop_caches = _run(model, fused=False)
    for ours, theirs in zip(fused_logits, loop_logits):
        assert torch.equal(ours, theirs)
    for ours, theirs in zip(fused_caches, loop_caches):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("held", ["bf16", "int8"])
def test_held_draft_weights_take_the_stack_too(held: str) -> None:
    model = _prepared("llama_tied", held=held)
    assert isinstance(model._fused_decoder(), FusedDecoder)
    fused_logits, fused_caches = _run(model, fused=True)
    loop_logits, loop_caches = _run(model, fused=False)
    assert all(torch.equal(a, b) for a, b in zip(fused_logits, loop_logits))
    assert all(torch.equal(a, b) for a, b in zip(fused_caches, loop_caches))


def test_on_wider_cpus_only_held_draft_weights_take_the_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where float32 products keep oneDNN (AVX512 CPUs: skinny_enabled off) a draft's layers over
    held bf16 or int8 weights still take the stack, bit for bit as their loop; a float32 model's
    prepacked layers do not."""
    monkeypatch.setattr(small_rows_linear, "skinny_enabled", lambda: False)
    monkeypatch.setattr(small_rows_linear, "held_weights_enabled", lambda: True)
    prepacked = tiny_model("llama_tied")
    prepare_for_inference(prepacked, None, torch.device("cpu"))
    assert prepacked._fused_decoder() is None
    held = _prepared("llama_tied", held="int8")
    assert isinstance(held._fused_decoder(), FusedDecoder)
    fused_logits, fused_caches = _run(held, fused=True)
    loop_logits, loop_caches = _run(held, fused=False)
    assert all(torch.equal(a, b) for a, b in zip(fused_logits, loop_logits))
    assert all(torch.equal(a, b) for a, b in zip(fused_caches, loop_caches))
    monkeypatch.setattr(small_rows_linear, "held_weights_enabled", lambda: False)
    held.forget_fused_decoder()
    assert held._fused_decoder() is None  # (no kernel for them: the loop)


def test_the_stack_is_used_for_few_rows_and_the_loop_for_more(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _prepared("qwen2_bias")
    fused = model._fused_decoder()
    assert fused is not None
    calls = []
    original = fused.kernels.decoder_layers
    monkeypatch.setattr(fused.kernels, "decoder_layers",
                        lambda *a, **k: calls.append(a[2].shape[0]) or original(*a, **k))
    driver = PagedDriver(model, model.arch, num_blocks=96)
    driver.step({0: random_prompts([small_rows_linear.SKINNY_MAX_ROWS + 1], 300)[0]})
    assert calls == []
    driver.step({0: [5], 1: random_prompts([small_rows_linear.SKINNY_MAX_ROWS], 300)[0]})
    assert calls == []  # one row more than the few-row kernel takes: the loop
    driver.step({0: [5], 1: [6]})
    assert calls == [2]


def test_it_does_not_apply_to_what_it_does_not_cover() -> None:
    training_form = tiny_model("llama_tied")
    assert FusedDecoder.build(training_form.layers, training_form.norm) is None
    assert _prepared("qwen3_qk_norm")._fused_decoder() is None  # per-head q/k norms
    int8 = tiny_model("llama_tied")
    prepare_for_inference(int8, "int8", torch.device("cpu"))
    assert int8._fused_decoder() is None  # quantized linears


def test_weights_of_unexpected_shapes_take_the_loop() -> None:
    model = _prepared("qwen2_bias")
    # A layer whose o_proj is not [hidden, heads x head_dim] (the C side would trust the sizes).
    o_proj = model.layers[1].self_attn.o_proj
    if o_proj.panels is not None:  # held in panels, [N / 16, K, 16]
        o_proj.panels = o_proj.panels[:, :-2].contiguous()
    else:
        o_proj.plain_weight = o_proj.plain_weight[:, :-2].contiguous()
    assert FusedDecoder.build(model.layers, model.norm) is None


def test_the_compiled_path_is_rebuilt_after_the_linears_change() -> None:
    model = tiny_model("llama_tied")
    driver = PagedDriver(model, model.arch)
    driver.step({0: [1, 2, 3]})  # a step in the training form: no compiled path
    assert model._fused_decoder() is None
    prepare_for_inference(model, None, torch.device("cpu"))
    assert isinstance(model._fused_decoder(), FusedDecoder)


def test_fp8_caches_take_the_loop() -> None:
    model = _prepared("llama_tied")
    fused = model._fused_decoder()
    assert fused is not None
    caches = [FP8KVCache(torch.zeros(2, 8, 2, 4, 16, dtype=torch.float8_e4m3fn), torch.ones(2, 8, 2, 4))
              for _ in model.layers]
    meta = AttentionMetadata.build(query_lens=[1], seq_lens=[1], block_ids=[[0]], block_size=4, device="cpu")
    hidden = torch.randn(1, model.arch.hidden_size)
    assert fused.run(hidden, model.rotary.cos_sin_table, torch.tensor([0]), caches, meta) is None


def test_a_kernel_error_is_a_value_error_naming_the_layer() -> None:
    model = _prepared("llama_tied")
    fused = model._fused_decoder()
    assert fused is not None
    shape = (2, 4, model.arch.num_key_value_heads, 4, model.arch.head_dim)
    caches = [torch.zeros(shape) for _ in model.layers]
    # Block 9 of a 4-block cache: the KV store refuses the slot before anything is written.
    meta = AttentionMetadata.build(query_lens=[1], seq_lens=[1], block_ids=[[9]], block_size=4, device="cpu")
    with pytest.raises(ValueError, match="decoder_layers: layer 0"):
        fused.run(torch.randn(1, model.arch.hidden_size), model.rotary.cos_sin_table, torch.tensor([0]), caches, meta)
    assert all(not c.any() for c in caches)
