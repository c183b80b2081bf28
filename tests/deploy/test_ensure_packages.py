"""deploy/ensure-debian-packages.sh: installed packages pass, missing ones are installed
as root or named with the command to install them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "ensure-debian-packages.sh"
MISSING = "queue-server-no-such-package"


def _as_unprivileged(argv: list[str]) -> list[str]:
    """As root, run the script as `nobody`, so a missing package is refused, not installed."""
    return ["runuser", "-u", "nobody", "--", *argv] if os.geteuid() == 0 else argv


def test_installed_packages_need_nothing() -> None:
    done = subprocess.run(
        _as_unprivileged([str(SCRIPT), "dpkg"]), capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_missing_package_without_root_is_named_with_the_install_command() -> None:
    done = subprocess.run(
        _as_unprivileged([str(SCRIPT), "dpkg", MISSING]),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    first, second = done.stderr.splitlines()[:2]
    assert first == f"error: missing Debian packages: {MISSING}"  # dpkg is installed
    assert second.endswith(
        f"install them as root: apt-get install -y --no-install-recommends {MISSING}"
    )
