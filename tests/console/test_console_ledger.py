"""The item page's ledger as a person reads it: a sentence per event (who, what, under
which fence), failures in their own tone, the time since the event before, and the
event's data folded away."""

from __future__ import annotations

import re

from queue_server.console.ledger import gap
from tests.helpers.api import Api
from tests.helpers.console import sign_in

LINE = re.compile(
    r'<li class="tone-(\w+)" data-kind="(\w+)">\s*<p class="sentence">([^<]*)</p>\s*'
    r'<span class="meta">(.*?)</span>\s*(<details>|</li>)',
    re.DOTALL,
)


def test_each_event_is_a_sentence_in_its_tone_with_the_time_since_the_one_before(
    api: Api,
) -> None:
    item = api.enqueue("mail", {"to": "ada"}, priority=2)
    (lease,) = api.acquire("mail", worker="w1")
    assert lease["fence"] == 1
    assert (
        api.holder("heartbeat", item["item_id"], worker="w1", fence=1, lease_ttl=30).status_code
        == 200
    )
    failure = {"class": "SMTPTimeout", "message": "no answer in 10 s", "transient": True}
    triaged = api.holder(
        "triage", item["item_id"], worker="w1", fence=1, failure=failure, decision="requeue"
    )
    assert triaged.status_code == 200, triaged.text
    (again,) = api.acquire("mail", worker="w2")
    assert again["fence"] == 2
    done = api.holder("complete", item["item_id"], worker="w2", fence=2, result={"sent": True})
    assert done.status_code == 200, done.text

    key_id = api.worker.get("/v1/whoami").json()["key_id"]
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get(f"/console/tenants/acme/items/{item['item_id']}").text
    lines = LINE.findall(page)
    assert [(tone, kind, text) for tone, kind, text, _, _ in lines] == [
        ("info", "enqueued", f"key:{key_id} enqueued it on mail, priority 2."),
        ("info", "acquired", "w1 leased it, fence 1."),
        ("quiet", "heartbeat", "w1 extended its lease, fence 1."),
        ("bad", "triaged", "w1 reported SMTPTimeout: no answer in 10 s, fence 1, and requeued it."),
        ("info", "acquired", "w2 leased it, fence 2."),
        ("good", "completed", "w2 completed it, fence 2."),
    ]
    metas = [meta for _, _, _, meta, _ in lines]
    assert "gap" not in metas[0]  # nothing before the first
    for meta in metas[1:]:
        assert re.search(r'<span class="gap"[^>]*>\+\d', meta), meta
    assert all(folded == "<details>" for *_, folded in lines)  # every event here has data


def test_the_time_since_the_event_before_reads_at_a_glance() -> None:
    assert [gap(s) for s in (None, 0.04, 9.94, 42, 59 * 60, 2 * 3600 + 5 * 60, 3 * 86400)] == [
        "", "+0.0 s", "+9.9 s", "+42 s", "+59 min", "+2 h 5 min", "+3 d 0 h",
    ]  # fmt: skip
