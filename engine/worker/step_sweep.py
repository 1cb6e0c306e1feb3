"""What a target step costs at each row count, measured once when speculation is built.

Speculation prices a drafted token by what its verification row adds to the step, and a CPU's
step is a staircase in its rows: the few-row kernels stream every weight once per group of rows
(kernels/cpu/panel_linear.cpp), so on an AVX2 EPYC (float32, the embedded model) a step of 8
decode rows took 28.7 ms, 12 rows 29.9, but 13 rows 35.7 (a third group). The controller learns
the steps it runs (engine/spec_decode/cost_model.py), but only those: at 8 streams, where the
line's slope (about a row's average price) kept drafts off, it never ran the 9-12-row steps that
would have shown the 4 rows past the batch to cost about 1 ms for all of them. So the runner sweeps
the row counts once: a decode-like forward (every row its own sequence, one block of context) and
the logits of every row, each count timed on two passes over all counts (after a warm-up at the
least and the most; interleaved, so the machine's drift hits every count alike), keeping each
count's least: about 2 s on that CPU for 1-32 rows. The forward is what every
step pays whatever its requests; what the sweep leaves out (building the step's inputs, sampling,
attention over longer contexts) the controller adds from the steps it sees (StepCostModel.sweep).
"""

from __future__ import annotations

import time

import torch

from engine.model.attention_metadata import AttentionMetadata
from engine.worker.kv_cache import KVCacheSpec, allocate_kv_caches

STEP_SWEEP_ROWS = 32  # row counts swept: 1 .. this (and at most the step's token budget)
SWEEP_PASSES = 2  # timed passes over every row count; a count keeps its least


@torch.inference_mode()
def sweep_step_seconds(model: torch.nn.Module, kv_spec: KVCacheSpec, device: torch.device,
                       max_rows: int, passes: int = SWEEP_PASSES) -> dict[int, float]:
    """Seconds of a forward and its logits over n decode rows, n = 1 .. max_rows, in a throwaway
    KV cache of max_rows blocks (row i writes the last slot of block i)."""
    if max_rows < 1:
        return {}
    block_size = kv_spec.block_size
    caches = allocate_kv_caches(kv_spec, max_rows, device)
    inputs = {}
    for n in range(1, max_rows + 1):
        meta = AttentionMetadata.build(query_lens=[1] * n, seq_lens=[block_size] * n,
                                       block_ids=[[i] for i in range(n)], block_size=block_size, device=device)
        ids = torch.zeros(n, dtype=torch.int64, device=device)  # [n]
        positions = torch.full((n,), block_size - 1, dtype=torch.int64, device=device)  # [n]
        inputs[n] = (ids, positions, meta)
    def timed(n: int) -> float:
        ids, positions, meta = inputs[n]
        _synchronize(device)
        started = time.perf_counter()
        hidden = model(ids, positions, caches, meta)  # [n, hidden]
        model.compute_logits(hidden).argmax(dim=-1)  # logits: [n, vocab]
        _synchronize(device)
        return time.perf_counter() - started

    for n in {1, max_rows}:  # warm-up, not kept (first calls allocate, pick kernels)
        timed(n)
    best: dict[int, float] = {}
    for _ in range(passes):
        for n in inputs:
            seconds = timed(n)
            best[n] = min(seconds, best.get(n, seconds))
    del caches
    return best


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
