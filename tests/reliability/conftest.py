"""Make the top-level ``reliability`` package importable from a plain ``pytest`` run.

The editable install maps only ``queue_server``, ``cli`` and ``migrations``; the
harness lives beside them at the repository root.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
