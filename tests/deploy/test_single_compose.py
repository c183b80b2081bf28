"""The single-node compose file and the image, checked offline (no Docker engine here): the
admin key lives on a named volume, so recreating the api container keeps it; the API is
published on this machine's loopback only; the image says when it is healthy and starts
with its data directory writable by the user it runs as."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _api() -> tuple[dict[str, Any], dict[str, Any]]:
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return compose, compose["services"]["api"]


def test_the_admin_key_lives_on_a_named_volume_mounted_on_the_data_dir() -> None:
    compose, api = _api()
    data_dir = api["environment"]["QUEUE_SERVER_DATA_DIR"]
    mounts = dict(volume.split(":", 1) for volume in api.get("volumes", []))
    named = [name for name, target in mounts.items() if target.split(":")[0] == data_dir]
    assert named, f"{data_dir} is not a volume: the admin key is lost with the container"
    assert named[0] in compose["volumes"], "a bind mount or an undeclared volume"
    assert f"exec api cat {data_dir}/admin.key" in (ROOT / "docker-compose.yml").read_text()


def test_the_api_is_published_on_loopback_only() -> None:
    _, api = _api()
    for port in api["ports"]:
        assert str(port).startswith("127.0.0.1:"), port


def test_the_image_has_a_health_check_and_a_data_dir_its_user_owns() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^HEALTHCHECK .*\n?.*readyz", dockerfile, re.MULTILINE)
    user = re.search(r"^USER (\S+)", dockerfile, re.MULTILINE)
    assert user is not None
    data_dir = re.search(r"^ENV QUEUE_SERVER_DATA_DIR=(\S+)", dockerfile, re.MULTILINE)
    assert data_dir is not None
    assert f"chown {user.group(1)} {data_dir.group(1)}" in dockerfile
    _, api = _api()
    assert api["environment"]["QUEUE_SERVER_DATA_DIR"] == data_dir.group(1)
