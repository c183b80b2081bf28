"""Verification runs over the API: run key, one running run per tenant, checkpoints, marker."""

from __future__ import annotations

import psycopg

from tests.helpers.api import Api

Db = psycopg.Connection[dict[str, object]]
BASE = "/v1/tenants/acme/verification-runs"


def _start(
    api: Api, artifact: str = "a-1", verifier: str = "v-1", items: object = None
) -> dict[str, object]:
    response = api.worker.post(
        BASE,
        json={
            "artifact_version": artifact,
            "verifier_version": verifier,
            "items": items or ["x", "dir/y"],
        },
    )
    return {"status": response.status_code, **response.json()}


def test_same_artifact_and_verifier_version_return_the_same_run(api: Api) -> None:
    first = _start(api)
    again = _start(api)
    assert (first["status"], again["status"]) == (201, 200)
    assert first["run_id"] == again["run_id"]
    assert first["run_key"] == "a-1+v-1"
    assert first["remaining"] == ["x", "dir/y"]
    conflict = _start(api, items=["x"])
    assert conflict["status"] == 409
    assert conflict["code"] == "run-key-conflict"


def test_an_item_declared_twice_is_one_item_of_the_run(api: Api) -> None:
    first = _start(api, items=["x", "dir/y", "x"])
    assert first["status"] == 201
    assert (first["items"], first["remaining"]) == (["x", "dir/y"], ["x", "dir/y"])
    # The same list again is the same run; and so is the list without its repeat.
    assert _start(api, items=["x", "dir/y", "x"])["run_id"] == first["run_id"]
    assert _start(api, items=["x", "dir/y"])["run_id"] == first["run_id"]


def test_a_complete_run_is_found_again_by_its_key_and_never_run_twice(api: Api) -> None:
    first = _start(api)
    run = f"{BASE}/{first['run_id']}"
    for item in ("x", "dir/y"):
        assert api.worker.put(f"{run}/checkpoints/{item}", json={"result": "ok"}).status_code == 201
    assert api.worker.put(f"{run}/complete").status_code == 200
    again = _start(api)
    assert (again["status"], again["run_id"], again["state"]) == (200, first["run_id"], "complete")


def test_second_run_is_refused_while_another_runs_then_admitted_after_the_marker(api: Api) -> None:
    first = _start(api)
    busy = _start(api, artifact="a-2")
    assert busy["status"] == 409
    assert busy["code"] == "verification-run-busy"
    assert busy["running_run_id"] == first["run_id"]
    run = f"{BASE}/{first['run_id']}"
    for item in ("x", "dir/y"):
        assert api.worker.put(f"{run}/checkpoints/{item}", json={"result": "ok"}).status_code == 201
    assert api.worker.put(f"{run}/complete").status_code == 200
    assert _start(api, artifact="a-2")["status"] == 201


def test_checkpoints_are_idempotent_and_refuse_a_different_result(api: Api, db: Db) -> None:
    run = f"{BASE}/{_start(api)['run_id']}"
    assert api.worker.put(f"{run}/checkpoints/x", json={"result": {"sha": "1"}}).status_code == 201
    again = api.worker.put(f"{run}/checkpoints/x", json={"result": {"sha": "1"}})
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    other = api.worker.put(f"{run}/checkpoints/x", json={"result": {"sha": "2"}})
    assert other.status_code == 409
    assert other.json()["code"] == "checkpoint-conflict"
    undeclared = api.worker.put(f"{run}/checkpoints/z", json={"result": 1})
    assert undeclared.status_code == 422
    assert undeclared.json()["code"] == "item-not-declared"
    rows = db.execute("SELECT item, result FROM verification_checkpoints").fetchall()
    assert rows == [{"item": "x", "result": {"sha": "1"}}]


def test_run_complete_marker_is_refused_until_every_item_is_checkpointed(api: Api) -> None:
    run = f"{BASE}/{_start(api)['run_id']}"
    api.worker.put(f"{run}/checkpoints/x", json={"result": "ok"})
    refused = api.worker.put(f"{run}/complete")
    assert refused.status_code == 409
    assert refused.json()["code"] == "verification-incomplete"
    assert refused.json()["missing"] == ["dir/y"]
    assert api.worker.get(run).json()["state"] == "running"
    api.worker.put(f"{run}/checkpoints/dir/y", json={"result": "ok"})
    done = api.worker.put(f"{run}/complete")
    assert done.status_code == 200
    assert done.json()["state"] == "complete"
    assert done.json()["completed_at"] is not None
    assert api.worker.put(f"{run}/complete").headers["Idempotent-Replayed"] == "true"


def test_the_refused_marker_names_every_item_still_without_a_checkpoint(api: Api) -> None:
    run = f"{BASE}/{_start(api, items=['a', 'b', 'c', 'd'])['run_id']}"
    assert api.worker.put(f"{run}/checkpoints/b", json={"result": "ok"}).status_code == 201
    refused = api.worker.put(f"{run}/complete")
    assert refused.status_code == 409
    assert refused.json()["missing"] == ["a", "c", "d"]
    assert "3 declared item(s)" in refused.json()["detail"]


def test_unknown_run_is_not_found(api: Api) -> None:
    assert api.worker.get(f"{BASE}/not-a-uuid").status_code == 404
    missing = api.worker.get(f"{BASE}/0190b7a4-0000-7000-8000-000000000000")
    assert missing.json()["code"] == "verification-run-not-found"


def test_runs_are_listed_newest_first_with_counts_in_pages(api: Api) -> None:
    first = _start(api)
    run = f"{BASE}/{first['run_id']}"
    for item in ("x", "dir/y"):
        assert api.worker.put(f"{run}/checkpoints/{item}", json={"result": "ok"}).status_code == 201
    assert api.worker.put(f"{run}/complete").status_code == 200
    second = _start(api, artifact="a-2", items=["only"])
    page = api.operator.get(BASE, params={"limit": 1}).json()
    assert [r["run_id"] for r in page["runs"]] == [second["run_id"]]
    assert page["runs"][0]["items"] == 1
    assert page["runs"][0]["checkpoints"] == 0
    assert page["runs"][0]["state"] == "running"
    rest = api.operator.get(BASE, params={"limit": 1, "cursor": page["next_cursor"]}).json()
    assert [(r["run_id"], r["checkpoints"], r["state"]) for r in rest["runs"]] == [
        (first["run_id"], 2, "complete")
    ]
    assert rest["next_cursor"] is None
    assert api.operator.get(BASE, params={"cursor": "nope"}).status_code == 422
    # Another tenant's key learns nothing about these runs.
    assert api.admin.put("/v1/tenants/globex", json={"backlog_cap": 10}).status_code == 200
    other = api.admin.post("/v1/tenants/globex/keys", json={"role": "operator"}).json()["secret"]
    assert api.client(other).get(BASE).status_code == 404


def test_every_status_a_run_route_answers_is_in_the_openapi_document(api: Api) -> None:
    """A client generated from /openapi.json knows each answer: 201 and 200 of a start and
    of a checkpoint (a new one, the same again)."""
    paths = api.worker.get("/openapi.json").json()["paths"]
    started = _start(api)
    again = _start(api)
    run = f"{BASE}/{started['run_id']}"
    first = api.worker.put(f"{run}/checkpoints/x", json={"result": 1})
    same = api.worker.put(f"{run}/checkpoints/x", json={"result": 1})
    answered = {
        ("post", "/v1/tenants/{tenant}/verification-runs"): {started["status"], again["status"]},
        ("put", "/v1/tenants/{tenant}/verification-runs/{run_id}/checkpoints/{item}"): {
            first.status_code,
            same.status_code,
        },
    }
    for (method, path), statuses in answered.items():
        assert statuses == {200, 201}
        declared = {int(code) for code in paths[path][method]["responses"]}
        assert statuses <= declared, f"{method} {path}: {statuses - declared} not documented"
