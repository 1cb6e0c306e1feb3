"""Fixtures of the drafts tests (helpers live in draft_harness.py)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from draft_harness import write_tiny_target  # noqa: E402

from drafts.target import Target, load_target  # noqa: E402


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_tiny_target(tmp_path_factory.mktemp("tiny_target") / "tiny-llama"))


@pytest.fixture(scope="session")
def tiny_target(tiny_target_dir: str) -> Target:
    return load_target(tiny_target_dir, device=torch.device("cpu"), progress=False)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # 2 shared cores: one thread is faster than two fighting other jobs, and results stay
    # bitwise reproducible within a test.
    torch.set_num_threads(1)
