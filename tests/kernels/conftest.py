from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


@pytest.fixture(scope="session")
def portable(tmp_path_factory: pytest.TempPathFactory) -> CpuKernels:
    """The same kernels built with DRAFTGATE_PORTABLE (no intrinsics: the plain loops), built once
    per session into a temporary cache, for the tests that compare it bit for bit with the
    native build (skipped where the native build is unavailable)."""
    if cpu_kernels() is None:
        pytest.skip(f"compiled CPU kernels unavailable: {unavailable_reason()}")
    build_script = Path(__file__).resolve().parents[2] / "kernels" / "cpu" / "build.py"
    cache_dir = tmp_path_factory.mktemp("portable-kernels")
    command = [sys.executable, str(build_script), "--cache-dir", str(cache_dir), "--flag=-DDRAFTGATE_PORTABLE"]
    path = json.loads(subprocess.run(command, capture_output=True, text=True, check=True, timeout=600).stdout)["path"]
    return CpuKernels(Path(path))
