"""Offline engine benchmark against Hugging Face transformers, side by side in one run.

    python -m engine.benchmarks.offline [--num-requests 64] [--min-len 32] [--max-len 256] [--write-docs]

1. Throughput: a nano-vllm-style workload scaled to a 2-core CPU: N requests of random token ids,
   prompt and output lengths uniform in [min_len, max_len], ignore_eos, everything submitted at
   once. draftgate's LLM.generate against transformers' generate() on the same weights (the same
   GGUF file, dequantized by transformers' own loader), batched with left padding (static
   batching: a batch runs until its longest output is done; only the requested tokens count).
   Rounds alternate the two systems (--rounds, default 3) and medians are reported.
2. Single-stream decode tokens/s (one request, 256 output tokens).
3. TTFT of a 1,000-token prompt, cold and with its prefix cached.

Prints a table; with --write-docs, replaces its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from dataclasses import dataclass

import torch

from engine.benchmarks.docs_section import write_section
from engine.llm import LLM
from engine.model.resolve import embedded_gguf_path
from engine.protocol import AddRequest
from engine.sampling_params import SamplingParams


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)


def make_workload(num_requests: int, min_len: int, max_len: int, vocab_size: int, seed: int) -> Workload:
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, vocab_size) for _ in range(rng.randint(min_len, max_len))]
               for _ in range(num_requests)]
    output_lens = [rng.randint(min_len, max_len) for _ in range(num_requests)]
    return Workload(prompts, output_lens)


def run_draftgate(llm: LLM, workload: Workload) -> float:
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in workload.output_lens]
    started = time.perf_counter()
    outputs = llm.generate(workload.prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    produced = sum(len(o.token_ids) for o in outputs)
    if produced != workload.num_output_tokens:
        raise RuntimeError(f"draftgate produced {produced} tokens, expected {workload.num_output_tokens}")
    return elapsed


def load_transformers(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(embedded_gguf_path())
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    model.eval()
    return model


def run_transformers(model, workload: Workload, batch_size: int) -> float:
    pad_id = 0
    order = list(range(len(workload.prompts)))
    started = time.perf_counter()
    for first in range(0, len(order), batch_size):
        batch = order[first : first + batch_size]
        longest = max(len(workload.prompts[i]) for i in batch)
        ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, i in enumerate(batch):
            prompt = workload.prompts[i]
            ids[row, longest - len(prompt) :] = torch.tensor(prompt)
            mask[row, longest - len(prompt) :] = 1
        max_new = max(workload.output_lens[i] for i in batch)
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new,
                           do_sample=False, pad_token_id=pad_id)
    return time.perf_counter() - started


def single_stream_decode(llm: LLM, num_tokens: int = 256) -> float:
    """Decode tokens/s of one request, timed from its first token to its last."""
    engine = llm.engine
    engine.add_request(AddRequest("decode-probe", list(range(1000, 1032)),
                                  SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True),
                                  time.monotonic()))
    stamps = []
    while engine.has_unfinished_requests():
        for delta in engine.step():
            stamps.extend([time.perf_counter()] * len(delta.new_token_ids))
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def ttft(llm: LLM, prompt: list[int], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def default_dtypes() -> list[str]:
    from kernels.onednn_linear import onednn_bf16_available

    return ["float32", "bfloat16"] if onednn_bf16_available() else ["float32"]


def measure_dtype(dtype: str, args: argparse.Namespace) -> list[str]:
    """One dtype: throughput of draftgate and transformers in interleaved rounds (so a change in
    the machine's speed hits both alike), then draftgate's single-stream decode and TTFT."""
    llm = LLM(dtype=dtype)
    workload = make_workload(args.num_requests, args.min_len, args.max_len, llm.engine.vocab_size, args.seed)
    # Warm-up: first-call allocations and lazy initialisation, outside every timing.
    llm.generate([workload.prompts[0]], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    hf_model = None if args.skip_transformers else load_transformers(getattr(torch, dtype))
    ours_runs, hf_runs = [], []
    for _ in range(args.rounds):
        llm.reset_prefix_cache()  # every round computes its prompts, as the first did
        ours_runs.append(run_draftgate(llm, workload))
        if hf_model is not None:
            hf_runs.append(run_transformers(hf_model, workload, args.hf_batch_size))
    del hf_model
    decode_tps = single_stream_decode(llm, args.decode_tokens)
    long_prompt = [random.Random(1).randrange(100, llm.engine.vocab_size) for _ in range(args.ttft_prompt_len)]
    colds = []
    for _ in range(3):
        llm.reset_prefix_cache()
        colds.append(ttft(llm, long_prompt, repeats=1))
    cold = statistics.median(colds)
    cached = ttft(llm, long_prompt, repeats=5)
    del llm
    tokens = workload.num_output_tokens
    ours_seconds = statistics.median(ours_runs)
    if hf_runs:
        # The ratio is the median of each round's side-by-side ratio.
        ratio_value = statistics.median(hf / ours for ours, hf in zip(ours_runs, hf_runs))
        ratio, hf_cell = f"**{ratio_value:.2f}x**", f"{tokens / statistics.median(hf_runs):.1f}"
    else:
        ratio, hf_cell = "-", "-"
    return [f"| {dtype} | {tokens / ours_seconds:.1f} | {hf_cell} | {ratio} | {decode_tps:.1f} | "
            f"{cold * 1000:.0f} | {cached * 1000:.0f} | {cached / cold:.3f} |"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--hf-batch-size", type=int, default=64, help="transformers generate() batch size")
    parser.add_argument("--dtypes", default=None,
                        help="comma-separated; default float32, plus bfloat16 when the CPU has native bf16 (AMX or AVX512-BF16)")
    parser.add_argument("--decode-tokens", type=int, default=256, help="single-stream decode length")
    parser.add_argument("--ttft-prompt-len", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved throughput rounds per system; medians (the ratio: of each round's)")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args(argv)
    dtypes = args.dtypes.split(",") if args.dtypes else default_dtypes()

    rows = []
    for dtype in dtypes:
        rows += measure_dtype(dtype, args)
    lines = [
        f"Workload: {args.num_requests} requests of random token ids, prompt and output lengths uniform in "
        f"{args.min_len}-{args.max_len} (seed {args.seed}), ignore_eos, greedy, all submitted at once; "
        f"{args.rounds} interleaved rounds (draftgate, transformers, draftgate, ...), medians, the ratio the "
        "median of each round's ratio. "
        "Embedded SmolLM2-135M-Instruct; transformers loads the same GGUF with its own loader and runs "
        f"generate() in batches of {args.hf_batch_size} with left padding (only requested tokens count). "
        f"Single-stream decode: one request, 32-token prompt, {args.decode_tokens} tokens, timed first to last "
        f"token. TTFT: a {args.ttft_prompt_len}-token prompt with max_tokens=1, cold (prefix cache reset, median of 3) and again "
        "with its prefix cached (median of 5).",
        "",
        "| dtype | draftgate tokens/s | transformers tokens/s | ratio | single-stream decode tokens/s "
        "| TTFT cold ms | TTFT cached ms | cached / cold |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]
    table = "\n".join(lines)
    print(table)
    if args.write_docs:
        write_docs(table)


def write_docs(table: str) -> None:
    machine = f"{platform.machine()}, {os.cpu_count()} CPU threads, torch {torch.__version__}, {torch.get_num_threads()} torch threads"
    write_section("offline-benchmark",
                  "## Offline engine: throughput, decode, TTFT\n\n"
                  "Command: `make bench-engine` (= `.venv/bin/python -m engine.benchmarks.offline --write-docs`)\n\n"
                  f"Machine: {machine}. Measured {time.strftime('%Y-%m-%d')}.\n\n{table}")


if __name__ == "__main__":
    main()
