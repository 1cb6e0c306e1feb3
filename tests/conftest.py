from __future__ import annotations

import os

import pytest
import torch

# Without CUDA, Triton kernels are tested in Triton's interpreter, and TRITON_INTERPRET must be
# set before triton is first imported by any test module (engine modules import kernels.triton_*;
# set only in tests/kernels/triton_harness.py, a run of tests/engine/model before
# tests/kernels/test_triton_kv_store.py failed in the interpreter).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    run_slow = os.environ.get("DRAFTGATE_SLOW") == "1"
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        if "slow" in item.keywords and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: set DRAFTGATE_SLOW=1"))
