from __future__ import annotations

import os
import sys

# triton_harness.py is shared by the Triton kernel tests; pytest's default import mode only puts
# each test file's own folder on sys.path, which is this one, but be explicit.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
