"""The GPU benchmark script runs end to end in its CPU dry-run mode (tiny shapes, Triton
interpreter), so that it cannot rot on machines without a GPU; and its byte accounting is right."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any Triton kernel module is imported
pytest.importorskip("triton")

from engine.benchmarks import gpu  # noqa: E402


def test_dry_run_prints_every_section() -> None:
    report = gpu.main(["--dry-run"])
    assert "Decode attention" in report and "Weight-only matmuls" in report and "Batch-1 decode" in report
    for fmt in ("| int8 |", "| int4 |", "| bf16 |"):
        assert fmt in report.split("Batch-1 decode")[1]
    attention = report.split("Decode attention")[1].split("Weight-only matmuls")[0]
    assert attention.count("| fp8 |") == len(gpu.TINY.batches) * len(gpu.TINY.contexts)


def test_bytes_read_per_token_counts_stored_forms() -> None:
    from engine.model.quantization import prepare_for_inference

    shapes = gpu.TINY
    model, arch = gpu.random_model(shapes, torch.device("cpu"))
    linear_params = sum(n * k for n, k in gpu.layer_shapes(shapes).values()) * shapes.layers
    norms = shapes.layers * (2 * shapes.hidden + 2 * shapes.head_dim) + shapes.hidden
    bf16 = gpu.bytes_read_per_token(model)
    assert bf16 == 2 * (linear_params + norms + shapes.vocab * shapes.hidden + shapes.hidden)
    prepare_for_inference(model, "int8", torch.device("cpu"))
    int8 = gpu.bytes_read_per_token(model)
    # int8 weights (1 byte) plus scales (bf16 on the CPU, one per output row) for linears and the head.
    rows = sum(n for n, _ in gpu.layer_shapes(shapes).values()) * shapes.layers + shapes.vocab
    assert int8 == linear_params + shapes.vocab * shapes.hidden + 2 * rows + 2 * (norms + shapes.hidden)
