"""Dependencies: an item enqueued with `depends_on` waits until every item it names has
completed, and is made ready in the transaction of the last completion, with an `unblocked`
ledger row naming it. A dependency that fails for good applies the dependent's rule:
`cancel` (the default, and its own dependents follow), `run` anyway, or `wait` until the
dependency is replayed and completes. Completions racing each other, or an enqueue racing a
completion, never strand a dependent; every ledger folds to its row."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from queue_server.client import Completion, NewItem, QueueClient
from queue_server.services.items import WORKFLOW_NODES
from tests.helpers.api import Api, setup_tenant
from tests.helpers.items import (
    complete_leases,
    dead_letter_of,
    ledger_mismatches,
    quarantine_lease,
    replay,
)

Db = psycopg.Connection[dict[str, object]]


def enqueue(api: Api, queue: str = "q", payload: Any = None, **fields: Any) -> dict[str, Any]:
    return dict(api.enqueue(queue, payload, **fields))


def refused(api: Api, body: dict[str, Any], queue: str = "q") -> str:
    response = api.worker.post(
        f"/v1/tenants/{api.tenant}/queues/{queue}/items",
        json=body,
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert response.status_code == 422, response.text
    detail: str = response.json()["detail"]
    return detail


def state(api: Api, item_id: object) -> str:
    answer = api.worker.get(f"/v1/tenants/{api.tenant}/items/{item_id}")
    assert answer.status_code == 200, answer.text
    return str(answer.json()["state"])


def ledger(api: Api, item_id: object) -> list[dict[str, Any]]:
    answer = api.operator.get(f"/v1/tenants/{api.tenant}/items/{item_id}/ledger")
    assert answer.status_code == 200, answer.text
    events: list[dict[str, Any]] = answer.json()["events"]
    return events


# Leases taken beside the one asked for, by item id: a later `lease_of` finds them here.
HELD: dict[object, dict[str, Any]] = {}


def lease_of(api: Api, item_id: object, queue: str = "q") -> dict[str, Any]:
    """The item's lease: acquire the queue until it is leased (the others stay leased)."""
    for _ in range(20):
        if item_id in HELD:
            return HELD.pop(item_id)
        HELD.update({lease["item_id"]: dict(lease) for lease in api.acquire(queue, max_items=10)})
    raise AssertionError(f"{item_id} was never leased")


def complete(api: Api, lease: dict[str, Any]) -> None:
    done = api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
    assert done.status_code == 200, done.text


def backlog(api: Api) -> int:
    return int(api.operator.get(f"/v1/tenants/{api.tenant}").json()["backlog"])


def charged(api: Api, n: int) -> None:
    """The backlog cap charges exactly `n` items now (waiting ones included): at a cap of `n`
    one more enqueue is refused, at `n + 1` it is not (and is cancelled again)."""
    for cap, status in ((n, 429), (n + 1, 201)):
        put = api.admin.put(f"/v1/tenants/{api.tenant}", json={"backlog_cap": cap})
        assert put.status_code == 200, put.text
        probe = api.worker.post(
            f"/v1/tenants/{api.tenant}/queues/probe/items",
            json={"payload": "probe"},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert probe.status_code == status, (cap, probe.text)
    gone = api.operator.post(
        f"/v1/tenants/{api.tenant}/items/{probe.json()['item_id']}/cancel",
        json={"reason": "a probe of the cap"},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert gone.status_code == 200, gone.text
    assert api.admin.put(f"/v1/tenants/{api.tenant}", json={"backlog_cap": 1000}).is_success


def test_an_item_waits_for_every_dependency_and_the_last_completion_releases_it(
    api: Api,
) -> None:
    api.approve("q", 10)
    api.approve("resize", 10)
    first = enqueue(api, "resize", "image-1")
    second = enqueue(api, "resize", "image-2")
    album = enqueue(api, "q", "album", depends_on=[first["item_id"], second["item_id"]])
    assert album["state"] == "waiting"
    charged(api, 3)  # a waiting item is charged to the backlog cap
    assert api.acquire("q") == []  # not ready: no acquire hands it out
    complete(api, lease_of(api, first["item_id"], "resize"))
    assert state(api, album["item_id"]) == "waiting"
    complete(api, lease_of(api, second["item_id"], "resize"))
    assert state(api, album["item_id"]) == "ready"
    events = ledger(api, album["item_id"])
    assert events[0]["data"]["depends_on"] == [first["item_id"], second["item_id"]]
    assert events[0]["data"]["state"] == "waiting"
    unblocked = [e for e in events if e["kind"] == "unblocked"]
    assert [(e["data"]["dependency"], e["data"]["dependency_state"]) for e in unblocked] == [
        (second["item_id"], "completed")
    ]
    # A dependency already completed does not hold a new dependent back.
    assert enqueue(api, "q", "again", depends_on=[first["item_id"]])["state"] == "ready"
    (lease,) = api.acquire("q")
    assert lease["item_id"] == album["item_id"]
    assert ledger_mismatches(api) == []


def test_a_dependency_failing_for_good_cancels_exactly_its_descendants_or_as_the_rule_says(
    api: Api,
) -> None:
    api.approve("q", 10)
    poisoned = enqueue(api, "q", "poison")
    fine = enqueue(api, "q", "fine")
    child = enqueue(api, "q", "child", depends_on=[poisoned["item_id"]])
    grandchild = enqueue(api, "q", "grandchild", depends_on=[child["item_id"], fine["item_id"]])
    sibling = enqueue(api, "q", "sibling", depends_on=[fine["item_id"]])
    anyway = enqueue(
        api, "q", "anyway", depends_on=[poisoned["item_id"]], on_dependency_failure="run"
    )
    patient = enqueue(
        api, "q", "patient", depends_on=[poisoned["item_id"]], on_dependency_failure="wait"
    )
    patient_pair = enqueue(
        api,
        "q",
        "patient-pair",
        depends_on=[poisoned["item_id"], fine["item_id"]],
        on_dependency_failure="wait",
    )
    charged(api, 8)
    quarantine_lease(api, lease_of(api, poisoned["item_id"]))
    assert state(api, child["item_id"]) == "cancelled"
    assert state(api, grandchild["item_id"]) == "cancelled"
    assert state(api, sibling["item_id"]) == "waiting"  # not a descendant of the failure
    assert state(api, anyway["item_id"]) == "ready"
    assert state(api, patient["item_id"]) == "waiting"
    cancelled = [e for e in ledger(api, grandchild["item_id"]) if e["kind"] == "cancelled"]
    assert cancelled[0]["data"]["dependency"] == child["item_id"]
    # Two cancelled and one dead letter leave the backlog; the fine one and its dependent,
    # the patient ones and the one that runs anyway are still in it.
    charged(api, 5)
    # A new item on a failed dependency is refused unless it would run anyway or wait.
    detail = refused(api, {"payload": 1, "depends_on": [poisoned["item_id"]]})
    assert f"its dependency {poisoned['item_id']} is quarantined" in detail
    assert (
        enqueue(api, "q", 2, depends_on=[poisoned["item_id"]], on_dependency_failure="wait")[
            "state"
        ]
        == "waiting"
    )
    complete(api, lease_of(api, fine["item_id"]))
    assert state(api, sibling["item_id"]) == "ready"
    # Its other dependency completed, but this one failed: it waits for the replay.
    assert state(api, patient_pair["item_id"]) == "waiting"
    # Replayed and completed, the dependency releases the items that waited for it.
    (letter,) = api.operator.get(f"/v1/tenants/{api.tenant}/dead-letters").json()["dead_letters"]
    replayed = api.operator.post(
        f"/v1/tenants/{api.tenant}/dead-letters/{letter['dead_letter_id']}/replay",
        json={},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert replayed.status_code == 200, replayed.text
    complete(api, lease_of(api, poisoned["item_id"]))
    assert state(api, patient["item_id"]) == "ready"
    assert state(api, patient_pair["item_id"]) == "ready"
    assert ledger_mismatches(api) == []


def test_a_dependency_must_be_an_item_of_the_tenant_and_an_item_takes_no_ordering_key_with_it(
    api: Api, admin: httpx.Client
) -> None:
    other = setup_tenant(api.url, admin, "other")
    theirs = enqueue(other, "q", "theirs")
    nowhere = str(uuid.uuid4())
    assert refused(api, {"payload": 1, "depends_on": [nowhere]}) == (
        f"depends_on: no item {nowhere} in tenant acme."
    )
    assert f"no item {theirs['item_id']} in tenant acme" in refused(
        api, {"payload": 1, "depends_on": [theirs["item_id"]]}
    )
    mine = enqueue(api, "q", "mine")
    assert "takes no ordering_key" in refused(
        api, {"payload": 1, "depends_on": [mine["item_id"]], "ordering_key": "k"}
    )
    # Nothing was made, and the other tenant's item is not marked as depended on.
    assert backlog(api) == 1
    assert state(other, theirs["item_id"]) == "ready"


def test_two_dependencies_completing_at_once_release_their_dependent_whoever_commits_last(
    api: Api, database_url: str
) -> None:
    """One dependency's completion held open in a transaction while the other completes
    over REST: the REST one waits for the dependent's lock, then reads the first as
    completed and releases it (without that lock each would read the other as leased, and
    the dependent would wait for ever)."""
    api.approve("q", 10)
    a = enqueue(api, "q", "a")
    b = enqueue(api, "q", "b")
    joined = enqueue(api, "q", "joined", depends_on=[a["item_id"], b["item_id"]])
    lease_b = lease_of(api, b["item_id"])
    lease_of(api, a["item_id"])
    answers: list[httpx.Response] = []
    with psycopg.connect(database_url) as finisher:
        finisher.execute(
            "UPDATE work_items SET state = 'completed', lease_holder = NULL,"
            " lease_expires_at = NULL WHERE tenant_id = 'acme' AND item_id = %s",
            (a["item_id"],),
        )
        other = threading.Thread(
            target=lambda: answers.append(
                api.holder("complete", b["item_id"], worker="w1", fence=lease_b["fence"])
            )
        )
        other.start()
        other.join(timeout=0.5)  # it waits for the held completion's commit
        finisher.commit()
    other.join(timeout=30)
    (answer,) = answers
    assert answer.status_code == 200, answer.text
    assert state(api, joined["item_id"]) == "ready"


def test_racing_completions_of_a_fan_in_release_it_once_every_round(api: Api) -> None:
    """Two connections complete the two dependencies at the same instant, round after round:
    the dependent is ready every time, and ledgered as unblocked once."""
    api.approve("q", 50)
    rounds = 12
    pairs = [(enqueue(api, "q", f"a{n}"), enqueue(api, "q", f"b{n}")) for n in range(rounds)]
    joins = [
        enqueue(api, "q", f"join{n}", depends_on=[a["item_id"], b["item_id"]])
        for n, (a, b) in enumerate(pairs)
    ]
    leases = {lease["item_id"]: lease for lease in api.acquire("q", max_items=2 * rounds)}
    assert len(leases) == 2 * rounds
    for a, b in pairs:
        start = threading.Barrier(2)

        def finish(item: dict[str, Any], start: threading.Barrier = start) -> None:
            with api.client(api.keys["worker"]) as client:
                lease = leases[item["item_id"]]
                start.wait()
                client.post(
                    f"/v1/tenants/acme/items/{item['item_id']}/complete",
                    json={"worker": "w1", "fence": lease["fence"]},
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                ).raise_for_status()

        threads = [threading.Thread(target=finish, args=(item,)) for item in (a, b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    for join in joins:
        assert state(api, join["item_id"]) == "ready"
        assert [e["kind"] for e in ledger(api, join["item_id"])] == ["enqueued", "unblocked"]
    assert ledger_mismatches(api) == []


def test_an_enqueue_uncommitted_is_seen_by_the_completion_of_its_dependency(
    api: Api, database_url: str
) -> None:
    """The enqueue's side: it found its dependency leased and is not yet committed when the
    dependency completes. The completion waits for the enqueue's lock on the dependency,
    then sees the new dependent and releases it."""
    head = enqueue(api, "q", "head")
    (lease,) = api.acquire()
    late = str(uuid.uuid4())
    items = Jsonb([{"item_id": late, "payload": "late", "depends_on": [head["item_id"]]}])
    answers: list[httpx.Response] = []
    with psycopg.connect(database_url) as producer:
        (made,) = producer.execute(
            "SELECT state::text FROM queue_server.admit_rows('acme', 'q', %s, 'test', 10, 1000)",
            (items,),
        ).fetchall()
        assert made == ("waiting",)
        completion = threading.Thread(
            target=lambda: answers.append(
                api.holder("complete", head["item_id"], worker="w1", fence=lease["fence"])
            )
        )
        completion.start()
        completion.join(timeout=0.5)  # it waits for the enqueue's commit
        producer.commit()
    completion.join(timeout=30)
    (answer,) = answers
    assert answer.status_code == 200, answer.text
    assert state(api, late) == "ready"
    assert ledger_mismatches(api) == []


def test_a_completion_uncommitted_makes_an_enqueue_on_it_wait_then_see_it_completed(
    api: Api, database_url: str
) -> None:
    """The other side: the dependency's completion is not committed when an enqueue names
    it. The enqueue waits for it (the dependency's row lock) and then finds it completed;
    without that lock it would read it leased and wait for a completion that looked first."""
    head = enqueue(api, "q", "head")
    api.acquire()
    answers: list[dict[str, Any]] = []
    with psycopg.connect(database_url) as finisher:
        finisher.execute(
            "UPDATE work_items SET state = 'completed', lease_holder = NULL,"
            " lease_expires_at = NULL WHERE tenant_id = 'acme' AND item_id = %s",
            (head["item_id"],),
        )
        producer = threading.Thread(
            target=lambda: answers.append(enqueue(api, "q", "next", depends_on=[head["item_id"]]))
        )
        producer.start()
        producer.join(timeout=0.5)  # it waits for the completion's commit
        finisher.commit()
    producer.join(timeout=30)
    (made,) = answers
    assert made["state"] == "ready"
    assert state(api, made["item_id"]) == "ready"


def test_a_batch_callback_runs_once_after_every_item_finished_and_reads_their_outcomes(
    api: Api,
) -> None:
    """A fan-in: the callback waits until each item of the batch is finished, a failure
    included; the last two finishing at the same instant on two connections release it
    once; its worker reads every item's result or failure, a page at a time."""
    api.approve("q", 10)
    made = api.worker.post(
        f"/v1/tenants/{api.tenant}/queues/q/items:batch",
        json={
            "items": [{"payload": n} for n in range(6)],
            "callback": {"queue": "albums", "payload": {"album": "summer"}, "priority": 3},
        },
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert made.status_code == 201, made.text
    items = [i["item_id"] for i in made.json()["items"]]
    callback = made.json()["callback"]
    assert (callback["queue"], callback["state"], callback["priority"]) == ("albums", "waiting", 3)
    leases = {lease["item_id"]: lease for lease in api.acquire("q", max_items=10)}
    assert set(leases) == set(items)
    quarantine_lease(api, leases[items[0]])  # a failure counts as finished for a fan-in
    for item_id in items[1:4]:
        done = api.holder(
            "complete", item_id, worker="w1", fence=leases[item_id]["fence"], result=item_id[-4:]
        )
        assert done.status_code == 200, done.text
    assert state(api, callback["item_id"]) == "waiting"
    start = threading.Barrier(2)

    def finish(item_id: str) -> None:
        with api.client(api.keys["worker"]) as client:
            start.wait()
            client.post(
                f"/v1/tenants/acme/items/{item_id}/complete",
                json={"worker": "w1", "fence": leases[item_id]["fence"], "result": item_id[-4:]},
                headers={"Idempotency-Key": uuid.uuid4().hex},
            ).raise_for_status()

    threads = [threading.Thread(target=finish, args=(item_id,)) for item_id in items[4:]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    (lease,) = api.acquire("albums")
    assert lease["item_id"] == callback["item_id"]
    assert [e["kind"] for e in ledger(api, callback["item_id"])] == [
        "enqueued", "unblocked", "acquired",
    ]  # fmt: skip
    # Its worker reads the batch's outcomes, two at a time.
    seen: dict[str, dict[str, Any]] = {}
    cursor = None
    pages = 0
    while True:
        page = api.worker.get(
            f"/v1/tenants/{api.tenant}/items/{callback['item_id']}/dependencies",
            params={"limit": 2, **({"cursor": cursor} if cursor else {})},
        )
        assert page.status_code == 200, page.text
        pages += 1
        seen |= {i["item_id"]: i for i in page.json()["items"]}
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(items)
    assert pages == 3  # the last full page says there is no more: no empty page after it
    assert seen[items[0]]["state"] == "quarantined"
    assert seen[items[0]]["last_failure"]["class"] == "Boom"
    assert all(seen[i]["result"] == i[-4:] for i in items[1:])
    foreign = api.worker.get(
        f"/v1/tenants/{api.tenant}/items/{callback['item_id']}/dependencies",
        params={"cursor": "bm90LW91cnM"},
    )
    assert foreign.status_code == 422, foreign.text
    assert ledger_mismatches(api) == []


@pytest.mark.live
def test_the_sdk_enqueues_a_fan_in_and_its_worker_reads_the_outcomes(api: Api) -> None:
    with QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as qs:
        api.approve("q", 10)
        made = qs.fan_in("q", [NewItem(payload=n) for n in range(3)], NewItem(payload="sum"))
        assert made.callback.state == "waiting"
        assert made.callback.queue == "q"
        for lease in qs.acquire("q", worker="w", max_items=10):
            qs.complete(lease.item_id, worker="w", fence=lease.fence, result=lease.payload * 2)
        (lease,) = qs.acquire("q", worker="w")
        assert lease.item_id == made.callback.item_id
        first = qs.list_dependencies(lease.item_id, limit=2)
        rest = qs.list_dependencies(lease.item_id, limit=2, cursor=first.next_cursor)
        assert rest.next_cursor is None
        results = sorted(i.result for i in first.items + rest.items)
        assert results == [0, 2, 4]


@pytest.mark.live
def test_the_sdk_fans_in_over_more_items_than_a_batch_once_per_key(api: Api) -> None:
    """1,100 items go in three batches, the last one's callback naming the others; the same
    call again with the same key (a producer retrying after a crash) makes nothing more."""
    api.approve("q", 100)
    assert api.admin.put(f"/v1/tenants/{api.tenant}", json={"backlog_cap": 2_000}).is_success
    with QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as qs:
        items = [NewItem(payload=n) for n in range(1_100)]
        made = qs.fan_in("q", items, NewItem(payload="sum"), idempotency_key="album-7")
        again = qs.fan_in("q", items, NewItem(payload="sum"), idempotency_key="album-7")
        assert [i.item_id for i in again.items] == [i.item_id for i in made.items]
        assert again.callback.item_id == made.callback.item_id
        assert len({i.item_id for i in made.items}) == 1_100
        assert backlog(api) == 1_100  # ready ones (the waiting callback is not): none twice
        finished = 0
        while finished < len(items):
            leases = qs.acquire("q", worker="w", max_items=100)
            assert made.callback.item_id not in {lease.item_id for lease in leases}
            qs.complete_many(
                [Completion(item_id=lease.item_id, fence=lease.fence) for lease in leases],
                worker="w",
            )
            finished += len(leases)
        (lease,) = qs.acquire("q", worker="w")
        assert lease.item_id == made.callback.item_id
        assert qs.list_dependencies(lease.item_id, limit=500).next_cursor is not None
        with pytest.raises(ValueError, match="1 to 10,000 items"):
            qs.fan_in("q", [NewItem()] * 10_001, NewItem(payload="sum"))


def test_a_batch_names_its_own_items_by_ref_and_enqueues_a_whole_graph_at_once(
    api: Api,
) -> None:
    """A graph in one request, under one idempotency key: each item may depend on earlier
    items of the batch by their `ref`, and on items made before by their ids."""
    api.approve("q", 10)
    earlier = enqueue(api, "q", "earlier")
    key = uuid.uuid4().hex
    body = {
        "items": [
            {"payload": "fetch", "ref": "fetch"},
            {"payload": "parse", "ref": "parse", "depends_on": ["fetch"]},
            {"payload": "index", "ref": "index", "depends_on": ["fetch"]},
            {"payload": "publish", "depends_on": ["parse", "index", earlier["item_id"]]},
        ]
    }

    def send() -> httpx.Response:
        return api.worker.post(
            f"/v1/tenants/{api.tenant}/queues/q/items:batch",
            json=body,
            headers={"Idempotency-Key": key},
        )

    made = send()
    assert made.status_code == 201, made.text
    fetch, parse, index, publish = (i["item_id"] for i in made.json()["items"])
    assert [i["state"] for i in made.json()["items"]] == ["ready", "waiting", "waiting", "waiting"]
    assert send().json() == made.json()  # the same request again: the same graph, once
    events = ledger(api, publish)
    assert events[0]["data"]["depends_on"] == [parse, index, earlier["item_id"]]
    # In dependency order, whatever the workers take first.
    order = []
    for _ in range(5):
        for lease in api.acquire("q", max_items=10):
            order.append(lease["item_id"])
            complete(api, lease)
    assert order.index(fetch) < order.index(parse) < order.index(publish)
    assert order.index(fetch) < order.index(index) < order.index(publish)
    assert state(api, publish) == "completed"
    for items, message in (
        ([{"payload": 1, "depends_on": ["later"]}, {"payload": 2, "ref": "later"}],
         "items[0].depends_on: 'later' is neither an item id nor the ref of an earlier item"),
        ([{"payload": 1, "ref": "x"}, {"payload": 2, "ref": "x"}],
         "items[1].ref: 'x' names two items"),
        ([{"payload": 1, "ref": "u", "unique_key": "u"}],
         "items[0].ref: an item with a unique_key cannot be named by a ref"),
    ):  # fmt: skip
        refused = api.worker.post(
            f"/v1/tenants/{api.tenant}/queues/q/items:batch",
            json={"items": items},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert refused.status_code == 422, refused.text
        assert message in refused.json()["detail"], refused.json()
    assert ledger_mismatches(api) == []


def test_a_workflow_of_exactly_its_bound_is_shown_whole(api: Api) -> None:
    """A fan-in whose graph has as many nodes as the answer holds, the callback included:
    every node is shown and the answer says it is complete."""
    made = api.worker.post(
        f"/v1/tenants/{api.tenant}/queues/q/items:batch",
        json={
            "items": [{"payload": n} for n in range(WORKFLOW_NODES - 1)],
            "callback": {"queue": "sums", "payload": "total"},
        },
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert made.status_code == 201, made.text
    callback = made.json()["callback"]["item_id"]
    graph = api.operator.get(f"/v1/tenants/{api.tenant}/items/{callback}/workflow").json()
    assert (graph["complete"], len(graph["nodes"])) == (True, WORKFLOW_NODES)
    (mine,) = [node for node in graph["nodes"] if node["item_id"] == callback]
    assert len(mine["depends_on"]) == WORKFLOW_NODES - 1


def test_a_workflow_cut_at_its_bound_keeps_the_item_itself_and_no_edge_to_a_node_left_out(
    api: Api,
) -> None:
    """A fan-in of more items than the answer holds: the callback (made last, its id sorts
    last) is among the nodes, and no node names one the answer left out."""
    made = api.worker.post(
        f"/v1/tenants/{api.tenant}/queues/q/items:batch",
        json={
            "items": [{"payload": n} for n in range(WORKFLOW_NODES + 10)],
            "callback": {"queue": "sums", "payload": "total"},
        },
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert made.status_code == 201, made.text
    callback = made.json()["callback"]["item_id"]
    shown = api.operator.get(f"/v1/tenants/{api.tenant}/items/{callback}/workflow")
    assert shown.status_code == 200, shown.text
    graph = shown.json()
    assert (graph["item_id"], graph["complete"], len(graph["nodes"])) == (
        callback,
        False,
        WORKFLOW_NODES,
    )
    ids = {node["item_id"] for node in graph["nodes"]}
    assert callback in ids
    (mine,) = [node for node in graph["nodes"] if node["item_id"] == callback]
    assert len(mine["depends_on"]) == WORKFLOW_NODES - 1
    assert all(set(node["depends_on"]) <= ids for node in graph["nodes"])


def test_an_operator_cancels_a_workflow_as_a_whole_from_its_root(api: Api) -> None:
    """Cancelled with `descendants`, every unfinished item below the root is cancelled in
    the same transaction, whatever its rule: a leased one's holder is fenced out, nothing
    new starts; a finished one, and items outside the graph, stay as they are."""
    api.approve("q", 10)
    root = enqueue(api, "q", "root")
    done = enqueue(api, "q", "done")
    leased = enqueue(api, "q", "leased-anyway")
    runs = enqueue(api, "q", "runs", depends_on=[root["item_id"]], on_dependency_failure="run")
    below = enqueue(api, "q", "below", depends_on=[runs["item_id"], done["item_id"]])
    outside = enqueue(api, "q", "outside", depends_on=[done["item_id"]])
    leases = {lease["item_id"]: lease for lease in api.acquire("q", max_items=10)}
    complete(api, leases[done["item_id"]])
    # Without `descendants`, the rule of each dependent decides: this one would run.
    cancel = api.operator.post(
        f"/v1/tenants/{api.tenant}/items/{root['item_id']}/cancel",
        json={"reason": "the album was withdrawn", "descendants": True},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert cancel.status_code == 200, cancel.text
    assert cancel.json()["state"] == "cancelled"
    assert [state(api, i["item_id"]) for i in (root, runs, below)] == ["cancelled"] * 3
    assert state(api, done["item_id"]) == "completed"
    assert state(api, outside["item_id"]) == "ready"  # its only dependency completed
    assert state(api, leased["item_id"]) == "leased"  # not in the graph
    reasons = [
        e["data"]["reason"] for e in ledger(api, below["item_id"]) if e["kind"] == "cancelled"
    ]
    assert reasons == ["the album was withdrawn"]
    assert ledger_mismatches(api) == []


def test_without_descendants_a_cancelled_root_applies_each_dependents_rule(api: Api) -> None:
    root = enqueue(api, "q", "root")
    runs = enqueue(api, "q", "runs", depends_on=[root["item_id"]], on_dependency_failure="run")
    stops = enqueue(api, "q", "stops", depends_on=[root["item_id"]])
    cancel = api.operator.post(
        f"/v1/tenants/{api.tenant}/items/{root['item_id']}/cancel",
        json={"reason": "no"},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert cancel.status_code == 200, cancel.text
    assert [state(api, i["item_id"]) for i in (runs, stops)] == ["ready", "cancelled"]


def test_a_workflow_replayed_from_its_failed_step_goes_on_from_there(api: Api) -> None:
    """The failed step replayed with `descendants`: the items its failure cancelled are back,
    waiting; they run in order once it completes. An item an operator cancelled, and one
    that never depended on the failure, are left as they were."""
    api.approve("q", 10)
    first = enqueue(api, "q", "first")
    failing = enqueue(api, "q", "failing", depends_on=[first["item_id"]])
    after = enqueue(api, "q", "after", depends_on=[failing["item_id"]])
    last = enqueue(api, "q", "last", depends_on=[after["item_id"]])
    stopped = enqueue(api, "q", "stopped", depends_on=[failing["item_id"]])
    assert api.operator.post(
        f"/v1/tenants/{api.tenant}/items/{stopped['item_id']}/cancel",
        json={"reason": "not wanted"},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    ).is_success
    complete(api, lease_of(api, first["item_id"]))
    quarantine_lease(api, lease_of(api, failing["item_id"]))
    assert [state(api, i["item_id"]) for i in (after, last)] == ["cancelled", "cancelled"]
    replayed = replay(api, dead_letter_of(api, failing["item_id"]), descendants=True)
    assert replayed.status_code == 200, replayed.text
    assert [state(api, i["item_id"]) for i in (failing, after, last, stopped)] == [
        "ready", "waiting", "waiting", "cancelled",
    ]  # fmt: skip
    charged(api, 3)  # the replayed step and the two back behind it
    complete(api, lease_of(api, failing["item_id"]))
    complete(api, lease_of(api, after["item_id"]))
    complete(api, lease_of(api, last["item_id"]))
    retried = [e for e in ledger(api, last["item_id"]) if e["kind"] == "retried"]
    assert retried[0]["data"]["state"] == "waiting"
    assert ledger_mismatches(api) == []


def test_an_item_cancelled_by_an_operator_after_its_retry_stays_cancelled_at_the_replay(
    api: Api,
) -> None:
    """The failure cancelled it, an operator retried it, then cancelled it: its last
    cancel is the operator's, and a replay of the failed step with `descendants` leaves it."""
    api.approve("q", 10)
    failing = enqueue(api, "q", "failing")
    after = enqueue(api, "q", "after", depends_on=[failing["item_id"]])
    quarantine_lease(api, lease_of(api, failing["item_id"]))
    assert state(api, after["item_id"]) == "cancelled"
    retried = api.operator.post(
        f"/v1/tenants/{api.tenant}/items:retry",
        json={"filter": {"state": "cancelled"}},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert retried.json()["item_ids"] == [after["item_id"]], retried.text
    assert state(api, after["item_id"]) == "waiting"
    assert api.operator.post(
        f"/v1/tenants/{api.tenant}/items/{after['item_id']}/cancel",
        json={"reason": "not wanted"},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    ).is_success
    replayed = replay(api, dead_letter_of(api, failing["item_id"]), descendants=True)
    assert replayed.status_code == 200, replayed.text
    assert [state(api, i["item_id"]) for i in (failing, after)] == ["ready", "cancelled"]


def test_a_replay_with_descendants_brings_back_as_many_as_the_backlog_cap_has_room_for(
    api: Api,
) -> None:
    """The replayed step and the items its failure cancelled are charged to the backlog
    cap: at the cap, the rest stay cancelled."""
    api.approve("q", 10)
    failing = enqueue(api, "q", "failing")
    after = enqueue(api, "q", "after", depends_on=[failing["item_id"]])
    last = enqueue(api, "q", "last", depends_on=[after["item_id"]])
    quarantine_lease(api, lease_of(api, failing["item_id"]))
    assert [state(api, i["item_id"]) for i in (after, last)] == ["cancelled", "cancelled"]
    cap = backlog(api) + 2  # the step and one of the two behind it
    assert api.admin.put(f"/v1/tenants/{api.tenant}", json={"backlog_cap": cap}).is_success
    replayed = replay(api, dead_letter_of(api, failing["item_id"]), descendants=True)
    assert replayed.status_code == 200, replayed.text
    assert sorted(state(api, i["item_id"]) for i in (after, last)) == ["cancelled", "waiting"]
    charged(api, cap)


def test_a_callback_names_items_of_earlier_batches_and_waits_for_all_of_them(api: Api) -> None:
    """A fan-in larger than a batch: the callback of the last batch names the items of the
    earlier ones too, and runs once when the last of all of them is finished, whatever the
    order (the count it waits on is one per dependency, each counted once)."""
    api.approve("q", 100)
    api.approve("sums", 10)
    path = f"/v1/tenants/{api.tenant}/queues/q/items:batch"

    def batch(body: dict[str, Any]) -> dict[str, Any]:
        made = api.worker.post(path, json=body, headers={"Idempotency-Key": uuid.uuid4().hex})
        assert made.status_code == 201, made.text
        answer: dict[str, Any] = made.json()
        return answer

    earlier = [
        i["item_id"] for i in batch({"items": [{"payload": n} for n in range(500)]})["items"]
    ]
    # One named twice and in any case: each dependency is waited for once.
    named = [*earlier, earlier[0].upper()]
    last = batch(
        {
            "items": [{"payload": n} for n in range(500, 800)],
            "callback": {"queue": "sums", "payload": "sum", "depends_on": named},
        }
    )
    callback = last["callback"]["item_id"]
    items = earlier + [i["item_id"] for i in last["items"]]
    assert last["callback"]["state"] == "waiting"
    # Taken and finished 100 at a time: the first taken fails, the second is held to the end.
    first = api.acquire("q", max_items=100)
    quarantine_lease(api, first[0])
    held = first[1]
    finished = [str(first[0]["item_id"]), str(held["item_id"])]
    batch_of = first[2:]
    while batch_of:
        complete_leases(api, batch_of)
        finished += [str(i["item_id"]) for i in batch_of]
        batch_of = api.acquire("q", max_items=100)
    assert sorted(finished) == sorted(items)
    assert state(api, callback) == "waiting"  # one of 800 still leased
    progress = api.worker.get(
        f"/v1/tenants/{api.tenant}/items/{callback}/dependencies", params={"limit": 1}
    ).json()
    assert (progress["total"], progress["waiting_for"]) == (800, 1)
    complete(api, held)
    (lease,) = api.acquire("sums")
    assert lease["item_id"] == callback
    unblocked = [e for e in ledger(api, callback) if e["kind"] == "unblocked"]
    assert [e["data"]["dependency"] for e in unblocked] == [held["item_id"]]
    outcomes = api.worker.get(
        f"/v1/tenants/{api.tenant}/items/{callback}/dependencies", params={"limit": 500}
    ).json()
    more = api.worker.get(
        f"/v1/tenants/{api.tenant}/items/{callback}/dependencies",
        params={"limit": 500, "cursor": outcomes["next_cursor"]},
    ).json()
    assert more["next_cursor"] is None
    assert (more["total"], more["waiting_for"]) == (800, 0)  # released
    assert sorted(i["item_id"] for i in outcomes["items"] + more["items"]) == sorted(items)
    assert ledger_mismatches(api) == []


def test_a_callback_names_only_items_of_the_tenant_and_at_most_ten_thousand_in_all(
    api: Api,
) -> None:
    path = f"/v1/tenants/{api.tenant}/queues/q/items:batch"
    stranger = str(uuid.uuid4())
    unknown = api.worker.post(
        path,
        json={"items": [{"payload": 1}], "callback": {"payload": "sum", "depends_on": [stranger]}},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert unknown.status_code == 422, unknown.text
    assert f"no item {stranger}" in unknown.json()["detail"]
    too_many = api.worker.post(
        path,
        json={
            "items": [{"payload": n} for n in range(2)],
            "callback": {"payload": "sum", "depends_on": [str(uuid.uuid4()) for _ in range(9_999)]},
        },
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert too_many.status_code == 422, too_many.text
    assert "at most 10,000 items; this one would wait for 10,001" in too_many.text
    assert backlog(api) == 0  # neither made anything


def test_a_dependency_run_anyway_then_replayed_is_waited_for_again(api: Api) -> None:
    """To run anyway, a failed dependency counts as finished; replayed, it is unfinished
    again, and the dependent waits for it as for the others."""
    api.approve("q", 10)
    flaky = enqueue(api, "q", "flaky")
    steady = enqueue(api, "q", "steady")
    report = enqueue(
        api,
        "q",
        "report",
        # Named twice, each is still waited for once.
        depends_on=[flaky["item_id"], steady["item_id"], steady["item_id"]],
        on_dependency_failure="run",
    )
    quarantine_lease(api, lease_of(api, flaky["item_id"]))
    assert state(api, report["item_id"]) == "waiting"  # the steady one is still to do
    replayed = replay(api, dead_letter_of(api, flaky["item_id"]))
    assert replayed.status_code == 200, replayed.text
    complete(api, lease_of(api, steady["item_id"]))
    assert state(api, report["item_id"]) == "waiting"  # the replayed one runs again first
    complete(api, lease_of(api, flaky["item_id"]))
    assert state(api, report["item_id"]) == "ready"
    unblocked = [e for e in ledger(api, report["item_id"]) if e["kind"] == "unblocked"]
    assert [e["data"]["dependency"] for e in unblocked] == [flaky["item_id"]]
    assert ledger_mismatches(api) == []


def test_a_dependent_replayed_with_its_failed_step_counts_again_what_it_waits_for(
    api: Api,
) -> None:
    """Cancelled by a failed dependency, then brought back by its replay: what completed
    meanwhile is not waited for again, and the replayed step's completion releases it."""
    api.approve("q", 10)
    early, failing, late = (enqueue(api, "q", name) for name in ("early", "failing", "late"))
    report = enqueue(
        api, "q", "report", depends_on=[early["item_id"], failing["item_id"], late["item_id"]]
    )
    complete(api, lease_of(api, early["item_id"]))
    quarantine_lease(api, lease_of(api, failing["item_id"]))
    assert state(api, report["item_id"]) == "cancelled"
    complete(api, lease_of(api, late["item_id"]))  # while the report is cancelled
    replayed = replay(api, dead_letter_of(api, failing["item_id"]), descendants=True)
    assert replayed.status_code == 200, replayed.text
    assert state(api, report["item_id"]) == "waiting"
    progress = api.worker.get(f"/v1/tenants/{api.tenant}/items/{report['item_id']}/dependencies")
    assert (progress.json()["total"], progress.json()["waiting_for"]) == (3, 1)
    complete(api, lease_of(api, failing["item_id"]))
    assert state(api, report["item_id"]) == "ready"
    assert ledger_mismatches(api) == []


def test_an_item_that_runs_whatever_its_dependency_did_is_retried_ready_not_waiting(
    api: Api,
) -> None:
    """It ran after its dependency failed (`on_dependency_failure` `run`) and failed in
    turn: retried, it is ready at once, not waiting for the failed dependency."""
    api.approve("q", 10)
    failing = enqueue(api, "q", "failing")
    cleanup = enqueue(
        api, "q", "cleanup", depends_on=[failing["item_id"]], on_dependency_failure="run"
    )
    quarantine_lease(api, lease_of(api, failing["item_id"]))
    quarantine_lease(api, lease_of(api, cleanup["item_id"]))
    retried = api.operator.post(
        f"/v1/tenants/{api.tenant}/items:retry",
        json={"filter": {"state": "quarantined", "item_ids": [cleanup["item_id"]]}},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert retried.json()["item_ids"] == [cleanup["item_id"]], retried.text
    assert state(api, cleanup["item_id"]) == "ready"


def test_an_item_many_enqueues_depend_on_is_marked_once_not_rewritten_by_each(
    api: Api, db: Db
) -> None:
    """The first dependent marks it (a new version of its row); the next ones only lock it:
    under a held snapshot, each rewrite would leave a version for every later reader (its
    completion, the next enqueue) to walk."""
    config = enqueue(api, "q", "load the configuration")
    enqueue(api, "q", "first user", depends_on=[config["item_id"]])

    def version() -> object:
        row = db.execute(
            "SELECT xmin::text AS x, has_dependents FROM work_items WHERE item_id = %s",
            (config["item_id"],),
        ).fetchone()
        assert row is not None
        assert row["has_dependents"] is True
        return row["x"]

    marked = version()
    for n in range(3):
        assert enqueue(api, "q", f"user {n}", depends_on=[config["item_id"]])["state"] == "waiting"
    assert version() == marked
    complete(api, lease_of(api, config["item_id"]))
    assert (
        state(api, enqueue(api, "q", "late user", depends_on=[config["item_id"]])["item_id"])
        == "ready"
    )


def test_a_callback_s_row_is_only_locked_by_the_completions_it_counts_until_the_last(
    api: Api, db: Db
) -> None:
    """Each completion appends the callback's new count (migration 0038); the callback's own
    row keeps its version until the last one releases it. A row rewritten per completion
    would leave, under a held snapshot, a version for every later completion to walk."""
    api.approve("q", 10)
    made = api.worker.post(
        f"/v1/tenants/{api.tenant}/queues/q/items:batch",
        json={"items": [{"payload": n} for n in range(5)], "callback": {"payload": "sum"}},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert made.status_code == 201, made.text
    callback = made.json()["callback"]["item_id"]

    def version() -> object:
        row = db.execute(
            "SELECT xmin::text AS x FROM work_items WHERE item_id = %s", (callback,)
        ).fetchone()
        assert row is not None
        return row["x"]

    before = version()
    leases = api.acquire("q", max_items=10)
    assert len(leases) == 5
    complete_leases(api, leases[:4])
    assert version() == before
    pending = db.execute(
        "SELECT pending FROM dependency_tallies WHERE item_id = %s ORDER BY seq", (callback,)
    ).fetchall()
    assert [r["pending"] for r in pending] == [4, 3, 2, 1]
    complete_leases(api, leases[4:])
    assert version() != before
    assert state(api, callback) == "ready"
