"""The artifact-verification deadline and an operator's abandon, on a live server: a run past
its deadline ends failed (at its next checkpoint, or by the sweeper), and a failed or
abandoned run never blocks the next one."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from queue_server.settings import Settings
from tests.helpers.api import Api, live_api, policy_file

DEADLINE = 2.0


@pytest.fixture
def short(tmp_path: Path, database_url: str) -> Iterator[Api]:
    """A server whose policy ends a verification run DEADLINE seconds after its start."""
    path = policy_file(
        tmp_path / "short-runs.json",
        {
            "artifact-verification": {
                "deadline": {"seconds": DEADLINE},
                "attempt-timeout": {"seconds": 0.5, "on-timeout": "stop-at-checkpoint"},
                "backoff-and-jitter": {
                    "initial-seconds": 0.1,
                    "multiplier": 2,
                    "max-seconds": 0.2,
                    "jitter": "none",
                },
            }
        },
    )
    settings = Settings(
        data_dir=tmp_path, poll_interval=0.2, policy=str(path), run_sweep_interval=0.2
    )
    with live_api(settings, database_url) as api:
        yield api


def _runs(api: Api) -> str:
    return f"/v1/tenants/{api.tenant}/verification-runs"


def _start(api: Api, artifact: str, items: list[str]) -> httpx.Response:
    body = {"artifact_version": artifact, "verifier_version": "v1", "items": items}
    return api.worker.post(_runs(api), json=body)


def _checkpoint(api: Api, run_id: str, item: str) -> httpx.Response:
    return api.worker.put(f"{_runs(api)}/{run_id}/checkpoints/{item}", json={"result": "ok"})


def _abandon(
    api: Api, run_id: str, key: str, client: httpx.Client | None = None, **body: Any
) -> httpx.Response:
    return (client or api.operator).post(
        f"{_runs(api)}/{run_id}:abandon", json=body, headers={"Idempotency-Key": key}
    )


def test_a_run_past_its_deadline_fails_at_its_next_checkpoint_and_blocks_nothing(
    short: Api,
) -> None:
    api = short
    first = _start(api, "a1", ["x", "y"])
    assert first.status_code == 201, first.text
    run_id = first.json()["run_id"]
    assert _checkpoint(api, run_id, "x").status_code == 201
    assert _start(api, "a2", ["z"]).json()["code"] == "verification-run-busy"
    time.sleep(DEADLINE + 0.1)
    late = _checkpoint(api, run_id, "y")
    assert late.status_code == 409, late.text
    assert (late.json()["code"], late.json()["state"], late.json()["reason"]) == (
        "verification-run-ended",
        "failed",
        "deadline-exceeded",
    )
    run = api.worker.get(f"{_runs(api)}/{run_id}").json()
    assert run["state"] == "failed"
    assert (run["ended"]["by"], run["ended"]["reason"]) == ("server", "deadline-exceeded")
    assert api.worker.put(f"{_runs(api)}/{run_id}/complete").json()["code"] == (
        "verification-run-ended"
    )
    # The failed run holds nothing: another run starts, and the same key starts anew,
    # carrying its checkpoints over.
    other = _start(api, "a2", ["z"])
    assert other.status_code == 201, other.text
    assert _checkpoint(api, other.json()["run_id"], "z").status_code == 201
    assert api.worker.put(f"{_runs(api)}/{other.json()['run_id']}/complete").status_code == 200
    again = _start(api, "a1", ["x", "y"])
    assert again.status_code == 201, again.text
    assert again.json()["run_id"] != run_id
    assert [c["item"] for c in again.json()["checkpoints"]] == ["x"]
    assert again.json()["remaining"] == ["y"]


def test_the_sweeper_fails_a_run_nobody_touches_again(short: Api) -> None:
    api = short
    run_id = _start(api, "idle", ["x"]).json()["run_id"]
    started = time.monotonic()
    while time.monotonic() - started < DEADLINE + 5:
        run = api.worker.get(f"{_runs(api)}/{run_id}").json()
        if run["state"] != "running":
            break
        time.sleep(0.2)
    assert run["state"] == "failed"
    assert run["ended"]["reason"] == "deadline-exceeded"
    assert _start(api, "next", ["x"]).status_code == 201


def test_an_operator_abandons_a_run_with_a_reason_and_the_next_one_starts(api: Api) -> None:
    run_id = _start(api, "stuck", ["x", "y"]).json()["run_id"]
    assert _start(api, "next", ["x"]).json()["code"] == "verification-run-busy"
    assert _abandon(api, run_id, "k1", api.worker, reason="r").status_code == 403
    no_key = api.operator.post(f"{_runs(api)}/{run_id}:abandon", json={"reason": "r"})
    assert no_key.json()["code"] == "idempotency-key-required"
    abandoned = _abandon(api, run_id, "k1", reason="verifier host lost")
    assert abandoned.status_code == 200, abandoned.text
    body = abandoned.json()
    assert body["state"] == "abandoned"
    assert body["ended"]["reason"] == "verifier host lost"
    assert body["ended"]["by"].startswith("key:")
    replay = _abandon(api, run_id, "k1", reason="verifier host lost")
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == body
    twice = _abandon(api, run_id, "k2", reason="again")
    assert (twice.status_code, twice.json()["code"]) == (409, "verification-run-ended")
    assert _checkpoint(api, run_id, "x").json()["code"] == "verification-run-ended"
    assert _start(api, "next", ["x"]).status_code == 201
    unknown = _abandon(api, str(uuid.uuid4()), "k3", reason="r")
    assert unknown.status_code == 404


def test_a_key_started_anew_carries_over_the_latest_ended_runs_checkpoints_of_declared_items(
    api: Api,
) -> None:
    first = _start(api, "a1", ["x", "y", "z"]).json()["run_id"]
    assert _checkpoint(api, first, "x").status_code == 201
    assert _abandon(api, first, uuid.uuid4().hex, reason="host lost").status_code == 200
    second = _start(api, "a1", ["x", "y", "z"]).json()
    assert [c["item"] for c in second["checkpoints"]] == ["x"]
    assert _checkpoint(api, second["run_id"], "y").status_code == 201
    assert _abandon(api, second["run_id"], uuid.uuid4().hex, reason="again").status_code == 200
    # The latest ended run's checkpoints (x and y), of the items this run declares: y.
    third = _start(api, "a1", ["y", "z"])
    assert third.status_code == 201, third.text
    assert sorted(c["item"] for c in third.json()["checkpoints"]) == ["y"]
    assert third.json()["remaining"] == ["z"]
