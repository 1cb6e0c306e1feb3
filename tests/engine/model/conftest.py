from __future__ import annotations

import os
import sys

# model_harness.py is shared by the tests here and in loader/ and layers/; pytest's default
# import mode only puts each test file's own folder on sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
