"""The gateway process never loads torch: it talks to the engine process over a socket."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_gateway_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "import gateway.cli, gateway.app, engine.protocol, engine.async_engine, engine.model.tokenizer\n"
        "assert 'torch' not in sys.modules, 'the gateway pulled in torch'\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
