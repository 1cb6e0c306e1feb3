"""2 MiB pages against the allocator's 4 KiB pages on the CPU, side by side in one run.

    python -m engine.benchmarks.huge_pages [--rounds 3] [--dtype auto] [--methods none,hybrid] [--write-docs]
        [--docs-section NAME]

Two engines per method, identical but for `huge_pages` (engine/worker/huge_pages.py): weights and
KV caches in 2 MiB pages, or left as torch's allocator gave them. Each round every engine runs the
speculative benchmark's prompts of one workload (engine/benchmarks/speculative.py), greedy, 128
tokens: one at a time, then 8 together, with that benchmark's rounds (the engines' steps
interleaved one by one, so every engine sees the same machine; each starts a round with an empty
prefix cache and fresh speculation). Reported: output tokens/s over each engine's own steps
(prefill included, the same work in both) as the median over rounds, and the median of the
per-round ratios of 2 MiB to 4 KiB pages. With --write-docs the table replaces its section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

from engine.benchmarks.docs_section import write_section

MAX_TOKENS = 128
STREAMS = 8


def run(args: argparse.Namespace) -> tuple[list[str], dict[tuple[str, bool, int], list[float]]]:
    from engine.benchmarks.speculative import _measure_round, workloads
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    methods = args.methods.split(",")
    engines = {(method, huge): LLM(dtype=args.dtype, kv_cache_memory="512MiB", speculative=method, huge_pages=huge)
               for method in methods for huge in (False, True)}
    for (method, huge), llm in engines.items():
        llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        print(f"{method}, huge_pages={huge}: {llm.engine.runner.huge_page_weight_bytes / 2**20:.0f} MiB of "
              "weights in 2 MiB pages", flush=True)
    named = {f"{method}/{'2M' if huge else '4K'}": llm for (method, huge), llm in engines.items()}
    prompts = workloads(next(iter(engines.values())))[args.workload][:STREAMS]  # one batch of 8 at once
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    tokens_per_second: dict[tuple[str, bool, int], list[float]] = {}
    for round_index in range(args.rounds):
        for streams in (1, STREAMS):
            measured = _measure_round(named, prompts, streams, params, round_index)
            for (method, huge), name in zip(engines, named):
                sample = measured[name][0]
                tokens_per_second.setdefault((method, huge, streams), []).append(sample["tokens"] / sample["seconds"])
            print(f"round {round_index + 1}, {streams} streams: " + ", ".join(
                f"{name} {measured[name][0]['tokens'] / measured[name][0]['seconds']:.1f}" for name in named), flush=True)
    return methods, tokens_per_second


def table(methods: list[str], tokens_per_second: dict[tuple[str, bool, int], list[float]]) -> str:
    lines = ["| method | streams | 4 KiB pages tokens/s | 2 MiB pages tokens/s | ratio | ratio range |",
             "|---|---:|---:|---:|---:|---:|"]
    for method in methods:
        for streams in (1, STREAMS):
            small, huge = tokens_per_second[(method, False, streams)], tokens_per_second[(method, True, streams)]
            ratios = [h / s for h, s in zip(huge, small)]
            lines.append(f"| {method} | {streams} | {statistics.median(small):.1f} | {statistics.median(huge):.1f} "
                         f"| {statistics.median(ratios):.2f}x | {min(ratios):.2f}-{max(ratios):.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--methods", default="none,hybrid", help="speculative methods, comma-separated")
    parser.add_argument("--workload", default="code", choices=["code", "chat", "agent"],
                        help="the speculative benchmark's prompts to run")
    parser.add_argument("--write-docs", action="store_true", help="replace this table's section of docs/benchmarks.md")
    parser.add_argument("--docs-section", default="huge-pages-benchmark",
                        help="the marked section of docs/benchmarks.md that --write-docs rewrites")
    args = parser.parse_args(argv)
    methods, tokens_per_second = run(args)
    text = table(methods, tokens_per_second)
    print(text)
    if args.write_docs:
        machine = (f"{platform.machine()} ({torch.backends.cpu.get_cpu_capability()}), {os.cpu_count()} CPU threads, "
                   f"torch {torch.__version__}, Linux {platform.release()}")
        command = "python -m engine.benchmarks.huge_pages " + " ".join(argv if argv is not None else sys.argv[1:])
        write_section(args.docs_section, (
            "## 2 MiB pages for weights and KV caches (CPU)\n\n"
            f"Command: `{command.strip()}`\n\n"
            f"Machine: {machine}. Measured {time.strftime('%Y-%m-%d %H:%M')}.\n\n"
            f"The embedded model, dtype {args.dtype}; two engines per method, identical but for `huge_pages`, "
            f"their steps interleaved one by one (engine/benchmarks/speculative.py's rounds: each engine starts "
            f"a round with an empty prefix cache and fresh speculation); each round the {args.workload} workload's "
            f"prompts one at a time (1 stream) and {STREAMS} together; greedy, {MAX_TOKENS} tokens; output "
            f"tokens/s over each engine's own steps (prefill included), the median over {args.rounds} rounds; "
            f"ratio: the median of the per-round ratios of 2 MiB to 4 KiB pages.\n\n"
            f"{text}\n"))


if __name__ == "__main__":
    main()
