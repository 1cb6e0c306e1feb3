"""End-to-end tests of the offline API on the embedded SmolLM2-135M-Instruct model."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.worker.huge_pages import collapse_supported, collapsible_bytes, module_tensors

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "List three colors:",
    "The capital of France is a city where",  # shares a prefix with the first
    "1, 2, 3, 4,",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def reference_outputs() -> list[list[int]]:
    """One request at a time, no prefix caching: the plainest possible schedule."""
    llm = LLM(max_num_seqs=1, enable_prefix_caching=False, kv_cache_memory="256MiB", dtype="float32")
    return [llm.generate([p], GREEDY, use_tqdm=False)[0].token_ids for p in PROMPTS]


@pytest.fixture(scope="module")
def llm() -> LLM:
    # fp32: exact equivalence across schedules needs batch-independent rounding.
    return LLM(kv_cache_memory="256MiB", dtype="float32")


def test_auto_dtype_answers() -> None:
    # auto: bfloat16 on CPUs with native bf16 (AMX or AVX512-BF16), float32 elsewhere; either way
    # the model must answer.
    llm = LLM(kv_cache_memory="64MiB")
    out = llm.generate(["The capital of France is"] * 5, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert all(o.text.startswith(" Paris") for o in out), [o.text for o in out]


def test_paris(llm: LLM) -> None:
    out = llm.generate("The capital of France is", SamplingParams(temperature=0.0, max_tokens=4))[0]
    assert out.text.startswith(" Paris"), out.text
    assert out.finish_reason == "length"
    assert len(out.token_ids) == 4


def test_chat_answers(llm: LLM) -> None:
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0.0, max_tokens=24))[0]
    assert "Paris" in out.text
    # The chat template's end of turn (<|im_end|>) is an EOS id: a short answer stops by itself.
    out = llm.chat([{"role": "user", "content": "Say hello."}], SamplingParams(temperature=0.0, max_tokens=64))[0]
    assert out.finish_reason == "stop"


def test_batched_equals_reference(llm: LLM, reference_outputs: list[list[int]]) -> None:
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outs] == reference_outputs


def test_chunked_prefill_equals_reference(reference_outputs: list[list[int]]) -> None:
    llm = LLM(max_num_batched_tokens=8, kv_cache_memory="256MiB", enable_prefix_caching=False, dtype="float32")
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outs] == reference_outputs


def test_preemption_equals_reference(reference_outputs: list[list[int]]) -> None:
    # 6 blocks of 4 tokens: too few for all prompts at once, so requests preempt each other.
    llm = LLM(block_size=4, num_blocks=12, max_num_batched_tokens=64, dtype="float32")
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert llm.stats().num_preemptions > 0
    assert [o.token_ids for o in outs] == reference_outputs
    stats = llm.stats()
    assert stats.kv_cache_usage == 0.0 and stats.num_running == 0 and stats.num_waiting == 0


def test_prefix_cached_equals_reference(llm: LLM, reference_outputs: list[list[int]]) -> None:
    llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    before = llm.stats().prefix_cache_hits
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert llm.stats().prefix_cache_hits > before
    assert all(o.num_cached_tokens > 0 for o in outs if len(o.prompt_token_ids) > 16)
    assert [o.token_ids for o in outs] == reference_outputs


def test_n_shares_prompt_blocks(llm: LLM) -> None:
    llm.reset_prefix_cache()
    # Long enough for several full blocks (a full-prompt hit still recomputes the last block).
    prompt = ("Write a long story about a dragon who loved to read books in the great library of the "
              "old city, and about the librarian who became her friend over many years:")
    out = llm.generate(prompt, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8), use_tqdm=False)[0]
    assert len(out.outputs) == 3
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # distinct samples
    assert out.num_cached_tokens > 0  # later children hit the first one's prompt blocks
    again = llm.generate(prompt, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8), use_tqdm=False)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]  # seeded


def test_seeded_sampling_independent_of_batch(llm: LLM) -> None:
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=1234, max_tokens=10)
    alone = llm.generate("Tell me a joke:", params, use_tqdm=False)[0].token_ids
    mixed = llm.generate(
        ["Hello there", "Tell me a joke:", "Another prompt"],
        [SamplingParams(temperature=1.0, max_tokens=10), params, SamplingParams(temperature=0.5, max_tokens=7)],
        use_tqdm=False,
    )[1].token_ids
    assert alone == mixed


def test_stop_strings_and_token_ids(llm: LLM) -> None:
    base = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)[0]
    assert " 6" in base.text
    out = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0.0, max_tokens=12, stop=[" 6"]), use_tqdm=False)[0]
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason == " 6"
    assert out.text == base.text[: base.text.index(" 6")]
    out = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0.0, max_tokens=12, stop=[" 6"],
                                                      include_stop_str_in_output=True), use_tqdm=False)[0]
    assert out.text == base.text[: base.text.index(" 6") + 2]
    stop_id = base.token_ids[2]
    out = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_id]),
                       use_tqdm=False)[0]
    assert out.token_ids == base.token_ids[:3] and out.outputs[0].stop_reason == stop_id


def test_logprobs(llm: LLM) -> None:
    out = llm.generate("The capital of France is", SamplingParams(temperature=0.0, max_tokens=3, logprobs=5),
                       use_tqdm=False)[0]
    logprobs = out.outputs[0].logprobs
    assert logprobs is not None and len(logprobs) == 3
    for token_id, entry in zip(out.token_ids, logprobs):
        assert entry.token_id == token_id
        assert len(entry.top) == 5
        assert entry.top[0][0] == token_id  # greedy picks the most likely token
        assert entry.logprob == pytest.approx(entry.top[0][1])


def test_too_long_prompt_is_refused(llm: LLM) -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([[100] * (llm.max_model_len + 5)], GREEDY, use_tqdm=False)
    assert llm.stats().num_waiting == 0 and llm.stats().num_running == 0


def test_bad_sampling_params_name_the_field() -> None:
    for kwargs, name in [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens"),
                         ({"top_k": -5}, "top_k"), ({"n": 0}, "n"), ({"logprobs": 99}, "logprobs")]:
        with pytest.raises(ValueError, match=name):
            SamplingParams(**kwargs)


def test_bad_token_ids_are_refused(llm: LLM) -> None:
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate([[10**7]], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate("hi", SamplingParams(logit_bias={10**7: 1.0}), use_tqdm=False)
    assert llm.stats().kv_cache_usage == 0.0


def test_pages_change_no_token(llm: LLM, reference_outputs: list[list[int]]) -> None:
    """Weights and KV in 2 MiB pages (the default) or as the allocator left them: the same tokens."""
    plain = LLM(kv_cache_memory="256MiB", dtype="float32", huge_pages=False)
    assert plain.engine.runner.huge_page_weight_bytes == 0
    assert [o.token_ids for o in plain.generate(PROMPTS, GREEDY, use_tqdm=False)] == reference_outputs
    if collapse_supported():
        # Nearly all of the weights' storages (MADV_COLLAPSE, Linux 6.1+), at least the 540 MB of
        # float32 weights: in panels on an AVX2 CPU, packed by oneDNN on an AVX512 one (623 MiB on
        # an AMX Xeon: the packed linears 405, the embedding 108 and the lm_head packed apart 108).
        collapsible = collapsible_bytes(module_tensors(llm.engine.runner.model))
        assert collapsible >= 500 * 2**20
        assert llm.engine.runner.huge_page_weight_bytes > 0.9 * collapsible
