"""`queue-server items retry` and `items delete` take item ids: only those, if they match."""

from __future__ import annotations

import uuid

from tests.helpers.api import Api
from tests.helpers.cli import Cli
from tests.helpers.items import quarantine


def test_items_retry_and_delete_act_on_the_ids_given_only(cli: Cli, api: Api) -> None:
    poisoned = [quarantine(api, "q", f"p{n}") for n in range(3)]
    # Whole ids and the end of one (as the console shows it).
    retried = cli.json(
        "items", "retry", "--state", "quarantined", poisoned[0], poisoned[2][-12:], "--yes"
    )
    assert retried == {"retried": 2, "stopped_at_the_cap": False}
    states = {i: api.operator.get(f"/v1/tenants/acme/items/{i}").json()["state"] for i in poisoned}
    assert states == {poisoned[0]: "ready", poisoned[1]: "quarantined", poisoned[2]: "ready"}

    cancelled = cli.json("items", "cancel", poisoned[1])
    assert cancelled[0]["state"] == "cancelled"
    deleted = cli.json("items", "delete", "--state", "cancelled", poisoned[1], poisoned[0], "--yes")
    assert deleted == {"deleted": 1}  # the ready one is not cancelled: left as it is
    assert api.operator.get(f"/v1/tenants/acme/items/{poisoned[1]}").status_code == 404
    assert api.operator.get(f"/v1/tenants/acme/items/{poisoned[0]}").status_code == 200


def test_items_retry_takes_up_to_1000_ids_at_once_and_refuses_more(cli: Cli, api: Api) -> None:
    poisoned = quarantine(api, "q", "p")
    given = [poisoned, *(str(uuid.uuid4()) for _ in range(999))]
    retried = cli.json("items", "retry", "--state", "quarantined", *given, "--yes")
    assert retried == {"retried": 1, "stopped_at_the_cap": False}
    cli.json("items", "cancel", poisoned)
    refused = cli.run(
        "items", "delete", "--state", "cancelled", *given, str(uuid.uuid4()), "--yes", ok=False
    )
    assert refused.returncode == 2
    assert "Too many items" in refused.stderr
    assert cli.json("items", "show", poisoned)["state"] == "cancelled"
