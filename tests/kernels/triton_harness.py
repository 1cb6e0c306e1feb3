"""Where the Triton kernel tests run: on CUDA when there is a device, else in Triton's
interpreter on the CPU (TRITON_INTERPRET=1 must be set before the first @triton.jit runs,
so test modules import this before any kernels.triton_* module)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
