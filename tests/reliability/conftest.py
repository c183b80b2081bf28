"""Make the top-level ``reliability`` package importable from a plain ``pytest`` run.

The install holds only ``queue_server``; the harness lives beside it at the repository
root and is never installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
