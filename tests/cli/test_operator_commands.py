"""Operator commands of the real CLI against the real server."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta

import psycopg

from tests.helpers.api import Api
from tests.helpers.cli import Cli, quarantine
from tests.helpers.rawhttp import Reply, ScriptedServer, Seen, answer

DB = psycopg.Connection[dict[str, object]]


def test_admin_manages_tenants_and_keys(cli: Cli) -> None:
    saved = cli.json("tenants", "put", "globex", "--backlog-cap", "50", role="admin")
    assert (saved["tenant"], saved["backlog_cap"]) == ("globex", 50)
    shown = cli.json("tenants", "show", "globex", role="admin")
    assert shown["backlog"] == 0
    table = cli.run("tenants", "show", "globex", role="admin").stdout
    assert "backlog" in table
    assert "0 of 50" in table

    created = cli.json(
        "keys", "create", "globex", "--role", "operator", "--name", "on-call", role="admin"
    )
    assert created["secret"].startswith("qsk_")
    assert created["name"] == "on-call"
    listed = cli.json("keys", "list", "globex", role="admin")
    assert {(k["key_id"], k["name"]) for k in listed} >= {(created["key_id"], "on-call")}
    # A tenant key needs no --tenant: the CLI asks the server whose key it is.
    own = cli.run("status", "--json", "--key", created["secret"])
    assert '"tenant": "globex"' in own.stdout

    cli.run("keys", "revoke", "globex", created["key_id"], role="admin")
    refused = cli.run("status", "--key", created["secret"], ok=False)
    assert refused.returncode == 4  # refused: authentication
    assert "Unauthorized" in refused.stderr


def test_errors_print_the_problem_and_exit_non_zero(cli: Cli) -> None:
    forbidden = cli.run("dead-letters", "list", role="worker", ok=False)
    assert forbidden.returncode == 4
    assert "Forbidden for this role" in forbidden.stderr
    assert "forbidden-role" in forbidden.stderr

    missing = cli.run("items", "show", str(uuid.uuid4()), ok=False)
    assert missing.returncode == 4
    assert "Item not found" in missing.stderr

    admin_without_tenant = cli.run("status", role="admin", ok=False)
    assert admin_without_tenant.returncode == 2  # usage: the tenant is missing
    assert "pass --tenant" in admin_without_tenant.stderr

    unreachable = cli.run("status", "--url", "http://127.0.0.1:9", ok=False)
    assert unreachable.returncode == 3
    assert "Cannot reach the queue server" in unreachable.stderr


def test_a_server_that_fails_inside_is_unavailable_not_a_refusal(cli: Cli) -> None:
    def script(_: Seen) -> Reply:
        problem = {"title": "Internal Server Error", "status": 500}
        return answer(500, json.dumps(problem).encode())

    server = ScriptedServer(script)
    try:
        failed = cli.run("status", "--url", server.url, ok=False)
    finally:
        server.stop()
    assert failed.returncode == 3  # unavailable, as a 503 is: worth trying again later
    assert "Internal Server Error" in failed.stderr


def test_enqueue_a_file_in_batches_and_a_rerun_adds_nothing(cli: Cli, db: DB) -> None:
    path = cli.cwd / "items.jsonl"
    rows = [f'{{"n": {n}}}' for n in range(230)]
    rows.insert(5, "")  # blank lines are skipped
    rows.append('{"payload": "with options", "priority": 7}')
    path.write_text("\n".join(rows) + "\n")

    first = cli.json("enqueue", "jobs", "--file", str(path), "--batch-size", "100")
    assert first["count"] == 231
    again = cli.json("enqueue", "jobs", "--file", str(path), "--batch-size", "100")
    assert (again["count"], again["already_loaded"]) == (0, 231)
    count = db.execute("SELECT count(*) AS n FROM work_items").fetchone()
    assert count is not None
    assert count["n"] == 231
    top = db.execute("SELECT payload FROM work_items ORDER BY priority DESC LIMIT 1").fetchone()
    assert top is not None
    assert top["payload"] == "with options"

    one = cli.json("enqueue", "jobs", "--payload", '{"to": "a@example.com"}', "--priority", "2")
    assert one["payload"] == {"to": "a@example.com"}
    shown = cli.json("items", "show", one["item_id"])
    assert shown["state"] == "ready"
    ledger = cli.json("items", "ledger", one["item_id"])
    assert [e["kind"] for e in ledger] == ["enqueued"]
    assert "enqueued" in cli.run("items", "ledger", one["item_id"]).stdout

    status = cli.json("status")
    assert status["backlog"] == 232
    assert status["queues"][0]["ready"] == 232
    assert "jobs" in cli.run("status").stdout

    bad = cli.cwd / "bad.jsonl"
    bad.write_text('{"ok": 1}\n{not json\n')
    refused = cli.run("enqueue", "jobs", "--file", str(bad), ok=False)
    assert refused.returncode == 4  # refused: validation
    assert "bad.jsonl:2" in refused.stderr


def test_a_files_line_keeps_its_own_options_over_the_commands(cli: Cli) -> None:
    path = cli.cwd / "items.jsonl"
    path.write_text(
        '{"payload": "own", "max_acquisitions": 4, "priority": 5, "delay": 3600}\n{"n": 1}\n'
    )
    loaded = cli.json(
        "enqueue", "jobs", "--file", str(path), "--max-acquisitions", "2", "--priority", "2"
    )
    shown = [cli.json("items", "show", item_id) for item_id in loaded["item_ids"]]
    assert [(i["payload"], i["max_acquisitions"], i["priority"]) for i in shown] == [
        ("own", 4, 5),
        ({"n": 1}, 2, 2),
    ]
    # Its own delay too: due in an hour, where the other line is due at once.
    due_in = [
        datetime.fromisoformat(i["available_at"]) - datetime.fromisoformat(i["created_at"])
        for i in shown
    ]
    assert due_in[0] > timedelta(minutes=59)
    assert due_in[1] < timedelta(minutes=1)


def test_a_line_with_a_payload_key_among_keys_of_its_own_is_a_payload_whole(cli: Cli) -> None:
    path = cli.cwd / "items.jsonl"
    path.write_text('{"payload": "receipt", "customer": 7}\n')
    (item_id,) = cli.json("enqueue", "jobs", "--file", str(path))["item_ids"]
    assert cli.json("items", "show", item_id)["payload"] == {"payload": "receipt", "customer": 7}


def test_the_same_file_loads_into_each_queue_it_is_given_to(cli: Cli) -> None:
    path = cli.cwd / "items.jsonl"
    path.write_text("".join(f'{{"n": {n}}}\n' for n in range(3)))
    for queue in ("mail", "news"):
        loaded = cli.json("enqueue", queue, "--file", str(path))
        assert (loaded["count"], loaded["already_loaded"]) == (3, 0)
    ready = {q["queue"]: q["ready"] for q in cli.json("status")["queues"]}
    assert ready == {"mail": 3, "news": 3}


def test_dead_letters_list_show_replay_and_discard(cli: Cli, api: Api) -> None:
    ids = quarantine(api, "mail", 4)
    listed = cli.json("dead-letters", "list", "--queue", "mail")
    assert [d["item_id"] for d in listed] == ids
    assert "poison 0" in cli.run("dead-letters", "list").stdout
    assert len(cli.json("dead-letters", "list", "--limit", "2")) == 2
    assert [d["item_id"] for d in cli.json("dead-letters", "list", "--limit", "2", "--all")] == ids

    first = listed[0]["dead_letter_id"]
    detail = cli.json("dead-letters", "show", first)
    assert detail["item"]["state"] == "quarantined"
    assert [e["kind"] for e in detail["events"]] == ["enqueued", "acquired", "triaged"]
    assert "triaged" in cli.run("dead-letters", "show", first).stdout

    replayed = cli.json("dead-letters", "replay", first, "--max-acquisitions", "4")
    assert [(i["state"], i["max_acquisitions"]) for i in replayed] == [("ready", 4)]

    # Many at once needs a yes: without a terminal to ask on, it refuses.
    unconfirmed = cli.run("dead-letters", "discard", "--queue", "mail", ok=False)
    assert unconfirmed.returncode == 2  # usage: --yes is needed without a terminal
    assert "--yes" in unconfirmed.stderr
    discarded = cli.json(
        "dead-letters", "discard", listed[1]["dead_letter_id"], "--reason", "bad data"
    )
    assert discarded[0]["state"] == "cancelled"

    unconfirmed = cli.run("dead-letters", "replay", "--queue", "mail", ok=False)
    assert "Confirmation needed" in unconfirmed.stderr
    bulk = cli.json("dead-letters", "replay", "--queue", "mail", "--yes")
    assert bulk == {"replayed": 2, "skipped": 0, "over_cap": 0}
    assert cli.json("dead-letters", "list") == []
    closed = cli.json("dead-letters", "list", "--status", "all")
    assert sorted(d["resolution"] for d in closed) == [
        "discarded",
        "replayed",
        "replayed",
        "replayed",
    ]
    verified = cli.json("ledger", "verify")
    assert (verified["checked"], verified["mismatches"]) == (4, [])


def test_discarding_two_dead_letters_by_id_asks_first(cli: Cli, api: Api) -> None:
    quarantine(api, "mail", 2)
    given = [d["dead_letter_id"] for d in cli.json("dead-letters", "list")]
    unconfirmed = cli.run("dead-letters", "discard", *given, ok=False)
    assert unconfirmed.returncode == 2  # usage: --yes is needed without a terminal
    assert "Confirmation needed" in unconfirmed.stderr
    assert [d["dead_letter_id"] for d in cli.json("dead-letters", "list")] == given


def test_dead_letters_named_by_id_and_all_at_once_is_refused_as_ambiguous(
    cli: Cli, api: Api
) -> None:
    quarantine(api, "mail", 2)
    first = cli.json("dead-letters", "list")[0]["dead_letter_id"]
    for command in ("replay", "discard"):
        refused = cli.run("dead-letters", command, first, "--all", "--yes", ok=False)
        assert refused.returncode == 2, refused.stdout
        assert "Ambiguous" in refused.stderr
    assert len(cli.json("dead-letters", "list")) == 2


def test_a_closed_dead_letter_is_still_shown_by_the_start_of_its_id(cli: Cli, api: Api) -> None:
    quarantine(api, "mail", 1)
    (dead,) = cli.json("dead-letters", "list")
    cli.json("dead-letters", "replay", dead["dead_letter_id"])
    shown = cli.json("dead-letters", "show", dead["dead_letter_id"][:8])
    assert (shown["dead_letter"]["dead_letter_id"], shown["dead_letter"]["resolution"]) == (
        dead["dead_letter_id"],
        "replayed",
    )


def test_spend_approval_and_ledger_verification(cli: Cli, api: Api, db: DB) -> None:
    approved = cli.json(
        "spend",
        "approve",
        "mail",
        "--max-concurrency",
        "3",
        "--expires",
        "2h",
        "--reason",
        "launch",
    )
    operator_key = api.operator.get("/v1/whoami").json()["key_id"]
    assert (approved["max_concurrency"], approved["approved_by"]) == (3, operator_key)
    assert approved["approved_by_role"] == "operator"
    shown = cli.json("spend", "show", "mail")
    assert (shown["limit"], shown["approval"]["approved_by"]) == (3, operator_key)
    assert operator_key in cli.run("spend", "show", "mail").stdout
    listed = cli.run("spend", "list", "mail", "--wide").stdout
    assert approved["approval_id"] in listed
    # A prefix names the approval; the queue is back to one lease at a time.
    revoked = cli.run("spend", "revoke", "mail", approved["approval_id"][:8]).stdout
    assert "revoked" in revoked
    assert "limit is now 1" in revoked
    assert cli.json("spend", "show", "mail")["limit"] == 1
    gone = cli.run(
        "spend",
        "approve",
        "mail",
        "--max-concurrency",
        "3",
        "--expires",
        "2h",
        "--approved-by",
        "ana@example.com",
        "--reason",
        "launch",
        ok=False,
    )
    assert gone.returncode != 0
    assert "--approved-by" in gone.stderr
    far = cli.run(
        "spend",
        "approve",
        "mail",
        "--max-concurrency",
        "3",
        "--expires",
        "400d",
        "--reason",
        "launch",
        ok=False,
    )
    assert "expires_at" in far.stderr

    item = api.enqueue("mail", "x")
    assert "1 items verified" in cli.run("ledger", "verify").stdout
    db.execute("UPDATE work_items SET priority = 99 WHERE item_id = %s", (item["item_id"],))
    broken = cli.run("ledger", "verify", role="admin", ok=False)
    assert broken.returncode == 1
    assert "priority" in broken.stdout
    assert str(item["item_id"]) in broken.stdout


def test_operator_lists_and_cancels_items_and_pauses_a_queue(cli: Cli, db: DB) -> None:
    api = cli.api
    mine = [api.enqueue("emails", {"customer": 42, "n": i}) for i in range(3)]
    other = api.enqueue("emails", {"customer": 7})
    listed = cli.json("items", "list", "--queue", "emails", "--payload", '{"customer": 42}')
    assert [i["item_id"] for i in listed] == [i["item_id"] for i in mine][::-1]  # newest first
    table = cli.run("items", "list", "--state", "ready").stdout
    assert "4 items" in table

    one = cli.json("items", "cancel", str(mine[0]["item_id"]), "--reason", "asked")
    assert one[0]["state"] == "cancelled"
    rest = cli.json(
        "items", "cancel-matching", "--payload", '{"customer": 42}', "--batch", "1", "--yes"
    )
    assert rest == {"cancelled": 2}
    states = db.execute(
        "SELECT state::text AS s, count(*) AS n FROM work_items GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert states == [{"s": "cancelled", "n": 3}, {"s": "ready", "n": 1}]
    assert str(other["item_id"]) in cli.run("items", "list", "--state", "ready").stdout

    paused = cli.json("queues", "pause", "emails", "--reason", "provider outage")
    assert paused["paused"] is True
    assert api.acquire("emails") == []
    assert "provider outage" in cli.run("queues", "show", "emails").stdout
    assert cli.json("queues", "resume", "emails")["paused"] is False
    assert len(api.acquire("emails")) == 1
