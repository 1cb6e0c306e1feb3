"""`python -m drafts ...`: see drafts/cli.py."""

from __future__ import annotations

import sys

from drafts.cli import main

sys.exit(main())
