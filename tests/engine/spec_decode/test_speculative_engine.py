"""Speculation changes speed, never results: greedy outputs with every speculative mode are
token-identical to plain decoding, across batching, chunked prefill, prefix hits and preemption
(float32 on CPU). A draft identical to the target has its drafts accepted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import SpeculativeConfig
from engine.model.resolve import SHIPPED_DRAFT_DIR, embedded_gguf_path
from engine.protocol import AddRequest
from engine.spec_decode.corpus import SuffixCorpus
from engine.spec_decode.draft_model import position_slots
from engine.worker import model_runner
from engine.worker.model_runner import auto_dtype, resolve_draft_dtype

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "1, 2, 3, 4, 5, 6, 7,",
    "The capital of France is",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "',
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
# Small pools and budgets: chunked prefill (budget 16) and preemption (few blocks) happen.
SCHEDULES = {
    "batched": dict(kv_cache_memory="64MiB"),
    "chunked": dict(kv_cache_memory="64MiB", max_num_batched_tokens=16),
    "preempted": dict(block_size=4, num_blocks=40, max_num_batched_tokens=64),
}


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    llm = LLM(dtype="float32", kv_cache_memory="64MiB", max_num_seqs=1, enable_prefix_caching=False)
    return [llm.generate([p], GREEDY, use_tqdm=False)[0].token_ids for p in PROMPTS]


# Hybrid runs both proposers, so it gets every schedule; the single proposers one each.
# "eagle": the draft method with an EAGLE head (engine/spec_decode/eagle.py) as its draft.
# The draft's dtype is pinned where it can be (its "auto" depends on the CPU): float32
# throughout, a bf16 draft under the float32 target for both kinds, and "auto" for both kinds
# (float32 over int8-held weights where the compiled kernel takes held weights, the default
# there; elsewhere the float32 target's own dtype or bf16).
CASES = [("hybrid", "batched", "float32"), ("hybrid", "chunked", "float32"), ("hybrid", "preempted", "float32"),
         ("suffix", "preempted", "float32"), ("draft", "chunked", "float32"), ("eagle", "batched", "float32"),
         ("eagle", "chunked", "float32"), ("eagle", "preempted", "float32"), ("draft", "preempted", "bfloat16"),
         ("eagle", "chunked", "bfloat16"), ("draft", "batched", "auto"), ("eagle", "preempted", "auto")]


@pytest.mark.parametrize(("method", "schedule", "draft_dtype"), CASES)
def test_greedy_identical_to_plain_decoding(method: str, schedule: str, draft_dtype: str, reference: list[list[int]],
                                           small_draft: str, eagle_head: str) -> None:
    draft = {"suffix": None, "eagle": eagle_head}.get(method, small_draft)
    method = "draft" if method == "eagle" else method
    llm = LLM(dtype="float32", speculative=method, draft=draft, num_speculative_tokens=4, draft_dtype=draft_dtype,
              **SCHEDULES[schedule])
    if draft is not None and draft_dtype != "auto":
        assert llm.engine.runner.draft_dtype == getattr(torch, draft_dtype)
    elif draft is not None:
        runner = llm.engine.runner
        assert runner.draft_dtype == resolve_draft_dtype(SpeculativeConfig(method="draft"), torch.float32, runner.device)
        if model_runner.held_weights_enabled():
            assert runner.draft_dtype == torch.float32 and runner.draft_held_weights == "int8"
    first = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in first] == reference
    # Again: now with prefix-cache hits (and, for suffix, last run's outputs in its index).
    second = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in second] == reference
    stats = llm.stats()
    assert stats.spec_num_draft_tokens > 0
    assert stats.prefix_cache_hits > 0
    if schedule == "preempted":
        assert stats.num_preemptions > 0
    assert stats.kv_cache_usage == 0.0 and stats.num_running == 0


def test_draft_dtype_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    """auto: float32 (over int8-held weights) where the compiled few-row kernel takes held weights,
    whatever the target's dtype; elsewhere the target's dtype, but under a float32 target whatever
    dtype="auto" takes on this machine (bf16 on CPUs with native bf16); an explicit dtype is taken
    as asked."""
    cpu = torch.device("cpu")
    machine = auto_dtype(cpu)
    for held in (True, False):
        monkeypatch.setattr(model_runner, "held_weights_enabled", lambda held=held: held)
        expected = {torch.float32: torch.float32 if held else machine,
                    torch.bfloat16: torch.float32 if held else torch.bfloat16}
        for target, draft in expected.items():
            assert resolve_draft_dtype(SpeculativeConfig(method="draft"), target, cpu) == draft
    assert resolve_draft_dtype(SpeculativeConfig(method="draft", draft_dtype="float32"), torch.bfloat16,
                               cpu) == torch.float32
    with pytest.raises(ValueError, match="draft_dtype"):
        SpeculativeConfig(method="draft", draft_dtype="int8")


def test_identical_draft_is_accepted() -> None:
    llm = LLM(dtype="float32", speculative="draft", draft=embedded_gguf_path(), num_speculative_tokens=4,
              adaptive_speculation=False, kv_cache_memory="64MiB", draft_dtype="float32")
    llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True), use_tqdm=False)
    stats = llm.stats()
    assert stats.spec_num_draft_tokens > 50
    assert stats.spec_num_accepted_tokens / stats.spec_num_draft_tokens >= 0.98


def test_a_follow_up_hits_every_block_the_last_steps_accepted_drafts_filled() -> None:
    # An agent's next turn extends the prompt with the output. Every computed position of it is
    # cached, also those whose drafts were accepted in the request's last step (no allocation
    # came after it to register their blocks: kv_cache_manager.free does). With an identical
    # draft every step accepts all its drafts; the lengths tried end a few positions past a block
    # boundary, so it often falls among the last step's drafts (without free's registration, 16
    # tokens were cached of 32 at the first).
    llm = LLM(dtype="float32", speculative="draft", draft=embedded_gguf_path(), num_speculative_tokens=4,
              adaptive_speculation=False, kv_cache_memory="64MiB", draft_dtype="float32")
    block_size = llm.config.cache.block_size
    prompt = llm.tokenizer.encode(PROMPTS[1])
    lengths = [n for n in range(2, 2 * block_size) if (len(prompt) + n - 1) % block_size < 4]
    for max_tokens in lengths:
        llm.reset_prefix_cache()
        [first] = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                               use_tqdm=False)
        assert len(first.token_ids) == max_tokens
        follow_up = prompt + first.token_ids + [13, 13]
        [second] = llm.generate([follow_up], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
        # The last output token's KV was never computed: every full block before it is cached.
        computed = len(prompt) + max_tokens - 1
        assert second.num_cached_tokens == computed // block_size * block_size, max_tokens
    stats = llm.stats()
    assert stats.spec_num_accepted_tokens / stats.spec_num_draft_tokens >= 0.98


def test_sampled_requests_run_with_drafts() -> None:
    # Sampling is lossless in distribution (tests/engine/sample/test_rejection_sampler.py), not
    # draw for draw: which drafts a request gets changes which random numbers it uses. So here:
    # requests finish with the asked length, and a fresh engine repeats a fresh engine's run (the
    # engine's own seed; a request with a seed of its own repeats plain decoding exactly, below).
    # Adaptive speculation prices drafts by measured step times, so how many a request gets
    # depends on the machine's load: fixed-length drafting keeps the two runs comparable.
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=20, ignore_eos=True)
    runs = []
    for _ in range(2):
        llm = LLM(dtype="float32", speculative="suffix", kv_cache_memory="64MiB", adaptive_speculation=False)
        runs.append([o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)])
        assert llm.stats().spec_num_accepted_tokens > 0
    assert all(len(tokens) == 20 for tokens in runs[0])
    assert runs[0] == runs[1]


def test_reset_speculation_restores_a_fresh_engines_drafting() -> None:
    """After reset_speculation (and reset_prefix_cache) the engine drafts exactly as a fresh one:
    the previous runs' outputs are no longer in the suffix index. (Not adaptive: adaptive drafting
    depends on measured step times.)"""
    llm = LLM(dtype="float32", speculative="suffix", num_speculative_tokens=4, adaptive_speculation=False,
              kv_cache_memory="64MiB")

    def drafted_and_accepted() -> tuple[int, int]:
        before = llm.stats()
        llm.generate([PROMPTS[2]], GREEDY, use_tqdm=False)
        after = llm.stats()
        return (after.spec_num_draft_tokens - before.spec_num_draft_tokens,
                after.spec_num_accepted_tokens - before.spec_num_accepted_tokens)

    fresh = drafted_and_accepted()
    llm.reset_prefix_cache()
    repeated = drafted_and_accepted()  # its own earlier answer is in the index: drafted with confidence
    assert repeated[1] > fresh[1]
    llm.reset_prefix_cache()
    llm.reset_speculation()
    assert drafted_and_accepted() == fresh


def test_one_engine_runs_every_method_in_turn_as_a_fresh_engine_would(reference: list[list[int]],
                                                                      eagle_head: str) -> None:
    """set_speculative_method: an engine built with hybrid switches between requests to each
    method, with the same greedy output, and drafts what a fresh engine built with it drafts
    (not adaptive: adaptive drafting depends on measured step times): exactly for suffix, whose
    index no longer holds the earlier runs' outputs; for the untrained head, whose logits are
    near ties, within rounding (its drafts move by a few tokens with where a request's blocks
    lie, as on one engine's successive runs). An engine built without a draft model refuses the
    methods that need one; a busy engine refuses to switch."""
    options = dict(dtype="float32", draft=eagle_head, num_speculative_tokens=4, draft_dtype="float32",
                   adaptive_speculation=False, kv_cache_memory="64MiB")

    def drafted_and_accepted(llm: LLM) -> tuple[int, int]:
        before = llm.stats()
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == reference
        after = llm.stats()
        return (after.spec_num_draft_tokens - before.spec_num_draft_tokens,
                after.spec_num_accepted_tokens - before.spec_num_accepted_tokens)

    switching = LLM(speculative="hybrid", **options)
    drafted_and_accepted(switching)  # its prefix cache and suffix index now hold these prompts' runs
    for method in ("none", "draft", "suffix", "hybrid", "draft"):
        built = options if method in ("draft", "hybrid") else {**options, "draft": None}
        fresh = drafted_and_accepted(LLM(speculative=method, **built))
        head = switching.engine.runner.spec.draft if switching.engine.runner.spec is not None else None
        switching.set_speculative_method(method)
        spec = switching.engine.runner.spec
        assert (spec is None) == (method == "none")
        if method in ("draft", "hybrid"):
            assert spec.draft is not head and (spec.draft._kv_tokens < 0).all()  # fresh: its KV starts over
        switched = drafted_and_accepted(switching)
        if method == "suffix":
            assert switched == fresh
        else:
            assert abs(switched[0] - fresh[0]) <= 0.02 * fresh[0]
        assert (fresh[0] > 0) == (method != "none")
        assert switching.engine.scheduler.num_lookahead_tokens == (4 if method in ("draft", "hybrid") else 0)
    plain = LLM(dtype="float32", kv_cache_memory="64MiB")
    with pytest.raises(ValueError, match="needs a draft model"):
        plain.set_speculative_method("hybrid")
    plain.set_speculative_method("suffix")
    assert drafted_and_accepted(plain)[0] > 0
    with pytest.raises(ValueError, match="speculative"):
        plain.set_speculative_method("medusa")
    switching.engine.add_request(AddRequest(request_id="busy", prompt_token_ids=[1, 2, 3], sampling_params=GREEDY,
                                            arrival_time=0.0))
    with pytest.raises(RuntimeError, match="idle engine"):
        switching.set_speculative_method("none")


def test_seeded_sampled_requests_decode_as_without_speculation() -> None:
    """The same seed gives the same text with and without speculation, alone or in a batch: a
    seeded row samples with the noise of its seed and output position, and verification samples
    every row as plain decoding would (accepting a draft when the sample equals it). The seeded
    requests do get drafts, and accept some."""
    prompts = [PROMPTS[1], PROMPTS[2], PROMPTS[0]]
    params = [SamplingParams(temperature=0.7, seed=11, max_tokens=24), SamplingParams(temperature=1.0, seed=5,
              top_p=0.9, max_tokens=24, ignore_eos=True), SamplingParams(temperature=0.0, max_tokens=24)]
    plain = LLM(dtype="float32", kv_cache_memory="64MiB")
    expected = [plain.generate([p], sp, use_tqdm=False)[0].token_ids for p, sp in zip(prompts, params)]
    llm = LLM(dtype="float32", speculative="suffix", num_speculative_tokens=4, adaptive_speculation=False,
              kv_cache_memory="64MiB")
    assert llm.generate([prompts[0]], params[0], use_tqdm=False)[0].token_ids == expected[0]
    before = llm.stats()
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == expected
    after = llm.stats()
    assert after.spec_num_accepted_tokens > before.spec_num_accepted_tokens
    # The test can fail: another seed writes something else.
    other = llm.generate([prompts[1]], params[1].clone(seed=6), use_tqdm=False)[0].token_ids
    assert other != expected[1]


@pytest.mark.parametrize("schedule", ["batched", "chunked", "preempted"])
def test_runners_up_keep_greedy_output_identical(schedule: str, reference: list[list[int]]) -> None:
    """The shipped EAGLE head names runners-up for its first draft; the target takes some of
    them (each with a bonus token sampled from the runner-up's own row, its KV moved into the
    request's slot): the outputs stay plain decoding's, also on prefix hits of those blocks."""
    llm = LLM(dtype="float32", speculative="draft", draft=SHIPPED_DRAFT_DIR, num_speculative_tokens=2,
              adaptive_speculation=False, **SCHEDULES[schedule])
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == reference
    stats = llm.stats()
    assert stats.spec_num_accepted_alternatives > 0
    assert stats.kv_cache_usage == 0.0 and stats.num_running == 0


def test_the_head_records_each_verified_position_with_its_own_token() -> None:
    """After every step the EAGLE head holds, at each position of a decoding request that the
    target verified, a state recorded with that position's token, also where the target took a
    runner-up in place of the first draft (the runner hands over the runner-up's state and token
    for that row, not the rejected draft's)."""
    llm = LLM(dtype="float32", speculative="draft", draft=SHIPPED_DRAFT_DIR, num_speculative_tokens=2,
              adaptive_speculation=False, kv_cache_memory="64MiB")
    runner = llm.engine.runner
    head = runner.spec.draft
    checked = []
    execute = runner.execute_model

    def checking(*args, **kwargs):
        out = execute(*args, **kwargs)
        for state in runner.requests.values():
            if not state.output_token_ids:
                continue  # still prefilling
            tokens = state.prompt_token_ids + state.output_token_ids
            slots = position_slots(state.block_ids, runner.block_size, 0, len(tokens) - 1)  # the newest: not fed yet
            assert head._state_tokens[slots].tolist() == tokens[:-1]
            checked.append(len(slots))
        return out

    runner.execute_model = checking
    llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert checked and llm.stats().spec_num_accepted_alternatives > 0


def test_runners_up_keep_seeded_sampling_identical() -> None:
    """A seeded request's runner-up is taken when the sample at its position equals it, and the
    bonus is sampled from its row with the noise of that position: the text is plain decoding's."""
    params = [SamplingParams(temperature=0.7, seed=11, max_tokens=32, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=5, top_p=0.9, top_k=50, max_tokens=32, ignore_eos=True,
                             repetition_penalty=1.1)]
    prompts = [PROMPTS[2], PROMPTS[0]]
    plain = LLM(dtype="float32", kv_cache_memory="64MiB")
    expected = [plain.generate([p], sp, use_tqdm=False)[0].token_ids for p, sp in zip(prompts, params)]
    llm = LLM(dtype="float32", speculative="draft", draft=SHIPPED_DRAFT_DIR, num_speculative_tokens=2,
              adaptive_speculation=False, kv_cache_memory="64MiB")
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == expected
    assert llm.stats().spec_num_accepted_alternatives > 0


@pytest.mark.parametrize("schedule", ["chunked", "preempted"])
def test_a_suffix_corpus_drafts_and_keeps_greedy_output_identical(schedule: str, reference: list[list[int]],
                                                                 tmp_path) -> None:
    """A corpus holding the very answers: suffix drafting follows it from the first request on
    (no recent outputs yet), and the output is still the target's. Not adaptive: every proposal
    is verified, whatever the plan would price it at on this machine."""
    path = str(tmp_path / "corpus.npy")
    np.save(path, SuffixCorpus.from_documents(reference).tokens)
    accepted = {}
    for corpus in ("none", path):
        llm = LLM(dtype="float32", speculative="suffix", suffix_corpus=corpus, adaptive_speculation=False,
                  **SCHEDULES[schedule])
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert [o.token_ids for o in outputs] == reference
        accepted[corpus] = llm.stats().spec_num_accepted_tokens
    assert accepted[path] >= accepted["none"] + 20
