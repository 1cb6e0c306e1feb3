"""float32 linears on the CPU at the embedded model's shapes: F.linear, the few-row W @ x^T path
(MKL, kernels/small_rows_linear.py's fallback), oneDNN's prepacked product
(kernels/onednn_linear.py), the compiled row kernel (kernels/cpu/skinny_linear.cpp; also over the
weight held in bf16) and the compiled panel kernel (kernels/cpu/panel_linear.cpp, over the weight
held in panels of 16 output channels: what the engine runs for every row count on AVX2 CPUs),
side by side in one run.

    python -m engine.benchmarks.cpu_linear [--threads 2] [--rows 1,2,4,8,16,32,512] [--write-docs]
        [--docs-section NAME]

Rows: 1 is a decode step of one request, 8 a step of 8, 16-32 verification steps (8 requests with
1-3 drafts each), 512 a prefill chunk. Each weight is copied enough times that the copies
together exceed the last-level cache and the calls cycle through them, so every call reads its
weight from memory as a decode step does (one pass over all the layers per step). Medians of
--repeats calls per cell, the three paths interleaved call by call so the machine's drift hits
each alike.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from engine.benchmarks.docs_section import write_section
from kernels import small_rows_linear
from kernels.cpu import cpu_kernels
from kernels.onednn_linear import onednn_available, onednn_linear, prepack
from kernels.panel_linear import pack_panels

# (name, out_features, in_features): SmolLM2-135M's linears (q/k/v and gate/up fused, as the
# engine runs them) and its tied lm_head.
SHAPES = [
    ("qkv", 960, 576),
    ("o", 576, 576),
    ("gate_up", 3072, 576),
    ("down", 576, 1536),
    ("lm_head", 49152, 576),
]
CACHE_BYTES = 256 * 2**20  # more than any last-level cache this runs on


def measure(rows_list: list[int], repeats: int) -> list[tuple[str, int, float, float, float, float, float, float]]:
    """(shape, rows, F.linear ms, W @ x^T path ms, oneDNN ms, row kernel ms, row kernel over the
    bf16-held weight ms, panel kernel ms) medians; the last three are nan without the compiled
    kernels."""
    compiled = cpu_kernels()
    results = []
    generator = torch.Generator().manual_seed(0)
    for name, n, k in SHAPES:
        copies = min(64, max(3, CACHE_BYTES // (n * k * 4)))  # 3 or more: the paths never share one
        weights = [torch.randn(n, k, generator=generator) for _ in range(copies)]
        packed = [prepack(w) for w in weights]
        # The same weights held in bf16, widened by the kernel as it reads them (a draft's, on
        # AVX2 CPUs: engine/worker/model_runner.py's draft_weight_format).
        halves = [w.bfloat16() for w in weights] if compiled is not None else []
        panels = [pack_panels(w) for w in weights] if compiled is not None else []
        for rows in rows_list:
            x = torch.randn(rows, k, generator=generator)
            paths = [lambda j: F.linear(x, weights[j]),  # (in the order of the result's columns)
                     lambda j: small_rows_linear.mkl_linear(x, weights[j]),
                     lambda j: onednn_linear(x, packed[j])]
            if compiled is not None:
                paths.append(lambda j: compiled.skinny_linear(x, weights[j]))
                paths.append(lambda j: compiled.skinny_linear(x, halves[j]))
                paths.append(lambda j: compiled.panel_linear(x, panels[j]))
            samples: list[list[float]] = [[] for _ in paths]
            calls = 0  # every call takes the next copy: none finds its weight in the cache
            with torch.inference_mode():
                for i in range(repeats + 2):  # two warm-up rounds
                    for path, times in zip(paths, samples):
                        j = calls % len(weights)
                        calls += 1
                        started = time.perf_counter()
                        path(j)
                        if i >= 2:
                            times.append(time.perf_counter() - started)
            medians = [1e3 * statistics.median(times) for times in samples]
            results.append((name, rows, *medians, *([float("nan")] * (6 - len(medians)))))
            print(f"{name} {rows} rows: " + " / ".join(f"{v:.3f}" for v in results[-1][2:]) + " ms", flush=True)
    return results


def table(results: list[tuple[str, int, float, float, float, float, float, float]], args: argparse.Namespace) -> str:
    used = "used" if small_rows_linear.skinny_enabled() else "not used"
    lines = [
        f"Medians of {args.repeats} calls, {args.threads} threads, weights cycled from memory; ms. W @ x^T: "
        "kernels/small_rows_linear.py's MKL fallback (2-32 rows as W @ x^T, else F.linear). Row kernel: "
        "kernels/cpu/skinny_linear.cpp over the weight as [N, K] (the engine's path for float32 weights "
        f"whose N is not a multiple of 16, up to {small_rows_linear.SKINNY_MAX_ROWS} rows, on AVX2 CPUs); bf16 "
        "weight: the same kernel over the weight held in bf16 and widened as it is read (float32 arithmetic; "
        "a draft's weights on AVX2 CPUs). Panel kernel: kernels/cpu/panel_linear.cpp over the weight held in "
        f"panels of 16 output channels, the engine's float32 path for every row count on AVX2 CPUs ({used} on "
        "this one).",
        "",
        "| linear | out x in | rows | F.linear ms | W @ x^T path ms | oneDNN prepacked ms | row kernel ms | "
        "row kernel, bf16 weight ms | panel kernel ms | row kernel / panel kernel | oneDNN / panel kernel |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    shapes = {name: (n, k) for name, n, k in SHAPES}
    for name, rows, linear, small_rows, onednn, skinny, skinny_bf16, panels in results:
        n, k = shapes[name]
        lines.append(f"| {name} | {n} x {k} | {rows} | {linear:.3f} | {small_rows:.3f} | {onednn:.3f} | "
                     f"{skinny:.3f} | {skinny_bf16:.3f} | {panels:.3f} | {skinny / panels:.2f}x | "
                     f"{onednn / panels:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,4,8,16,32,512")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--docs-section", default="cpu-linear-benchmark",
                        help="the docs/benchmarks.md section to write (one per machine worth keeping)")
    args = parser.parse_args(argv)
    if not onednn_available():
        raise SystemExit("this torch has no oneDNN: nothing to compare")
    torch.set_num_threads(args.threads)
    results = measure([int(r) for r in args.rows.split(",")], args.repeats)
    text = table(results, args)
    print(text)
    if args.write_docs:
        command = "python -m engine.benchmarks.cpu_linear " + " ".join(sys.argv[1:] if argv is None else argv)
        isa = torch.backends.cpu.get_cpu_capability()  # the widest vector ISA torch's kernels use here
        write_section(args.docs_section,
                      f"## float32 linears on the CPU ({isa}): F.linear, oneDNN prepacked, the row and panel kernels\n\n"
                      f"Command: `{command.strip()}`\n\nMachine: {platform.machine()} ({isa}), "
                      f"{os.cpu_count()} CPU threads, torch {torch.__version__}. Measured "
                      f"{time.strftime('%Y-%m-%d')}.\n\n{text}")


if __name__ == "__main__":
    main()
