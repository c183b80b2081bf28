"""deploy/ensure-debian-packages.sh: installed packages pass, missing ones are installed
as root or named with the command to install them."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "ensure-debian-packages.sh"
MISSING = "queue-server-no-such-package"


def _as_unprivileged(argv: list[str]) -> list[str]:
    """As root, run the script as `nobody`, so a missing package is refused, not installed;
    from a copy `nobody` can reach (the checkout may sit under a 0700 directory)."""
    if os.geteuid() != 0:
        return argv
    place = Path(tempfile.mkdtemp(prefix="qs-ensure-", dir="/tmp"))
    place.chmod(0o755)
    atexit.register(shutil.rmtree, place, True)
    script = place / SCRIPT.name
    shutil.copy(SCRIPT, script)
    script.chmod(0o755)
    return ["runuser", "-u", "nobody", "--", str(script), *argv[1:]]


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
