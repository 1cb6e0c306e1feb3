from __future__ import annotations

import os
import sys

# triton_harness.py is shared by the Triton kernel tests; pytest's default import mode only puts
# each test file's own folder on sys.path, which is this one, but be explicit.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


import pytest  # noqa: E402

from kernels.cpu import CpuKernels, cpu_kernels, unavailable_reason  # noqa: E402


@pytest.fixture(scope="module")
def compiled() -> CpuKernels:
    """The compiled CPU kernels (kernels/cpu); the test is skipped where they did not build."""
    loaded = cpu_kernels()
    if loaded is None:
        pytest.skip(f"compiled CPU kernels unavailable: {unavailable_reason()}")
    return loaded
