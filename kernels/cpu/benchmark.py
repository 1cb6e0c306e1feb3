"""Per-layer attention time: the compiled CPU kernel against the torch reference, same run.

    python -m kernels.cpu.benchmark [--threads 2] [--repeats 30]

Shapes are the embedded model's (SmolLM2-135M: 9 query heads, 3 kv heads, head_dim 64) with
16-token blocks scattered over a pool. Cases: decode of 64 requests with contexts uniform in
64-512 (the offline benchmark's steady state), decode of one 512-token request, a 1,000-token
prefill, and a mixed step (48 decodes plus a 256-token chunk over a 256-token prefix). Each
time covers store_kv plus paged_attention, as one model layer calls them (the reference's plan
is built once per step, outside the timing, as the engine shares it across layers). Prints
medians and the reference / compiled ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch

from kernels.cpu import cpu_kernels, unavailable_reason
from kernels.kv_store import store_kv_ref
from kernels.paged_attention import paged_attention_ref, plan_attention

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16


def make_step(query_lens: list[int], seq_lens: list[int], dtype: torch.dtype, seed: int) -> dict:
    rng = random.Random(seed)
    blocks_needed = [(s + BLOCK_SIZE - 1) // BLOCK_SIZE for s in seq_lens]
    num_blocks = sum(blocks_needed) * 2
    free = list(range(num_blocks))
    rng.shuffle(free)
    table = torch.zeros(len(seq_lens), max(blocks_needed), dtype=torch.int32)
    slots = []
    for i, (query_len, seq_len) in enumerate(zip(query_lens, seq_lens)):
        blocks = [free.pop() for _ in range(blocks_needed[i])]
        table[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        slots += [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(seq_len - query_len, seq_len)]
    num_tokens = sum(query_lens)
    starts = [0]
    for query_len in query_lens:
        starts.append(starts[-1] + query_len)
    cache = torch.randn(2, num_blocks, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM).to(dtype)
    qkv = torch.randn(num_tokens, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM).to(dtype)  # views, as in the model
    return dict(query=qkv[:, :NUM_HEADS], key=qkv[:, NUM_HEADS:NUM_HEADS + NUM_KV_HEADS],
                value=qkv[:, NUM_HEADS + NUM_KV_HEADS:], k_cache=cache[0], v_cache=cache[1], block_table=table,
                query_start_loc=starts, seq_lens=list(seq_lens), slot_mapping=torch.tensor(slots))


def run_reference(step: dict) -> Callable[[], torch.Tensor]:
    plan = plan_attention(step["block_table"], step["query_start_loc"], step["seq_lens"], BLOCK_SIZE)

    def layer() -> torch.Tensor:
        store_kv_ref(step["key"], step["value"], step["k_cache"], step["v_cache"], step["slot_mapping"])
        return paged_attention_ref(step["query"], step["k_cache"], step["v_cache"], step["block_table"],
                                   step["query_start_loc"], step["seq_lens"], HEAD_DIM ** -0.5, plan=plan)
    return layer


def run_compiled(step: dict) -> Callable[[], torch.Tensor]:
    kernels = cpu_kernels()
    assert kernels is not None
    plan = kernels.plan(step["query_start_loc"], step["seq_lens"], None)

    def layer() -> torch.Tensor:
        kernels.store_kv(step["key"], step["value"], step["k_cache"], step["v_cache"], step["slot_mapping"])
        return kernels.paged_attention(step["query"], step["k_cache"], step["v_cache"], step["block_table"],
                                       step["query_start_loc"], step["seq_lens"], HEAD_DIM ** -0.5, plan=plan)
    return layer


def median_ms(fn: Callable[[], torch.Tensor], repeats: int, clock: Callable[[], float]) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        started = clock()
        fn()
        samples.append(clock() - started)
    return statistics.median(samples) * 1000


def cases(seed: int) -> dict[str, tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    decode_contexts = [rng.randint(64, 512) for _ in range(64)]
    return {
        "decode 64 reqs, ctx 64-512": ([1] * 64, decode_contexts),
        "decode 1 req, ctx 512": ([1], [512]),
        "prefill 1000 tokens": ([1000], [1000]),
        "48 decodes + 256-token chunk": ([1] * 48 + [256], decode_contexts[:48] + [512]),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with the calling thread's CPU clock (with --threads 1: immune to other "
                             "processes taking the cores; every kernel then runs on the calling thread)")
    args = parser.parse_args(argv)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(args.threads)
    if cpu_kernels() is None:
        raise SystemExit(f"compiled CPU kernels unavailable: {unavailable_reason()}")
    print(f"{args.threads} threads, median of {args.repeats}, {'thread CPU' if args.cpu_time else 'wall'} time; "
          "ms per layer (store_kv + paged_attention)\n")
    print("| case | dtype | torch reference ms | compiled ms | ratio |")
    print("|---|---|---:|---:|---:|")
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for name, (query_lens, seq_lens) in cases(args.seed).items():
            step = make_step(query_lens, seq_lens, dtype, args.seed)
            reference = median_ms(run_reference(step), args.repeats, clock)
            compiled = median_ms(run_compiled(step), args.repeats, clock)
            print(f"| {name} | {dtype_name} | {reference:.3f} | {compiled:.3f} | {reference / compiled:.1f}x |")


if __name__ == "__main__":
    main()
