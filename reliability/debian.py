"""Debian packages some scenarios need (``faketime``, PostgreSQL 15), installed when
missing by the project's own script, ``deploy/ensure-debian-packages.sh`` (apt-get as
root; a clear error naming the packages otherwise)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from reliability.cluster import say

__all__ = ["ENSURE_SCRIPT", "ensure_packages"]

ENSURE_SCRIPT = Path(__file__).resolve().parents[1] / "deploy" / "ensure-debian-packages.sh"


def ensure_packages(*packages: str) -> str | None:
    """Install whichever of ``packages`` is missing; None when all are installed, else
    the script's explanation of why they are not."""
    try:
        done = subprocess.run(
            [str(ENSURE_SCRIPT), *packages],
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not run {ENSURE_SCRIPT.name}: {exc}"
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if done.returncode == 0:
        if lines:
            say(f"installed Debian packages: {' '.join(packages)}")
        return None
    errors = [line.strip() for line in lines if line.lstrip().startswith(("error", "E:"))]
    return "; ".join(errors or lines[-3:]) or f"{ENSURE_SCRIPT.name} exited {done.returncode}"
