"""The speculative benchmark runs end to end at a tiny size (and checks identical outputs)."""

from __future__ import annotations

import pytest

from engine.benchmarks.speculative import CONTROL, main


def test_speculative_benchmark_dry_run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.llm import LLM

    switches: list[tuple[int, str]] = []  # (engine, method) per round and method
    switch = LLM.set_speculative_method
    monkeypatch.setattr(LLM, "set_speculative_method",
                        lambda self, method: switches.append((id(self), method)) or switch(self, method))
    main(["--methods", "none,suffix", "--max-tokens", "8", "--num-prompts", "2", "--batched-prompts", "3",
          "--streams", "1,2", "--rounds", "1", "--batched-rounds", "2",
          "--dtype", "float32"])
    # Plain methods: the engines take turns, so each method ran on more than one engine (and,
    # in float32, every switched engine's outputs equalled none's: the run checks it).
    engines_by_method: dict[str, set[int]] = {}
    for engine, method in switches:
        engines_by_method.setdefault(method, set()).add(engine)
    assert len(engines_by_method["suffix"]) >= 2 and len({engine for engine, _ in switches}) == 3
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| agent")]
    assert len(rows) == 6  # 2 stream counts x (2 methods and the control)
    assert all(float(row.split("|")[4]) > 0 for row in rows)
    control = [row.split("|") for row in rows if row.split("|")[3].strip() == CONTROL]
    assert len(control) == 2
    for cells in control:  # its outputs are none's, every one
        identical, total = cells[-2].strip().split("/")
        assert identical == total


def test_interleaved_round_matches_generate() -> None:
    """A round interleaves the engines' steps: every method's outputs are its own engine's (the
    same as generate's), its tokens are counted once, and only its own steps are timed."""
    from engine.benchmarks.speculative import _measure_round
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    engines = {method: LLM(dtype="float32", kv_cache_memory="64MiB", speculative=method)
               for method in ("none", "suffix")}
    prompts = [[1, 9690, 198, 2683, 314, 253], [1, 4093, 198, 504, 32, 33, 34, 11], [1, 2, 3, 4, 5]]
    params = SamplingParams(temperature=0.0, max_tokens=12)
    measured = _measure_round(engines, prompts, 2, params, rotation=1)
    expected = [o.token_ids for o in engines["none"].generate(prompts, params, use_tqdm=False)]
    for method, (sample, outputs) in measured.items():
        assert outputs == expected, method
        assert sample["tokens"] == sum(len(t) for t in expected)
        assert sample["seconds"] > 0
        assert not engines[method].engine.has_unfinished_requests()


def test_a_round_keeps_each_stream_busy() -> None:
    """Streams are a fixed concurrency: stream s sends prompts s, s + streams, ..., each as soon as
    its previous one finished, so the engine holds min(streams, prompts left) requests until the
    prompts run out, and never more."""
    from engine.benchmarks.speculative import _measure_round
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    llm = LLM(dtype="float32", kv_cache_memory="64MiB")
    engine = llm.engine
    prompts = [[1, 9690, 198, 2683, 314, 253], [1, 4093, 198, 504, 32], [1, 2, 3, 4, 5], [1, 7, 8],
               [1, 30, 31, 32]]
    # Different lengths, so the streams' requests end on different steps.
    lengths = [3, 9, 4, 6, 2]
    in_flight: list[int] = []
    submitted: list[list[int]] = []
    add, step = engine.add_request, engine.step

    def add_request(request):
        submitted.append(request.prompt_token_ids)
        length = lengths[prompts.index(request.prompt_token_ids)]
        request.sampling_params = SamplingParams(temperature=0.0, max_tokens=length, ignore_eos=True)
        return add(request)

    def counted_step():
        in_flight.append(len(engine.scheduler.requests))
        return step()

    engine.add_request, engine.step = add_request, counted_step
    measured = _measure_round({"none": llm}, prompts, 2, SamplingParams(temperature=0.0, max_tokens=1), rotation=0)
    sample, outputs = measured["none"]
    assert [len(tokens) for tokens in outputs] == lengths
    assert sample["tokens"] == sum(lengths)
    # Stream 0: prompts 0, 2, 4 (3 + 4 + 2 steps); stream 1: 1, 3 (9 + 6): two in flight for 9
    # steps, then stream 0 is done and stream 1 runs alone to its 15th step.
    assert in_flight == [2] * 9 + [1] * 6
    assert submitted == [prompts[0], prompts[1], prompts[2], prompts[4], prompts[3]]


def test_a_method_can_carry_its_own_cap() -> None:
    """METHOD/N in --methods: the draft model's cap for draft, the suffix's for suffix and hybrid;
    the others keep the command's caps. METHOD@DTYPE: the method's own draft dtype."""
    import argparse

    from engine.benchmarks.speculative import _load

    args = argparse.Namespace(num_speculative_tokens=4, num_suffix_tokens=16, draft=None, dtype="float32",
                              kv_cache_memory="64MiB", draft_dtype="auto")
    capped = _load("suffix/5", args).config.speculative
    assert (capped.method, capped.num_speculative_tokens, capped.num_suffix_tokens) == ("suffix", 4, 5)
    plain = _load("suffix", args).config.speculative
    assert (plain.method, plain.num_speculative_tokens, plain.num_suffix_tokens) == ("suffix", 4, 16)
    draft = _load("draft/2", args).config.speculative
    assert (draft.method, draft.num_speculative_tokens, draft.num_suffix_tokens) == ("draft", 2, 16)
    assert draft.draft_dtype == "auto"
    pinned = _load("draft/2@bfloat16", args).config.speculative
    assert (pinned.method, pinned.num_speculative_tokens, pinned.draft_dtype) == ("draft", 2, "bfloat16")
