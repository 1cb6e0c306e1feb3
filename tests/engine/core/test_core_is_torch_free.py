from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_engine_core_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "import engine.core.scheduler, engine.core.block_hash, engine.core.block_pool\n"
        "import engine.core.kv_cache_manager, engine.core.scheduler_output\n"
        "import engine.core.model_runner_output, engine.core.stats\n"
        "assert 'engine.core.scheduler' in sys.modules\n"
        "assert 'torch' not in sys.modules, 'engine.core pulled in torch'\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
