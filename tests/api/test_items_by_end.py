"""An item is named by the start of its id for any key, and by its end for an operator's
(the end is a scan of the tenant's items: for a person, not a worker's program)."""

from __future__ import annotations

from tests.helpers.api import Api


def test_the_end_of_an_id_names_the_item_for_an_operator_not_for_a_worker(api: Api) -> None:
    item_id = str(api.enqueue("mail", "x")["item_id"])
    end, start = item_id[-8:], item_id[:18]
    operator = api.operator.get(f"/v1/tenants/acme/items/{end}")
    assert operator.status_code == 200, operator.text
    assert operator.json()["item_id"] == item_id
    ledger = api.operator.get(f"/v1/tenants/acme/items/{end}/ledger").json()
    assert ledger["item_id"] == item_id
    assert api.worker.get(f"/v1/tenants/acme/items/{end}").status_code == 404
    assert api.worker.get(f"/v1/tenants/acme/items/{end}/ledger").status_code == 404
    assert api.worker.get(f"/v1/tenants/acme/items/{start}").json()["item_id"] == item_id
