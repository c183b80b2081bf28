"""The command line on the server's machine finds the server that runs there: the one
`serve --data-dir X` started (`make serve ARGS="--data-dir X"`), without --data-dir, and
never a `server.url` left by a server that stopped, which may name another server now."""

from __future__ import annotations

from pathlib import Path

import pytest

from queue_server.infra.address import local_url, published, serving
from tests.helpers.api import Api
from tests.helpers.serving import Served, environment, open_dir, run


def _data_dir(env: dict[str, str]) -> Path:
    done = run("data-dir", env=env)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def _tenants(env: dict[str, str], *args: str) -> tuple[int, str]:
    done = run("tenants", "list", "--json", *args, env=env)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_cli_finds_the_server_started_with_a_data_dir_and_never_a_stale_address(
    api: Api, admin_key: str
) -> None:
    with open_dir("qs-served-") as root:
        # A user's machine: nothing set but a home (and, as root, a default data directory
        # under it: an older version's, used while /var/lib/queue-server does not exist).
        env = {
            k: v
            for k, v in environment(HOME=str(root / "home")).items()
            if not k.startswith(("QUEUE_SERVER_", "XDG_"))
        }
        home_default = root / "home" / ".local" / "share" / "queue-server"
        (home_default / "pgdata").mkdir(parents=True)
        default = _data_dir(env)
        assert default == home_default, "the default data directory is not under this HOME"

        # A server that stopped left its address there; another server answers at it now,
        # and the key there is one that server takes.
        (default / "server.url").write_text(f"{api.url}\n")
        (default / "admin.key").write_text(f"{admin_key}\n")
        refused, said = _tenants(env)
        assert refused != 0, f"the CLI used a stale server.url: {said}"
        assert api.url not in said

        # `make serve ARGS="--data-dir X"`: the commands without --data-dir find it.
        mine = root / "x"
        served = Served(mine, env=env).wait_ready()
        try:
            assert _data_dir(env) == mine
            assert (mine / "server.url").read_text().strip() == served.url
            with served.admin() as admin:
                assert admin.put("/v1/tenants/only-on-x", json={"backlog_cap": 5}).is_success
            code, listed = _tenants(env)
            assert code == 0, listed
            assert "only-on-x" in listed
            # --data-dir and QUEUE_SERVER_DATA_DIR still name another directory.
            assert _data_dir({**env, "QUEUE_SERVER_DATA_DIR": str(default)}) == default
            assert _tenants(env, "--data-dir", str(default))[0] != 0
        finally:
            out = served.stop()
        assert served.proc.returncode == 0, out

        # Stopped: its address is stale too, and the default is the default again.
        assert (mine / "server.url").exists()
        assert _data_dir(env) == default
        assert _tenants(env, "--data-dir", str(mine))[0] != 0


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:8080"),  # every address: the client takes loopback
        ("", "http://127.0.0.1:8080"),
        ("::", "http://[::1]:8080"),
        ("::1", "http://[::1]:8080"),  # an IPv6 address in brackets, or no URL at all
        ("192.0.2.7", "http://192.0.2.7:8080"),
    ],
)
def test_the_address_a_server_publishes_is_one_a_client_reaches_and_every_user_reads(
    tmp_path: Path, host: str, url: str
) -> None:
    with published(tmp_path, host, 8080) as path:
        assert path.read_text() == f"{url}\n"
        # Readable by the other users of the machine: their CLI finds the server too.
        assert path.stat().st_mode & 0o777 == 0o644
        assert serving(tmp_path)
        assert local_url(tmp_path) == url
    assert not serving(tmp_path)  # the lock went with the block: the address is stale
    assert local_url(tmp_path) is None
