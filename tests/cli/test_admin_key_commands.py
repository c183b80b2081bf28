"""`queue-server keys create-admin` and `keys revoke-admin` over the API."""

from __future__ import annotations

from tests.helpers.api import Api
from tests.helpers.cli import Cli


def test_an_admin_creates_a_second_admin_key_and_revokes_it(cli: Cli, api: Api) -> None:
    created = cli.json("keys", "create-admin", role="admin")
    assert created["role"] == "admin"
    second = api.client(created["secret"])
    assert second.get("/v1/tenants/acme").status_code == 200
    done = cli.run("keys", "revoke-admin", created["key_id"], role="admin")
    assert f"admin key {created['key_id']} revoked" in done.stdout
    assert second.get("/v1/tenants/acme").status_code == 401
    # The last admin key stays: the command says why and exits 4 (refused by the server).
    own_id = cli.admin_key.split("_")[1]
    refused = cli.run("keys", "revoke-admin", own_id, role="admin", ok=False)
    assert refused.returncode == 4
    assert "last-admin-key" in refused.stderr or "last active admin key" in refused.stderr
    assert api.admin.get("/v1/tenants/acme").status_code == 200
