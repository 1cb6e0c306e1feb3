"""The compiled CPU kernels (kernels/cpu) against the torch references and a dense float64
attention: ragged batches, block boundaries, block sizes 1-32, GQA, head dims 64/128 (and odd
ones through the generic path), prefix plus new tokens, sliding windows, split long decodes,
fp32 and bf16; then store_kv, error reporting, dispatch, and the build cache."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels import CpuAttentionPlan, paged_attention_ref, store_kv_ref
from kernels.cpu import CpuKernels, build_library, cpu_kernels, unavailable_reason
from kernels.cpu.build import BuildError

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "kernels" / "cpu" / "build.py"


@dataclass
class Case:
    query: torch.Tensor  # [num_tokens, num_heads, head_dim] float32
    k_cache: torch.Tensor  # [num_blocks, num_kv_heads, block_size, head_dim] float32
    v_cache: torch.Tensor  # [num_blocks, num_kv_heads, block_size, head_dim] float32
    block_table: torch.Tensor  # [num_reqs, max_blocks] int32
    query_start_loc: list[int]
    seq_lens: list[int]
    expected: torch.Tensor  # [num_tokens, num_heads, head_dim] float64, dense attention
    scale: float


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    sliding_window: int | None) -> torch.Tensor:  # [query_len, num_heads, head_dim] float64
    """q [query_len, heads, dim] at positions seq_len - query_len.., k/v [seq_len, kv_heads, dim]."""
    query_len, num_heads, _ = q.shape
    seq_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    keys = k.double().repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, seq_len, dim]
    values = v.double().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = q.double().transpose(0, 1) @ keys.transpose(1, 2) * scale  # [heads, query_len, seq_len]
    position = torch.arange(seq_len - query_len, seq_len).unsqueeze(1)
    key_position = torch.arange(seq_len).unsqueeze(0)
    visible = key_position <= position
    if sliding_window is not None:
        visible &= key_position > position - sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ values).transpose(0, 1)


def make_case(query_lens: list[int], prefix_lens: list[int], num_kv_heads: int, group: int, head_dim: int,
              block_size: int, sliding_window: int | None, seed: int) -> Case:
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    num_heads = num_kv_heads * group
    seq_lens = [p + q for p, q in zip(prefix_lens, query_lens)]
    blocks_needed = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = sum(blocks_needed) + 3
    free = list(range(num_blocks))
    rng.shuffle(free)
    # Garbage everywhere: an unmasked read of a slot nobody wrote shows up as a large error.
    k_cache = 100 * torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=generator)
    v_cache = 100 * torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=generator)
    max_blocks = max(blocks_needed)
    block_table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    queries, expected = [], []
    scale = head_dim ** -0.5
    for i, (query_len, seq_len) in enumerate(zip(query_lens, seq_lens)):
        blocks = [free.pop() for _ in range(blocks_needed[i])]
        padding = [rng.randrange(num_blocks) for _ in range(max_blocks - len(blocks))]  # stale ids
        block_table[i] = torch.tensor(blocks + padding, dtype=torch.int32)
        k = torch.randn(seq_len, num_kv_heads, head_dim, generator=generator)
        v = torch.randn(seq_len, num_kv_heads, head_dim, generator=generator)
        for pos in range(seq_len):  # written slot by slot, independently of store_kv
            k_cache[blocks[pos // block_size], :, pos % block_size] = k[pos]
            v_cache[blocks[pos // block_size], :, pos % block_size] = v[pos]
        q = 2 * torch.randn(query_len, num_heads, head_dim, generator=generator)  # peaky enough softmaxes
        queries.append(q)
        expected.append(dense_attention(q, k, v, scale, sliding_window))
    starts = [0]
    for query_len in query_lens:
        starts.append(starts[-1] + query_len)
    return Case(torch.cat(queries), k_cache, v_cache, block_table, starts, seq_lens, torch.cat(expected), scale)


def check(compiled: CpuKernels, case: Case, sliding_window: int | None, dtype: torch.dtype) -> None:
    """Compiled == reference == dense, to fp32 rounding (fp32) or bf16 rounding (bf16)."""
    query, k_cache, v_cache = case.query.to(dtype), case.k_cache.to(dtype), case.v_cache.to(dtype)
    args = (case.block_table, case.query_start_loc, case.seq_lens, case.scale, sliding_window)
    out = compiled.paged_attention(query, k_cache, v_cache, *args)
    reference = paged_attention_ref(query, k_cache, v_cache, *args)
    assert out.shape == case.query.shape and out.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.double(), case.expected, atol=1e-5, rtol=1e-5)
    else:
        # Inputs rounded to bf16, fp32 accumulation, output rounded to bf16: against the dense
        # attention of the same rounded inputs, the output's own rounding dominates.
        dense = torch.cat([
            dense_attention(query[s:e].float(), _gather(k_cache, case, i), _gather(v_cache, case, i), case.scale,
                            sliding_window)
            for i, (s, e) in enumerate(zip(case.query_start_loc, case.query_start_loc[1:]))])
        torch.testing.assert_close(out.double(), dense, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(out.float(), reference.float(), atol=2e-2, rtol=2e-2)


def _gather(cache: torch.Tensor, case: Case, i: int) -> torch.Tensor:  # [seq_len, kv_heads, dim] float32
    block_size = cache.shape[2]
    positions = torch.arange(case.seq_lens[i])
    blocks = case.block_table[i].long()[positions // block_size]
    return cache[blocks, :, positions % block_size].float()


KV_HEADS_AND_GROUP = st.sampled_from([(1, 1), (2, 1), (1, 2), (1, 4), (2, 2), (2, 3), (3, 3), (4, 2)])


@settings(max_examples=30, deadline=None)
@given(
    requests=st.lists(st.tuples(st.integers(1, 33), st.integers(0, 80)), min_size=1, max_size=4),
    kv_heads_and_group=KV_HEADS_AND_GROUP,
    head_dim=st.sampled_from([64, 128]),
    block_size=st.sampled_from([1, 2, 4, 8, 16, 32]),
    sliding_window=st.one_of(st.none(), st.integers(1, 50)),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_matches_reference_and_dense(compiled, requests, kv_heads_and_group, head_dim, block_size, sliding_window,
                                     dtype, seed) -> None:
    num_kv_heads, group = kv_heads_and_group
    case = make_case([q for q, _ in requests], [p for _, p in requests], num_kv_heads, group, head_dim, block_size,
                     sliding_window, seed)
    check(compiled, case, sliding_window, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sliding_window", [None, 1, 17, 40])
def test_decode_rows_straddling_chunks_and_blocks(compiled, dtype, sliding_window) -> None:
    # Context lengths on either side of block (16) and key-chunk (32) boundaries.
    lens = [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100]
    case = make_case([1] * len(lens), [n - 1 for n in lens], 3, 3, 64, 16, sliding_window, seed=3)
    check(compiled, case, sliding_window, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_mixed_step(compiled, dtype, head_dim) -> None:
    """Decodes, a fresh prefill spanning several query tiles, a chunk over a cached prefix and
    a short verification row, in one call."""
    case = make_case([1, 70, 1, 45, 4, 1], [80, 0, 5, 130, 37, 200], 3, 3, head_dim, 16, None, seed=4)
    check(compiled, case, None, dtype)


@pytest.mark.parametrize("head_dim", [8, 24, 80])
def test_generic_head_dims(compiled, head_dim) -> None:
    # Head dims other than 64 and 128 take the generic path (partial last vector).
    for dtype in (torch.float32, torch.bfloat16):
        case = make_case([1, 9, 1, 20], [13, 0, 40, 12], 2, 2, head_dim, 4, None, seed=5)
        check(compiled, case, None, dtype)
        case = make_case([3, 1], [30, 50], 1, 3, head_dim, 8, 11, seed=6)
        check(compiled, case, 11, dtype)


@pytest.mark.parametrize("sliding_window", [None, 300])
def test_long_rows_split_across_threads(compiled, sliding_window) -> None:
    """With fewer work items than threads can share, long key ranges are split and merged."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(4)  # more threads than cores is fine: it only changes the plan
        for query_lens, prefixes in (([1], [900]), ([1, 2], [700, 500]), ([3], [1000])):
            case = make_case(query_lens, prefixes, 1, 4, 64, 16, sliding_window, seed=7)
            check(compiled, case, sliding_window, torch.float32)
            check(compiled, case, sliding_window, torch.bfloat16)
            torch.set_num_threads(1)
            single = compiled.paged_attention(case.query, case.k_cache, case.v_cache, case.block_table,
                                              case.query_start_loc, case.seq_lens, case.scale, sliding_window)
            torch.set_num_threads(4)
            split = compiled.paged_attention(case.query, case.k_cache, case.v_cache, case.block_table,
                                             case.query_start_loc, case.seq_lens, case.scale, sliding_window)
            torch.testing.assert_close(split, single, atol=1e-6, rtol=1e-5)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sliding_window", [None, 100])
def test_verification_rows_read_keys_once(compiled, dtype, sliding_window) -> None:
    """Requests verifying 2-10 drafted tokens (one query tile each, scored key by key with the
    next chunk's rows prefetched) over contexts that span many chunks and blocks, alone and eight
    at once, with and without the key ranges split across threads."""
    threads = torch.get_num_threads()
    try:
        for num_threads in (1, 4):
            torch.set_num_threads(num_threads)
            for query_lens, prefixes in (([2], [400]), ([5], [999]), ([10], [257]), ([7], [31]),
                                         ([2, 3, 4, 5, 6, 2, 9, 10], [300, 33, 64, 500, 1, 128, 96, 200])):
                case = make_case(query_lens, prefixes, 3, 3, 64, 16, sliding_window, seed=8)
                check(compiled, case, sliding_window, dtype)
    finally:
        torch.set_num_threads(threads)


def test_strided_query_and_mixed_dtypes(compiled) -> None:
    """The model passes q as a view of the fused qkv projection; a bf16 query may meet an fp32
    cache (computed in fp32, so it matches the dense attention of the rounded query)."""
    case = make_case([5, 1, 12], [3, 40, 20], 2, 3, 64, 8, None, seed=8)
    fused = torch.randn(case.query.shape[0], case.query.shape[1] + 4, 64)
    fused[:, 2:-2] = case.query
    view = fused[:, 2:-2]
    assert not view.is_contiguous()
    out = compiled.paged_attention(view, case.k_cache, case.v_cache, case.block_table, case.query_start_loc,
                                   case.seq_lens, case.scale)
    torch.testing.assert_close(out.double(), case.expected, atol=1e-5, rtol=1e-5)
    query = case.query.to(torch.bfloat16)
    out = compiled.paged_attention(query, case.k_cache, case.v_cache, case.block_table, case.query_start_loc,
                                   case.seq_lens, case.scale)
    dense = paged_attention_ref(query.float(), case.k_cache, case.v_cache, case.block_table, case.query_start_loc,
                                case.seq_lens, case.scale)
    torch.testing.assert_close(out.float(), dense.to(torch.bfloat16).float(), atol=1e-5, rtol=0.01)


def test_plan_is_shared_and_optional(compiled) -> None:
    case = make_case([1, 6], [20, 3], 1, 2, 64, 4, 9, seed=9)
    plan = kernels.plan_attention(case.block_table, case.query_start_loc, case.seq_lens, 4, 9)
    assert isinstance(plan, CpuAttentionPlan)
    with_plan = kernels.paged_attention(case.query, case.k_cache, case.v_cache, case.block_table,
                                        case.query_start_loc, case.seq_lens, case.scale, 9, plan=plan)
    without = kernels.paged_attention(case.query, case.k_cache, case.v_cache, case.block_table,
                                      case.query_start_loc, case.seq_lens, case.scale, 9)
    assert torch.equal(with_plan, without)
    torch.testing.assert_close(with_plan.double(), case.expected, atol=1e-5, rtol=1e-5)


def test_errors_name_the_problem(compiled) -> None:
    case = make_case([2, 1], [3, 5], 1, 1, 64, 4, None, seed=10)
    table = case.block_table.clone()
    table[1, 0] = case.k_cache.shape[0] + 5
    with pytest.raises(ValueError, match="block table entry"):
        compiled.paged_attention(case.query, case.k_cache, case.v_cache, table, case.query_start_loc,
                                 case.seq_lens, case.scale)
    with pytest.raises(ValueError, match="query_start_loc"):
        compiled.paged_attention(case.query, case.k_cache, case.v_cache, case.block_table, [0, 2, 4],
                                 case.seq_lens, case.scale)
    with pytest.raises(ValueError, match="exceeds its seq_len"):
        compiled.paged_attention(case.query, case.k_cache, case.v_cache, case.block_table, case.query_start_loc,
                                 [1, 6], case.scale)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("source_dtype", [torch.float32, torch.bfloat16])
def test_store_kv_equals_reference(compiled, cache_dtype, source_dtype) -> None:
    generator = torch.Generator().manual_seed(11)
    num_blocks, num_kv_heads, block_size, head_dim = 7, 3, 4, 64
    slots = torch.tensor([0, 5, 27, 9, 10, 3, 17])
    fused = torch.randn(len(slots), 2 * num_kv_heads + 1, head_dim, generator=generator).to(source_dtype)
    key, value = fused[:, :num_kv_heads], fused[:, num_kv_heads: 2 * num_kv_heads]  # strided views
    caches = [torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=generator).to(cache_dtype)
              for _ in range(2)]
    expected = [c.clone() for c in caches]
    compiled.store_kv(key, value, caches[0], caches[1], slots)
    store_kv_ref(key, value, expected[0], expected[1], slots)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])  # rounding included


def test_store_kv_rejects_bad_slots_before_writing(compiled) -> None:
    k_cache, v_cache = torch.zeros(2, 1, 4, 64), torch.zeros(2, 1, 4, 64)
    key = value = torch.ones(2, 1, 64)
    with pytest.raises(ValueError, match="slot_mapping\\[1\\] = 8"):
        compiled.store_kv(key, value, k_cache, v_cache, torch.tensor([3, 8]))
    assert not k_cache.any() and not v_cache.any()


def test_dispatch_writes_through_store_kv(compiled) -> None:
    case = make_case([3], [5], 2, 2, 64, 4, None, seed=12)
    k_cache, v_cache = torch.zeros_like(case.k_cache), torch.zeros_like(case.v_cache)
    key, value = torch.randn(3, 2, 64), torch.randn(3, 2, 64)
    slots = torch.tensor([1, 6, 11])
    kernels.store_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache[2, :, 3], key[2]) and torch.equal(v_cache[1, :, 2], value[1])


def _run(code: str, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_second_process_reuses_the_build(compiled) -> None:
    code = ("import json, kernels.cpu as c; k = c.cpu_kernels(); b = c.last_build(); "
            "print(json.dumps({'path': str(k.path), 'built': b.built}))")
    reported = _run(code, {})
    assert reported == {"path": str(compiled.path), "built": False}


def test_switch_and_missing_compiler_fall_back_to_reference(tmp_path) -> None:
    code = ("import json, torch, kernels, kernels.cpu as c; q = torch.randn(2, 2, 64); "
            "kc = torch.randn(1, 1, 4, 64); t = torch.zeros(1, 1, dtype=torch.int32); "
            "o = kernels.paged_attention(q, kc, kc, t, [0, 2], [2], 0.125); "
            "r = kernels.paged_attention_ref(q, kc, kc, t, [0, 2], [2], 0.125); "
            "print(json.dumps({'kernels': c.cpu_kernels() is not None, 'reason': c.unavailable_reason(), "
            "'equal': torch.equal(o, r)}))")
    switched_off = _run(code, {"DRAFTGATE_CPU_KERNELS": "0"})
    assert switched_off == {"kernels": False, "reason": "switched off by DRAFTGATE_CPU_KERNELS=0", "equal": True}
    no_compiler = _run(code, {"CXX": str(tmp_path / "no-such-compiler"), "DRAFTGATE_CACHE_DIR": str(tmp_path)})
    assert no_compiler["kernels"] is False and no_compiler["equal"] is True
    assert "no-such-compiler" in no_compiler["reason"]
    with pytest.raises(BuildError, match="no-such-compiler"):
        build_library(str(tmp_path / "no-such-compiler"), tmp_path)


def test_concurrent_builds_compile_once_and_portable_path_matches(tmp_path) -> None:
    """Two processes build into an empty cache at once: one compiles, the other waits on the lock
    and reuses it; a third finds it. The variant built is the portable one (no AVX-512
    intrinsics), which this also checks for correctness."""
    if cpu_kernels() is None:
        pytest.skip(f"compiled CPU kernels unavailable: {unavailable_reason()}")
    command = [sys.executable, str(BUILD_SCRIPT), "--cache-dir", str(tmp_path), "--flag=-DDRAFTGATE_PORTABLE"]
    running = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for process in running:
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr
        results.append(json.loads(stdout))
    third = json.loads(subprocess.run(command, capture_output=True, text=True, check=True, timeout=600).stdout)
    assert sorted(r["built"] for r in results) == [False, True] and third["built"] is False
    assert results[0]["path"] == results[1]["path"] == third["path"]
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []

    portable = CpuKernels(Path(third["path"]))
    for dtype in (torch.float32, torch.bfloat16):
        case = make_case([1, 1, 40, 3], [70, 5, 30, 200], 3, 3, 64, 16, None, seed=13)
        check(portable, case, None, dtype)
        case = make_case([1, 7], [50, 9], 2, 2, 80, 8, 13, seed=14)
        check(portable, case, 13, dtype)
