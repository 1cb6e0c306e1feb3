"""Quantized execution on the CPU: perplexity and decode speed of each weight format, side by side
in one run against float32.

    python -m engine.benchmarks.quant [--rounds 3] [--decode-tokens 64] [--ppl-tokens 1024] [--write-docs]

Rows (the embedded SmolLM2-135M-Instruct, 2 threads):
- float32 plain: float32 weights through F.linear (kernels/small_rows_linear.py; the engine's path
  where oneDNN is missing);
- float32: the engine's float32 on CPUs, linears prepacked for oneDNN (the reference of the ratios);
- bfloat16 plain: F.linear on bf16 weights (what the engine did before prepacking);
- bfloat16: the engine's default on CPUs with native bf16 (AMX, AVX512-BF16), linears prepacked for oneDNN;
- int8 / int4 / fp8: weight-only quantization at load, bf16 activations (--quantization).

Perplexity: one forward over the first --ppl-tokens tokens of text that every machine has and
nothing downloads: the docstrings of a few Python standard-library modules. Decode: tokens/s of one stream (a 32-token prompt, --decode-tokens
greedy tokens, timed first to last token), of 8 streams decoding together (aggregate), and the
offline benchmark's throughput workload (engine/benchmarks/offline.py) at a smaller size.
Configurations are measured in interleaved rounds (the machine is shared) and the medians
reported, each with its ratio to float32 from the same run. With --write-docs the table replaces
its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import platform
import statistics
import sys
import sysconfig
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.benchmarks.docs_section import write_section

HELD_OUT_MODULES = ("textwrap.py", "argparse.py", "json/__init__.py", "shlex.py", "fractions.py")


@dataclass
class Config:
    name: str
    dtype: str
    quantization: str | None = None
    prepack: bool = True
    timed: bool = True  # fp8 has no CPU kernel (dequantize + F.linear every call): perplexity only
    perplexity: float = float("nan")
    single: list[float] = field(default_factory=list)
    batched: list[float] = field(default_factory=list)
    throughput: list[float] = field(default_factory=list)


CONFIGS = [
    Config("float32 plain", "float32", prepack=False),
    Config("float32", "float32"),
    Config("bfloat16 plain", "bfloat16", prepack=False),
    Config("bfloat16", "bfloat16"),
    Config("int8", "bfloat16", "int8"),
    Config("int4", "bfloat16", "int4"),
    Config("fp8", "bfloat16", "fp8", timed=False),
]


def held_out_text() -> str:
    """Docstrings of a few standard-library modules, in file order."""
    stdlib = sysconfig.get_paths()["stdlib"]
    parts: list[str] = []
    for module in HELD_OUT_MODULES:
        with open(os.path.join(stdlib, module), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc:
                    parts.append(doc)
    return "\n\n".join(parts)


@contextmanager
def _prepack(enabled: bool):
    """Switches the CPU oneDNN prepack off for a 'plain' row (benchmark-only, so that the gain of
    prepacking is measured in the same run)."""
    from engine.model import quantization

    original = quantization.onednn_available
    if not enabled:
        quantization.onednn_available = lambda: False
    try:
        yield
    finally:
        quantization.onednn_available = original


def perplexity(config: Config, token_ids: list[int], model_path: str | None) -> float:
    from engine.model.attention_metadata import AttentionMetadata
    from engine.model.loader import load_model
    from engine.model.resolve import resolve_model
    from engine.worker.kv_cache import KVCacheSpec, allocate_kv_caches

    dtype = getattr(torch, config.dtype)
    with _prepack(config.prepack):
        model, arch = load_model(resolve_model(model_path), dtype, "cpu", progress=False,
                                 quantization=config.quantization, inference_only=True)
    n, block_size = len(token_ids), 16
    num_blocks = (n + block_size - 1) // block_size
    spec = KVCacheSpec(arch.num_hidden_layers, arch.num_key_value_heads, arch.head_dim, block_size, dtype)
    caches = allocate_kv_caches(spec, num_blocks, torch.device("cpu"))
    meta = AttentionMetadata.build(query_lens=[n], seq_lens=[n], block_ids=[list(range(num_blocks))],
                                   block_size=block_size, device="cpu")
    with torch.inference_mode():
        hidden = model(torch.tensor(token_ids), torch.arange(n), caches, meta)
        logits = model.compute_logits(hidden[:-1])  # [n - 1, vocab] float32
        nll = F.cross_entropy(logits, torch.tensor(token_ids[1:]))
    return math.exp(nll.item())


def decode_tokens_per_second(llm, num_streams: int, num_tokens: int) -> float:
    """Aggregate decode tokens/s of num_streams requests started together, first to last token."""
    from engine.protocol import AddRequest
    from engine.sampling_params import SamplingParams

    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    for i in range(num_streams):
        engine.add_request(AddRequest(f"decode-{time.monotonic_ns()}-{i}", list(range(1000 + i, 1032 + i)), params,
                                      time.monotonic()))
    first = last = None
    produced = 0
    while engine.has_unfinished_requests():
        deltas = engine.step()
        new = sum(len(d.new_token_ids) for d in deltas)
        if new:
            now = time.perf_counter()
            if first is None:
                first = now
                new -= num_streams  # the prefill's tokens start the clock
            last = now
            produced += new
    assert first is not None and last is not None
    return produced / (last - first)


def run(args: argparse.Namespace) -> list[Config]:
    from engine.benchmarks.offline import make_workload, run_draftgate
    from engine.llm import LLM
    from engine.model.resolve import resolve_model
    from engine.model.tokenizer import load_tokenizer

    torch.set_num_threads(args.threads)
    configs = [c for c in CONFIGS if args.configs is None or c.name in args.configs.split(",")]
    token_ids = load_tokenizer(resolve_model(args.model)).encode(held_out_text())[: args.ppl_tokens]
    for config in configs:
        config.perplexity = perplexity(config, token_ids, args.model)
        print(f"{config.name}: perplexity {config.perplexity:.4f}", flush=True)
    llms = {}
    timed = [c for c in configs if c.timed]
    workload = None
    for config in timed:
        with _prepack(config.prepack):
            llms[config.name] = LLM(args.model, dtype=config.dtype, quantization=config.quantization,
                                    num_threads=args.threads, kv_cache_memory="512MiB")
        decode_tokens_per_second(llms[config.name], 1, 4)  # warm-up
        if workload is None and args.throughput_requests:
            workload = make_workload(args.throughput_requests, 32, 128, llms[config.name].engine.vocab_size, seed=0)
    for round_index in range(args.rounds):
        for config in timed:
            llm = llms[config.name]
            config.single.append(decode_tokens_per_second(llm, 1, args.decode_tokens))
            config.batched.append(decode_tokens_per_second(llm, 8, args.decode_tokens))
            if workload is not None:
                llm.reset_prefix_cache()
                config.throughput.append(workload.num_output_tokens / run_draftgate(llm, workload))
        print(f"round {round_index + 1}/{args.rounds} done", flush=True)
    return configs


def _median_cell(values: list[float], base: list[float]) -> tuple[str, str]:
    if not values or not base:
        return "-", "-"
    value = statistics.median(values)
    return f"{value:.1f}", f"{value / statistics.median(base):.2f}x"


def table(configs: list[Config], args: argparse.Namespace) -> str:
    base = next((c for c in configs if c.name == "float32"), configs[0])
    lines = [
        f"Perplexity: docstrings of {', '.join(HELD_OUT_MODULES)} from this Python's standard library, first "
        f"{args.ppl_tokens} tokens, one forward. Decode: a 32-token prompt, {args.decode_tokens} greedy tokens, "
        "timed first to last token; 8 streams: aggregate. Throughput: the offline benchmark's workload "
        f"({args.throughput_requests} requests, prompt and output lengths 32-128, all at once). "
        f"Threads: {args.threads}; medians of {args.rounds} interleaved rounds; ratios against float32 in the same "
        "run. Weight formats apply to every linear and the lm_head (int4: group 32 for this GGUF model, "
        "lm_head int8); activations bf16. fp8 has no CPU kernel (perplexity only).",
        "",
        "| weights | perplexity | vs float32 | decode 1 stream tok/s | ratio | decode 8 streams tok/s | ratio "
        "| throughput tok/s | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in configs:
        cells = [*_median_cell(c.single, base.single), *_median_cell(c.batched, base.batched),
                 *_median_cell(c.throughput, base.throughput)]
        lines.append(f"| {c.name} | {c.perplexity:.3f} | {100 * (c.perplexity / base.perplexity - 1):+.1f}% | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_docs(text: str, args: argparse.Namespace) -> None:
    machine = f"{platform.machine()}, {os.cpu_count()} CPU threads, torch {torch.__version__}"
    write_section("quant-benchmark",
                  f"## Quantized execution on the CPU: perplexity and decode\n\n"
                  f"Command: `.venv/bin/python -m engine.benchmarks.quant {' '.join(args.argv)}`\n\n"
                  f"Machine: {machine}. Measured {time.strftime('%Y-%m-%d')}.\n\n{text}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--configs", default=None,
                        help=f"comma-separated subset of: {', '.join(c.name for c in CONFIGS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--ppl-tokens", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--throughput-requests", type=int, default=16, help="0: skip the throughput column")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    configs = run(args)
    text = table(configs, args)
    print(text)
    if args.write_docs:
        write_docs(text, args)


if __name__ == "__main__":
    main()
