"""Progress lines on stderr, stamped with the time since the run began."""

from __future__ import annotations

import sys
import time

_T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)
