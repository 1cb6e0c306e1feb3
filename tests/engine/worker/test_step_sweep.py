"""The step sweep: the target step's seconds by row count, measured once when speculation is built
and kept by the controller across resets (engine/worker/step_sweep.py)."""

from __future__ import annotations

import pytest
import torch

from engine.llm import LLM
from engine.worker.step_sweep import sweep_step_seconds


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(dtype="float32", speculative="suffix", kv_cache_memory="64MiB", max_num_batched_tokens=12)


def test_the_runner_sweeps_every_row_count_up_to_the_step_budget(llm: LLM) -> None:
    runner = llm.engine.runner
    swept = runner._swept_steps
    assert sorted(swept) == list(range(1, 13))  # (the step budget: 12 tokens)
    assert all(0 < seconds < 10 for seconds in swept.values())
    assert runner.spec.cost.swept
    assert runner.spec.cost.table_seconds(12) is not None


def test_speculation_keeps_the_sweep_when_it_starts_afresh(llm: LLM) -> None:
    runner = llm.engine.runner
    swept = runner._swept_steps
    llm.generate(["def add(a, b):"], use_tqdm=False)
    llm.reset_speculation()
    assert runner.spec.cost.swept and runner._swept_steps is swept  # (not swept again)
    llm.set_speculative_method("suffix")
    assert runner.spec.cost.swept and runner._swept_steps is swept


def test_a_sweep_times_a_forward_and_its_logits_per_row_count(llm: LLM) -> None:
    runner = llm.engine.runner
    calls: list[int] = []
    forward = runner.model.forward

    def counted(ids: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        calls.append(len(ids))
        return forward(ids, *args, **kwargs)

    runner.model.forward = counted
    try:
        swept = sweep_step_seconds(runner.model, runner.kv_spec, runner.device, max_rows=3, passes=2)
    finally:
        del runner.model.forward
    assert sorted(swept) == [1, 2, 3]
    assert sorted(calls) == [1, 1, 1, 2, 2, 3, 3, 3]  # a warm-up at 1 and 3, then two passes
    assert sweep_step_seconds(runner.model, runner.kv_spec, runner.device, max_rows=0) == {}
