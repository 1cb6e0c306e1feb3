"""A target step by row count in each CPU execution form of the embedded model, side by side.

    python -m engine.benchmarks.step_forms [--rows 16] [--rounds 3] [--write-docs] [--docs-section NAME]

A step here is what engine/worker/step_sweep.py times when speculation is built: a decode-like
forward over n rows (each its own sequence, one block of context) and the logits of every row
with their argmax, n = 1 .. --rows; each count's least over two passes, and the median over
--rounds rounds, the forms taking turns round by round so this machine's drift hits each alike.
The forms:

- float32: the engine's form for a float32 model here (oneDNN prepacked linears; on AVX2 CPUs
  panels and the one-call decoder stack);
- bfloat16: the engine's form for a bf16 model (oneDNN prepacked bf16, where the CPU runs bf16
  natively; skipped elsewhere);
- float32 over bf16-held / int8-held layers: float32 activations and KV with the decoder's
  weights held in bf16 or int8 and read by the compiled few-row kernel through the one-call
  stack (kernels/cpu/decoder_layers.cpp, where the kernels take held weights), the output head as
  in the float32 form. This is the form a draft takes (engine/worker/model_runner.py's
  draft_weight_format); the engine does not run a target so. It is here to show what a target
  step would cost in it: its one-row steps against the bf16 form's are the next lever for
  one-stream decoding on AVX512 CPUs (docs/kernels.md).
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
from engine.model.loader import load_model
from engine.model.quantization import prepare_draft_layers, prepare_for_inference
from engine.model.resolve import resolve_model
from engine.worker.kv_cache import KVCacheSpec
from engine.worker.step_sweep import sweep_step_seconds
from kernels.onednn_linear import onednn_bf16_available
from kernels.small_rows_linear import held_weights_enabled

BLOCK_SIZE = 16


def _forms() -> dict[str, torch.nn.Module]:
    """Each form's model, loaded once."""
    cpu = torch.device("cpu")
    resolved = resolve_model(None)
    forms = {"float32": load_model(resolved, torch.float32, cpu, progress=False, inference_only=True)[0]}
    if onednn_bf16_available():
        forms["bfloat16"] = load_model(resolved, torch.bfloat16, cpu, progress=False, inference_only=True)[0]
    if held_weights_enabled():
        for held in ("bf16", "int8"):
            model = load_model(resolved, torch.float32, cpu, progress=False)[0]
            prepare_draft_layers(model, cpu, held=held)  # the decoder's linears
            prepare_for_inference(model, None, cpu)  # the rest (the output head) as the float32 form has it
            model.eval()
            forms[f"float32 over {held}-held layers"] = model
    return forms


def measure(forms: dict[str, torch.nn.Module], max_rows: int, rounds: int) -> dict[str, dict[int, float]]:
    """Median seconds by row count, per form."""
    arch = next(iter(forms.values())).arch
    samples: dict[str, list[dict[int, float]]] = {name: [] for name in forms}
    for round_index in range(rounds):
        names = list(forms)
        names = names[round_index % len(names):] + names[:round_index % len(names)]  # (turns rotate)
        for name in names:
            model = forms[name]
            dtype = model.embed_tokens.weight.dtype  # (the activations' and the KV's)
            spec = KVCacheSpec(num_layers=arch.num_hidden_layers, num_kv_heads=arch.num_key_value_heads,
                               head_dim=arch.head_dim, block_size=BLOCK_SIZE, dtype=dtype)
            samples[name].append(sweep_step_seconds(model, spec, torch.device("cpu"), max_rows))
            print(f"round {round_index + 1}: {name} done", flush=True)
    return {name: {n: statistics.median(r[n] for r in rs) for n in rs[0]} for name, rs in samples.items()}


def table(results: dict[str, dict[int, float]]) -> str:
    names = list(results)
    base = "bfloat16" if "bfloat16" in results else "float32"
    lines = ["| rows | " + " | ".join(f"{name} ms" for name in names) + " | "
             + " | ".join(f"{name} / {base}" for name in names if name != base) + " |",
             "|---:|" + "---:|" * (2 * len(names) - 1)]
    for n in sorted(results[names[0]]):
        cells = [f"{results[name][n] * 1e3:.1f}" for name in names]
        ratios = [f"{results[name][n] / results[base][n]:.2f}x" for name in names if name != base]
        lines.append(f"| {n} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=16, help="row counts swept: 1 .. this")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--docs-section", default="step-forms-benchmark",
                        help="the docs/benchmarks.md section to write (one per machine worth keeping)")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.rounds < 1:
        raise SystemExit("--rows and --rounds must be at least 1")
    torch.set_num_threads(args.threads)
    results = measure(_forms(), args.rows, args.rounds)
    text = table(results)
    print(text)
    if args.write_docs:
        command = "python -m engine.benchmarks.step_forms " + " ".join(sys.argv[1:] if argv is None else argv)
        isa = torch.backends.cpu.get_cpu_capability()
        bf16 = "native bf16" if onednn_bf16_available() else "no native bf16"
        write_section(args.docs_section, (
            f"## A target step by row count in each CPU execution form\n\nCommand: `{command.strip()}`\n\n"
            f"Machine: {platform.machine()} ({isa}, {bf16}), {args.threads} of {os.cpu_count()} CPU threads, torch "
            f"{torch.__version__}. Measured {time.strftime('%Y-%m-%d')}.\n\n"
            "The embedded model (SmolLM2-135M, 30 layers); ms of a decode-like forward over n rows and their "
            "logits and argmax (engine/worker/step_sweep.py), each count's least of two passes, the median over "
            f"{args.rounds} rounds, the forms taking turns. The held forms are a draft's (float32 activations and KV, "
            "the decoder's weights held in bf16 or int8 and read by the compiled few-row kernel in one call per "
            "step, the output head as in the float32 form); the engine does not run a target in them.\n\n"
            f"{text}"))


if __name__ == "__main__":
    main()
