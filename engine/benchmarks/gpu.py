"""GPU benchmark of the Triton kernels and quantized decode, as fractions of the memory bandwidth
measured on the same device in the same run. One command, a few minutes on an H200; the table
is printed last.

    python -m engine.benchmarks.gpu [--write-docs]      # on a CUDA device
    python -m engine.benchmarks.gpu --dry-run           # tiny shapes on the CPU (Triton interpreter)

1. Ceiling: the best of a device copy and a device reduction over 4 GiB (bytes moved / time).
2. Decode attention (kernels/triton_paged_attention.py) at Qwen3-32B's attention geometry
   (64 query heads, 8 kv heads, head_dim 128, 16-token blocks, scattered block ids) for several
   context lengths and batch sizes, bf16 and fp8 caches: KV bytes read per call / time.
3. Weight-only matmuls (kernels/triton_quant_matmul.py) at Qwen3-32B's layer shapes (qkv, o,
   gate_up, down) for M = 1..16, against torch's bf16 F.linear: weight bytes / time.
4. End-to-end batch-1 decode of a random-weight Qwen3-32B-shaped model (64 layers) in bf16, int8
   and int4: one token per step at a fixed context, the forward plus the lm_head captured in a
   CUDA graph; tokens/s against the ceiling's tokens/s, (weights + KV read per token) / bandwidth.

Every timed call cycles through enough copies of its operands to exceed the L2 cache several
times, so bandwidth is HBM bandwidth, and runs inside a CUDA graph, so host launch overhead is
not measured (the engine's own step adds it; that is the runner's business, not the kernels').
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.benchmarks.docs_section import write_section



@dataclass(frozen=True)
class Shapes:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int
    contexts: tuple[int, ...]
    batches: tuple[int, ...]
    ms: tuple[int, ...]
    e2e_context: int
    ceiling_bytes: int


QWEN3_32B = Shapes(hidden=5120, intermediate=25600, heads=64, kv_heads=8, head_dim=128, layers=64, vocab=151936,
                   contexts=(1024, 4096, 16384, 65536), batches=(1, 16), ms=(1, 2, 4, 8, 16), e2e_context=1024,
                   ceiling_bytes=4 << 30)
TINY = Shapes(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, layers=2, vocab=256,
              contexts=(40,), batches=(1, 2), ms=(2,), e2e_context=24, ceiling_bytes=1 << 20)


# ---- timing -------------------------------------------------------------------------------------
def copies_for(bytes_per_call: int, device: torch.device, memory_cap: int = 8 << 30) -> int:
    """Operand copies to cycle through so one cycle reads 4x the L2 cache (1 on the CPU)."""
    if device.type != "cuda":
        return 1
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
    wanted = math.ceil(4 * l2 / max(1, bytes_per_call))
    return max(1, min(wanted, 64, memory_cap // max(1, bytes_per_call)))


def seconds_per_call(calls: list[Callable[[], object]], device: torch.device, min_calls: int = 64) -> float:
    """Median seconds per call over several timings of `calls` run in turn."""
    for call in calls:  # warm-up: Triton compiles, allocators settle
        call()
    cycles = max(1, math.ceil(min_calls / len(calls)))
    if device.type != "cuda":
        samples = []
        for _ in range(3):
            started = time.perf_counter()
            for call in calls:
                call()
            samples.append((time.perf_counter() - started) / len(calls))
        return statistics.median(samples)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(cycles):
            for call in calls:
                call()
    graph.replay()
    samples = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1000 / (cycles * len(calls)))
    del graph
    return statistics.median(samples)


# ---- 1. ceiling ---------------------------------------------------------------------------------
def bandwidth_ceiling(shapes: Shapes, device: torch.device) -> float:
    """Bytes/s: the better of a copy (read + write) and a sum (read) over ceiling_bytes."""
    numel = shapes.ceiling_bytes // 2
    src = torch.ones(numel, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    copy = seconds_per_call([lambda: dst.copy_(src)], device, min_calls=8)
    total = torch.empty((), dtype=torch.float32, device=device)
    read = seconds_per_call([lambda: torch.sum(src, dim=0, dtype=torch.float32, out=total)], device, min_calls=8)
    del src, dst
    return max(2 * shapes.ceiling_bytes / copy, shapes.ceiling_bytes / read)


# ---- 2. decode attention ------------------------------------------------------------------------
def bench_attention(shapes: Shapes, device: torch.device, ceiling: float) -> list[list[str]]:
    from kernels.triton_attention_plan import plan_attention_triton
    from kernels.triton_paged_attention import paged_attention_triton

    rows = []
    block_size = 16
    for kv_dtype in ("bf16", "fp8"):
        for batch in shapes.batches:
            for context in shapes.contexts:
                blocks_per_req = math.ceil(context / block_size)
                num_blocks = batch * blocks_per_req
                element = 1 if kv_dtype == "fp8" else 2
                kv_bytes = 2 * batch * context * shapes.kv_heads * (shapes.head_dim * element + (4 if kv_dtype == "fp8" else 0))
                calls = []
                for copy in range(copies_for(kv_bytes, device)):
                    cache_shape = (num_blocks, shapes.kv_heads, block_size, shapes.head_dim)
                    k = torch.randn(cache_shape, device=device, dtype=torch.bfloat16)
                    v = torch.randn(cache_shape, device=device, dtype=torch.bfloat16)
                    k_scale = v_scale = None
                    if kv_dtype == "fp8":
                        k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
                        k_scale = torch.full(cache_shape[:3], 0.01, device=device)
                        v_scale = torch.full(cache_shape[:3], 0.01, device=device)
                    table = torch.randperm(num_blocks, device=device).to(torch.int32).view(batch, blocks_per_req)
                    q = torch.randn(batch, shapes.heads, shapes.head_dim, device=device, dtype=torch.bfloat16)
                    plan = plan_attention_triton(list(range(batch + 1)), [context] * batch, shapes.heads,
                                                 shapes.kv_heads, None, device)
                    calls.append(lambda q=q, k=k, v=v, t=table, p=plan, ks=k_scale, vs=v_scale:
                                 paged_attention_triton(q, k, v, t, shapes.head_dim ** -0.5, p, ks, vs))
                seconds = seconds_per_call(calls, device)
                rows.append([kv_dtype, str(batch), str(context), str(plan.num_splits), f"{seconds * 1e6:.1f}",
                             f"{kv_bytes / seconds / 1e9:.0f}", f"{100 * kv_bytes / seconds / ceiling:.0f}%"])
                del calls
    return rows


# ---- 3. weight-only matmuls ---------------------------------------------------------------------
def layer_shapes(shapes: Shapes) -> dict[str, tuple[int, int]]:  # name -> (N, K)
    q, kv = shapes.heads * shapes.head_dim, shapes.kv_heads * shapes.head_dim
    return {"qkv": (q + 2 * kv, shapes.hidden), "o": (shapes.hidden, q),
            "gate_up": (2 * shapes.intermediate, shapes.hidden), "down": (shapes.hidden, shapes.intermediate)}


def bench_matmuls(shapes: Shapes, device: torch.device, ceiling: float) -> list[list[str]]:
    import torch.nn.functional as F

    from kernels.quant_ref import int4_group_size_for, quantize_fp8, quantize_int4, quantize_int8
    from kernels.triton_quant_matmul import fp8_linear_triton, int4_linear_triton, int8_linear_triton

    rows = []
    for name, (n, k) in layer_shapes(shapes).items():
        weight = torch.randn(n, k, device=device) * 0.02
        group = int4_group_size_for(k)
        # format -> (stored tensors, bytes read per call, matmul over x and those tensors)
        formats: dict[str, tuple[tuple[torch.Tensor, ...], int, Callable[..., torch.Tensor]]] = {
            "bf16 (torch)": ((weight.bfloat16(),), 2 * n * k, lambda x, w: F.linear(x, w)),
            "int8": (quantize_int8(weight), n * k + 4 * n, int8_linear_triton),
            "int4": (quantize_int4(weight, group), n * k // 2 + 8 * n * (k // group),
                     lambda x, q, s, z: int4_linear_triton(x, q, s, z, group)),
            "fp8": (quantize_fp8(weight), n * k + 4 * n, fp8_linear_triton),
        }
        del weight
        for fmt, (stored, weight_bytes, matmul) in formats.items():
            # Distinct copies of the weights so that a cycle of calls does not run from L2.
            copies = [stored] + [tuple(t.clone() for t in stored) for _ in range(copies_for(weight_bytes, device) - 1)]
            for m in shapes.ms:
                calls = [lambda w=w, x=torch.randn(m, k, device=device, dtype=torch.bfloat16), f=matmul: f(x, *w)
                         for w in copies]
                seconds = seconds_per_call(calls, device)
                rows.append([name, f"{n}x{k}", fmt, str(m), f"{seconds * 1e6:.1f}",
                             f"{weight_bytes / seconds / 1e9:.0f}", f"{100 * weight_bytes / seconds / ceiling:.0f}%"])
            del copies
    return rows


# ---- 4. end-to-end decode -----------------------------------------------------------------------
def random_model(shapes: Shapes, device: torch.device):
    from engine.model.arch_config import ArchConfig
    from engine.model.llama import LlamaForCausalLM

    arch = ArchConfig(architecture="Qwen3ForCausalLM", vocab_size=shapes.vocab, hidden_size=shapes.hidden,
                      intermediate_size=shapes.intermediate, num_hidden_layers=shapes.layers,
                      num_attention_heads=shapes.heads, num_key_value_heads=shapes.kv_heads, head_dim=shapes.head_dim,
                      rms_norm_eps=1e-6, rope_theta=1e6, rope_scaling=None, max_position_embeddings=40960,
                      tie_word_embeddings=False, attention_bias=False, qk_norm=True, sliding_window=None,
                      hidden_act="silu", bos_token_id=None, eos_token_ids=(0,))
    dtype = torch.bfloat16
    model = LlamaForCausalLM(arch, dtype=dtype, device=device, max_positions=shapes.e2e_context + 16)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.fill_(1.0) if "norm" in name else param.normal_(0.0, 0.02)
    return model.eval(), arch


def bytes_read_per_token(model: torch.nn.Module) -> int:
    """Weight bytes one decode step reads: each linear in its stored form, the norms, the lm_head
    and one embedding row (a lookup, not a matmul)."""
    from engine.model.layers.quant_linear import _ExecutionLinear
    from engine.model.layers.rotary import RotaryEmbedding
    from engine.model.layers.vocab_embedding import VocabEmbedding
    from engine.model.quantization import _HeadWithWeight

    total = 0
    for module in model.modules():
        if isinstance(module, _HeadWithWeight):
            continue  # its .weight is the embedding's, kept for readers; its inner module is what runs
        if isinstance(module, VocabEmbedding):
            total += module.weight.shape[1] * module.weight.element_size()
        elif isinstance(module, _ExecutionLinear):
            total += module.stored_bytes()
        elif not isinstance(module, RotaryEmbedding):
            total += sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
    return total


def bench_decode(shapes: Shapes, device: torch.device, ceiling: float) -> list[list[str]]:
    from engine.model.attention_metadata import AttentionMetadata
    from engine.model.quantization import prepare_for_inference
    from engine.worker.kv_cache import KVCacheSpec, allocate_kv_caches

    rows = []
    for method in (None, "int8", "int4"):
        model, arch = random_model(shapes, device)
        prepare_for_inference(model, method, device)
        context, block_size = shapes.e2e_context, 16
        num_blocks = math.ceil(context / block_size)
        spec = KVCacheSpec(arch.num_hidden_layers, arch.num_key_value_heads, arch.head_dim, block_size, torch.bfloat16)
        caches = allocate_kv_caches(spec, num_blocks, device)
        meta = AttentionMetadata.build(query_lens=[1], seq_lens=[context], block_ids=[list(range(num_blocks))],
                                       block_size=block_size, device=device)
        ids = torch.zeros(1, dtype=torch.int64, device=device)
        positions = torch.full((1,), context - 1, dtype=torch.int64, device=device)

        def step(model=model, caches=caches, meta=meta, ids=ids, positions=positions) -> torch.Tensor:
            return model.compute_logits(model(ids, positions, caches, meta))

        with torch.inference_mode():
            step()  # compiles kernels and fills meta.plans (the per-step host work, outside the graph)
            seconds = seconds_per_call([step], device, min_calls=16)
        token_bytes = bytes_read_per_token(model) + spec.bytes_per_block * num_blocks
        ceiling_tps = ceiling / token_bytes
        rows.append([method or "bf16", f"{token_bytes / 1e9:.2f}", f"{1 / seconds:.1f}", f"{ceiling_tps:.1f}",
                     f"{100 / seconds / ceiling_tps:.0f}%"])
        del model, caches, step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


# ---- report -------------------------------------------------------------------------------------
def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (Triton interpreter)")
    parser.add_argument("--skip", default="", help="comma-separated sections to skip: attention,matmul,decode")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args(argv)
    if args.dry_run:
        device, shapes = torch.device("cpu"), TINY
        # Must precede the first import of a Triton kernel module (the @triton.jit decorators).
        os.environ.setdefault("TRITON_INTERPRET", "1")
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: run with --dry-run for the CPU smoke test")
        device, shapes = torch.device("cuda"), QWEN3_32B
    skip = set(filter(None, args.skip.split(",")))
    started = time.perf_counter()
    ceiling = bandwidth_ceiling(shapes, device)
    print(f"bandwidth ceiling: {ceiling / 1e9:.0f} GB/s", flush=True)
    sections = []
    if "attention" not in skip:
        rows = bench_attention(shapes, device, ceiling)
        sections.append("Decode attention (goal: >= 85% of the ceiling at long contexts)\n\n" + markdown(
            ["kv", "batch", "context", "splits", "us", "GB/s", "of ceiling"], rows))
        print(sections[-1], flush=True)
    if "matmul" not in skip:
        rows = bench_matmuls(shapes, device, ceiling)
        sections.append("Weight-only matmuls (goal: int4 >= 70% of the ceiling for M <= 16)\n\n" + markdown(
            ["layer", "N x K", "weights", "M", "us", "GB/s", "of ceiling"], rows))
        print(sections[-1], flush=True)
    if "decode" not in skip:
        rows = bench_decode(shapes, device, ceiling)
        sections.append("Batch-1 decode, random-weight model (goal: >= 75% of the ceiling)\n\n" + markdown(
            ["weights", "GB read / token", "tokens/s", "ceiling tokens/s", "of ceiling"], rows))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
    report = (f"Device: {name}; torch {torch.__version__}; measured ceiling {ceiling / 1e9:.0f} GB/s; "
              f"{time.perf_counter() - started:.0f} s.\n\n" + "\n\n".join(sections))
    print("\n" + report)
    if args.write_docs:
        write_docs(report)
    return report


def write_docs(report: str) -> None:
    write_section("gpu-benchmark",
                  f"## GPU kernels and quantized decode\n\nCommand: `.venv/bin/python -m engine.benchmarks.gpu "
                  f"--write-docs`. Measured {time.strftime('%Y-%m-%d')}.\n\n{report}")


if __name__ == "__main__":
    main()
