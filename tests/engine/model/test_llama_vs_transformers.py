"""Our llama-family model, loaded by our loader from save_pretrained() checkpoints, against
Hugging Face transformers on the same random weights: logits (fp32, tight) over ragged batched
prefill, chunked prefill over a cached prefix, and greedy continuations through the paged cache."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from engine.model.loader import load_model
from engine.model.loader.hf_loader import load_hf_model
from engine.model.resolve import ResolvedModel
from model_harness import FAMILIES, PagedDriver, hf_greedy, hf_logits, random_hf_model, random_prompts, tiny_hf_config

pytest.importorskip("transformers")

ATOL = 1e-4
SHARDED = {"llama_tied", "qwen2_bias", "mistral_window"}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_models(request, tmp_path_factory):
    family = request.param
    hf_model = random_hf_model(tiny_hf_config(family), seed=len(family))
    folder = tmp_path_factory.mktemp(family)
    if family in SHARDED:
        hf_model.save_pretrained(folder, max_shard_size="40KB")
        assert (folder / "model.safetensors.index.json").is_file()
    else:
        hf_model.save_pretrained(folder)
        assert (folder / "model.safetensors").is_file()
    model, arch = load_model(ResolvedModel(str(folder), "hf", family), torch.float32, torch.device("cpu"),
                             progress=False)
    return family, hf_model, model, arch


def test_ragged_prefill_logits_match(family_models) -> None:
    family, hf_model, model, arch = family_models
    prompts = random_prompts([7, 12, 3, 8], arch.vocab_size, seed=1)  # off and on block boundaries
    logits = PagedDriver(model, arch, block_size=4).step(dict(enumerate(prompts)))
    for i, prompt in enumerate(prompts):
        expected = hf_logits(hf_model, prompt)
        assert logits[i].dtype == torch.float32
        torch.testing.assert_close(logits[i], expected, atol=ATOL, rtol=0, msg=f"{family} prompt {i}")


def test_chunked_prefill_over_cached_prefix_matches(family_models) -> None:
    family, hf_model, model, arch = family_models
    long_prompt, other = random_prompts([13, 6], arch.vocab_size, seed=2)
    driver = PagedDriver(model, arch, block_size=4, seed=3)
    first = driver.step({0: long_prompt[:5]})
    # The second chunk attends to the first chunk's cached keys, batched with another prefill.
    second = driver.step({1: other, 0: long_prompt[5:]})
    expected = hf_logits(hf_model, long_prompt)
    torch.testing.assert_close(first[0], expected[:5], atol=ATOL, rtol=0)
    torch.testing.assert_close(second[0], expected[5:], atol=ATOL, rtol=0, msg=family)
    torch.testing.assert_close(second[1], hf_logits(hf_model, other), atol=ATOL, rtol=0)


def test_greedy_continuations_match_generate(family_models) -> None:
    family, hf_model, model, arch = family_models
    prompts = random_prompts([6, 9, 2], arch.vocab_size, seed=4)
    ours = PagedDriver(model, arch, block_size=4, seed=5).greedy(prompts, num_new_tokens=16)
    for prompt, continuation in zip(prompts, ours):
        assert continuation == hf_greedy(hf_model, prompt, 16), family
    # Continuations that only repeat one token would make this test weak.
    assert max(len(set(c)) for c in ours) > 3


def test_window_and_scaling_are_not_no_ops(tmp_path) -> None:
    """The families above differ from plain Llama in ways the test must be able to see: running
    mistral's checkpoint without its window (or yarn's without its scaling) changes logits."""
    for family, change in (("mistral_window", dict(sliding_window=None)),
                           ("llama_rope_yarn", dict(rope_scaling=None))):
        hf_model = random_hf_model(tiny_hf_config(family), seed=1)
        folder = tmp_path / family
        hf_model.save_pretrained(folder)
        model, arch = load_hf_model(str(folder), torch.float32, torch.device("cpu"), progress=False)
        prompt = random_prompts([12], arch.vocab_size, seed=6)[0]
        expected = hf_logits(hf_model, prompt)
        good = PagedDriver(model, arch).step({0: prompt})[0]
        torch.testing.assert_close(good, expected, atol=ATOL, rtol=0)
        altered = type(model)(replace(arch, **change))
        altered.load_state_dict(model.state_dict())
        bad = PagedDriver(altered, altered.arch).step({0: prompt})[0]
        assert (bad - expected).abs().max() > 1e-2, family


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_load(tmp_path, dtype) -> None:
    hf_model = random_hf_model(tiny_hf_config("qwen2_bias"), seed=3)
    hf_model.save_pretrained(tmp_path)
    model, arch = load_model(ResolvedModel(str(tmp_path), "hf", "tiny"), dtype, torch.device("cpu"), progress=False)
    assert {p.dtype for p in model.parameters()} == {dtype}
    prompt = random_prompts([10], arch.vocab_size, seed=7)[0]
    logits = PagedDriver(model, arch).step({0: prompt})[0]
    expected = hf_logits(hf_model, prompt)
    assert logits.dtype == torch.float32
    # Rounding to 8 (bf16) or 11 (fp16) mantissa bits: close, not exact.
    scale = expected.abs().max().item()
    assert (logits - expected).abs().max().item() < 0.05 * scale
    assert (logits.argmax(-1) == expected.argmax(-1)).float().mean() > 0.8


def test_checkpoint_without_lm_head_is_tied_even_if_config_says_not(tmp_path) -> None:
    hf_model = random_hf_model(tiny_hf_config("llama_tied"), seed=2)
    hf_model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in tensors
    model, arch = load_model(ResolvedModel(str(tmp_path), "hf", "tiny"), torch.float32, "cpu", progress=False)
    assert arch.tie_word_embeddings
    assert model.lm_head.weight is model.embed_tokens.weight
    prompt = random_prompts([5], arch.vocab_size, seed=8)[0]
    torch.testing.assert_close(PagedDriver(model, arch).step({0: prompt})[0], hf_logits(hf_model, prompt),
                               atol=ATOL, rtol=0)


def test_store_kv_writes_what_forward_writes(family_models) -> None:
    # The EAGLE head's upkeep passes write KV only (engine/spec_decode/eagle.py).
    _, _, model, arch = family_models
    from engine.model.attention_metadata import AttentionMetadata

    torch.manual_seed(0)
    layer = model.layers[0]
    num_tokens, block_size = 6, 4
    hidden = torch.randn(num_tokens, arch.hidden_size)  # [num_tokens, hidden]
    positions = torch.arange(3, 3 + num_tokens)  # a chunk after 3 cached positions
    cos, sin = model.rotary.cos_sin(positions, hidden.dtype)
    meta = AttentionMetadata.build(query_lens=[num_tokens], seq_lens=[3 + num_tokens], block_ids=[[2, 0, 1]],
                                   block_size=block_size, device="cpu")
    shape = (2, 3, arch.num_key_value_heads, block_size, arch.head_dim)
    by_forward, by_store = torch.zeros(shape), torch.zeros(shape)
    with torch.inference_mode():
        layer(hidden, None, cos, sin, by_forward, meta)
        layer.store_kv(hidden, cos, sin, by_store, meta)
    assert by_forward.abs().sum() > 0
    torch.testing.assert_close(by_store, by_forward, atol=1e-6, rtol=1e-6)
    # With a k/v projection of its own (add_kv_projection: an EAGLE head's, which skips q).
    layer.self_attn.add_kv_projection()
    try:
        by_kv_proj = torch.zeros(shape)
        with torch.inference_mode():
            layer.store_kv(hidden, cos, sin, by_kv_proj, meta)
    finally:
        layer.self_attn.kv_proj = None
    torch.testing.assert_close(by_kv_proj, by_forward, atol=1e-6, rtol=1e-6)
