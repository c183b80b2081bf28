"""The stumbles of a newcomer's first hour with the CLI, each held by a test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import psycopg
import pytest
import typer.main

from queue_server.cli.common import EXIT_CODES_HELP
from queue_server.cli.enqueue import Journal
from queue_server.cli.main import app
from queue_server.infra import address
from queue_server.infra.address import ADDRESS_FILE
from tests.helpers.api import Api
from tests.helpers.cli import BIN, Cli, quarantine

DB = psycopg.Connection[dict[str, object]]
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _command_paths(command: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield prefix
    for name, sub in getattr(command, "commands", {}).items():
        yield from _command_paths(sub, (*prefix, name))


@pytest.mark.slow
def test_help_shows_no_value_hint_on_flags_and_every_command_documents_its_exit_codes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(*args: str) -> str:
        done = subprocess.run([str(BIN), *args], capture_output=True, text=True, check=True)
        return done.stdout

    assert re.fullmatch(r"queue-server \d+\.\d+\.\d+\S*\n", run("--version"))
    top = " ".join(run("--help").split())
    assert EXIT_CODES_HELP.split(";")[0] in top
    assert "(server.url, admin.key)" in top  # how the CLI finds a local server
    # Every command and group of the tree, through the same entry point, in this process.
    monkeypatch.setenv("COLUMNS", "200")
    commands = list(_command_paths(typer.main.get_command(app)))
    assert len(commands) > 40
    helps = {}
    for command in commands:
        with pytest.raises(SystemExit) as exited:
            app([*command, "--help"], prog_name="queue-server")
        assert exited.value.code == 0, command
        raw = capsys.readouterr().out
        helps[command] = raw
        text = " ".join(raw.split())
        assert "<bool>" not in text, command
        assert "Exit status: 0 done; 1 failures" in text, command
        assert "3 the server unreachable or unavailable; 4 refused" in text, command
    # a docstring's line breaks are not the terminal's: its paragraphs flow
    assert "so re-running the same file, with any --batch-size, sends" in helps[("enqueue",)]
    with pytest.raises(SystemExit):
        app(["status", "--help"], prog_name="queue-server")
    assert "--json Print JSON" in " ".join(capsys.readouterr().out.split())


def test_a_mistyped_command_is_told_the_command_it_meant(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A command builds only the group it names; a name it does not know gets the whole
    # tree, so that the suggestion can come from every command.
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exited:
        app(["itemz", "list"], prog_name="queue-server")
    assert exited.value.code == 2
    assert "No such command 'itemz'. Did you mean 'items'?" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        app(["dead-leters"], prog_name="queue-server")
    assert "Did you mean 'dead-letters'?" in capsys.readouterr().err


# What the installed command runs, then what it left of the garbage collector.
_ENTRY = """
import gc, sys
from queue_server.cli.entry import main
sys.argv = ["queue-server", "--version"]
try:
    main()
except SystemExit:
    pass
print(gc.isenabled(), gc.get_freeze_count())
"""


def test_the_command_starts_without_collecting_and_leaves_the_collector_on() -> None:
    # The CLI is imported with the collector off (a fourth of a command's start) and what
    # it imported is frozen; the collector is on again for the command: `serve` and `work`
    # run for days and must collect their garbage.
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "queue-server"]
    assert script.value == "queue_server.cli.entry:main"
    done = subprocess.run(
        [sys.executable, "-c", _ENTRY], capture_output=True, text=True, check=True, timeout=60
    )
    enabled, frozen = done.stdout.splitlines()[-1].split()
    assert enabled == "True"
    assert int(frozen) > 50_000  # the modules, classes and functions of the CLI's import


def test_the_cli_finds_the_address_a_local_server_wrote_beside_its_key(cli: Cli, api: Api) -> None:
    data_dir = cli.cwd / "data"
    port = int(api.url.rsplit(":", 1)[1])
    env = {k: v for k, v in cli.env.items() if k != "QUEUE_SERVER_URL"}
    cli.env = env
    # What `serve --host 0.0.0.0` writes, held while it serves.
    with address.published(data_dir, "0.0.0.0", port):
        assert (data_dir / ADDRESS_FILE).read_text() == f"http://127.0.0.1:{port}\n"
        assert cli.json("status")["tenant"] == "acme"
    # Its server gone, the address is stale: the default port, where nobody listens.
    assert (data_dir / ADDRESS_FILE).exists()
    gone = cli.run("status", ok=False)
    assert gone.returncode == 3
    assert "127.0.0.1:8080" in gone.stderr
    (data_dir / ADDRESS_FILE).unlink()  # no address: the same
    assert cli.run("status", ok=False).returncode == 3


def test_data_dir_names_where_serve_writes_the_address_and_the_key(tmp_path: Path) -> None:
    """The guides read server.url and admin.key from `queue-server data-dir`, which must be
    where `serve` puts them for the same user and environment (root's default differs)."""
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}

    def data_dir(extra: dict[str, str]) -> str:
        done = subprocess.run(
            [str(BIN), "data-dir"], env={**env, **extra}, capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    expected = (
        "/var/lib/queue-server" if os.geteuid() == 0 else f"{tmp_path}/.local/share/queue-server"
    )
    assert data_dir({}) == expected
    assert data_dir({"QUEUE_SERVER_DATA_DIR": str(tmp_path / "qs")}) == str(tmp_path / "qs")


def test_tenants_put_changes_only_the_given_fields_and_asks_before_a_cap_below_the_backlog(
    cli: Cli, api: Api
) -> None:
    # setup_tenant made acme with a default budget of 3
    changed = cli.json("tenants", "put", "acme", "--backlog-cap", "500", role="admin")
    assert (changed["backlog_cap"], changed["default_max_acquisitions"]) == (500, 3)
    shown = cli.run("tenants", "put", "acme", "--default-lease-ttl", "20", role="admin").stdout
    assert "20s (was 30s)" in shown
    replaced = cli.json("tenants", "put", "acme", "--backlog-cap", "400", "--replace", role="admin")
    assert (replaced["default_max_acquisitions"], replaced["default_lease_ttl"]) == (5, 30.0)
    nothing = cli.run("tenants", "put", "acme", role="admin", ok=False)
    assert nothing.returncode == 2
    new_without_cap = cli.run("tenants", "put", "initech", role="admin", ok=False)
    assert new_without_cap.returncode == 2
    assert "--backlog-cap" in new_without_cap.stderr

    for n in range(3):
        api.enqueue("q", n)
    refused = cli.run("tenants", "put", "acme", "--backlog-cap", "2", role="admin", ok=False)
    assert refused.returncode == 2
    assert "3 items in its backlog" in refused.stderr
    assert cli.json("tenants", "show", "acme", role="admin")["backlog_cap"] == 400
    declined = cli.run(
        "tenants", "put", "acme", "--backlog-cap", "2", role="admin", input="n\n", ok=False
    )
    assert declined.returncode in (1, 2)  # asked only on a terminal; never lowered
    assert cli.json("tenants", "show", "acme", role="admin")["backlog_cap"] == 400
    lowered = cli.json("tenants", "put", "acme", "--backlog-cap", "2", "--yes", role="admin")
    assert lowered["backlog_cap"] == 2


def test_a_reload_with_another_batch_size_adds_nothing_and_says_so(cli: Cli, db: DB) -> None:
    path = cli.cwd / "load.jsonl"
    path.write_text("".join(f'{{"n": {n}}}\n' for n in range(300)))
    first = cli.json("enqueue", "jobs", "--file", str(path), "--batch-size", "100")
    assert (first["count"], first["already_loaded"]) == (300, 0)
    again = cli.run("enqueue", "jobs", "--file", str(path), "--batch-size", "7")
    assert "0 items enqueued" in again.stdout
    assert "300 lines were already loaded" in again.stdout
    with path.open("a") as handle:
        handle.write('{"n": 300}\n{"n": 301}\n')
    more = cli.json("enqueue", "jobs", "--file", str(path), "--batch-size", "500")
    assert (more["count"], more["already_loaded"]) == (2, 300)
    row = db.execute("SELECT count(*) AS n FROM work_items").fetchone()
    assert row is not None
    assert row["n"] == 302


def test_a_batch_cut_off_by_a_crash_is_replayed_not_enqueued_twice(cli: Cli, db: DB) -> None:
    path = cli.cwd / "load.jsonl"
    path.write_text("".join(f'{{"n": {n}}}\n' for n in range(10)))
    first = cli.json("enqueue", "jobs", "--file", str(path), "--batch-size", "4")
    assert first["count"] == 10
    # The journal as a crash between the request and its `done` record leaves it.
    (journal,) = (cli.cwd / ".local" / "state" / "queue-server" / "loads").iterdir()
    records = journal.read_text().splitlines()
    journal.write_text("\n".join(records[:-1]) + "\n")
    # Batches of one now: the batch cut off is sent again as it was, under its own key.
    again = cli.json("enqueue", "jobs", "--file", str(path), "--batch-size", "1")
    assert (again["count"], again["already_loaded"]) == (0, 10)
    row = db.execute("SELECT count(*) AS n FROM work_items").fetchone()
    assert row is not None
    assert row["n"] == 10


def test_a_load_counts_lines_by_number_and_content_and_reads_past_a_torn_journal_record(
    cli: Cli, db: DB
) -> None:
    path = cli.cwd / "load.jsonl"
    # Three lines alike are three items; a line of spaces is no line.
    path.write_text('{"n": 1}\n{"n": 1}\n   \n{"n": 1}\n{"n": 2}\n')
    first = cli.json("enqueue", "jobs", "--file", str(path), "--batch-size", "2")
    assert (first["count"], first["already_loaded"]) == (4, 0)
    # An edited line is a new line; the others stay loaded.
    path.write_text('{"n": 1}\n{"n": 1}\n   \n{"n": 1}\n{"n": 3}\n')
    edited = cli.json("enqueue", "jobs", "--file", str(path), "--batch-size", "2")
    assert (edited["count"], edited["already_loaded"]) == (1, 3)
    # A record torn by a crash, then a later run's records after it: those still count.
    (journal,) = (cli.cwd / ".local" / "state" / "queue-server" / "loads").iterdir()
    with journal.open("a") as handle:
        handle.write('{"state": "sen')
    with path.open("a") as handle:  # and a line like one loaded before: a line of its own
        handle.write('{"n": 4}\n{"n": 1}\n')
    added = cli.json("enqueue", "jobs", "--file", str(path), "--batch-size", "1")
    assert (added["count"], added["already_loaded"]) == (2, 4)
    again = cli.json("enqueue", "jobs", "--file", str(path), "--batch-size", "3")
    assert (again["count"], again["already_loaded"]) == (0, 6)
    payloads = db.execute("SELECT payload->>'n' AS n FROM work_items ORDER BY 1").fetchall()
    assert [r["n"] for r in payloads] == ["1", "1", "1", "1", "2", "3", "4"]
    # A line's own keys go with its item.
    with path.open("a") as handle:
        handle.write('{"payload": {"n": 5}, "unique_key": "u-5", "partition_key": "cust-5"}\n')
    cli.json("enqueue", "jobs", "--file", str(path))
    keyed = db.execute(
        "SELECT unique_key, partition_key FROM work_items WHERE payload->>'n' = '5'"
    ).fetchone()
    assert keyed == {"unique_key": "u-5", "partition_key": "cust-5"}


def test_a_record_written_after_a_torn_one_starts_a_line_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    load = tmp_path / "load.jsonl"
    journal = Journal("http://qs", "acme", "jobs", load)
    journal.write("done", ["1:a"])
    with journal.path.open("a") as handle:
        handle.write('{"state": "sen')  # a crash in the middle of a record
    Journal("http://qs", "acme", "jobs", load).write("sending", ["2:b"])
    # Else the batch in flight would be lost with the torn record, and sent again under
    # another key if the next run cuts its batches otherwise.
    read = Journal("http://qs", "acme", "jobs", load)
    assert (read.done, read.sending) == ({"1:a"}, {"2:b": ["2:b"]})


def test_a_load_refused_at_the_cap_says_how_far_it_got_and_the_same_command_finishes_it(
    cli: Cli,
) -> None:
    cli.run("tenants", "put", "acme", "--backlog-cap", "5", "--yes", role="admin")
    path = cli.cwd / "load.jsonl"
    path.write_text("".join(f'{{"n": {n}}}\n' for n in range(8)))
    refused = cli.run("enqueue", "jobs", "--file", str(path), "--batch-size", "3", ok=False)
    assert refused.returncode == 4
    assert "3 of 8 lines of" in refused.stderr
    assert "backlog-cap-reached" in refused.stderr
    cli.run("tenants", "put", "acme", "--backlog-cap", "100", role="admin")
    rest = cli.json("enqueue", "jobs", "--file", str(path), "--batch-size", "3")
    assert (rest["count"], rest["already_loaded"]) == (5, 3)


def test_validation_errors_keep_the_servers_reason_and_exit_4(cli: Cli) -> None:
    refused = cli.run(
        "enqueue", "jobs", "--payload", "1", "--priority", "99999999", role="worker", ok=False
    )
    assert refused.returncode == 4
    message = " ".join(refused.stderr.split())
    assert "body.priority" in message
    assert "body.priority: Input should be less than or equal to 1000000" in message
    assert message.count("body.priority") == 1  # the reason, not the field named twice


def test_tables_keep_ids_whole_at_80_columns_and_times_carry_their_zone(cli: Cli, api: Api) -> None:
    cli.env["COLUMNS"] = "80"
    item = api.enqueue("mail", {"to": "a@example.com"})
    (lease,) = api.acquire("mail")
    api.holder(
        "triage",
        item["item_id"],
        worker="w1",
        fence=lease["fence"],
        failure={"class": "SMTPError", "message": "mailbox unavailable", "transient": False},
        decision="quarantine",
    )
    (dead,) = cli.json("dead-letters", "list")
    listed = cli.run("dead-letters", "list").stdout
    assert dead["dead_letter_id"] in listed
    assert all(len(line) <= 80 for line in listed.splitlines())
    assert "SMTPError:" in listed
    assert "unavailable" in listed  # the failure, wrapped
    assert "--wide" in listed  # it says which columns it left out
    wide = cli.run("dead-letters", "list", "--wide").stdout
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (UTC|[A-Z]{3,5}|[+-]\d{4})", wide)
    assert cli.run("dead-letters", "list", "--quiet").stdout == dead["dead_letter_id"] + "\n"

    api.enqueue("emails", 1)
    status = cli.run("status").stdout
    assert "concurrency" in status  # a heading wraps between words, never inside one
    assert all(len(line) <= 80 for line in status.splitlines())

    hook = cli.json(
        "watchers", "create", "https://8.8.8.8/hooks/queue/receive/events", "-e",
        "item.completed",
    )  # fmt: skip
    watchers = cli.run("watchers", "list").stdout
    assert hook["watcher_id"] in watchers
    assert all(len(line) <= 80 for line in watchers.splitlines())


def test_an_unambiguous_id_prefix_names_the_item_dead_letter_or_watcher(cli: Cli, api: Api) -> None:
    item = api.enqueue("mail", "x")
    item_id = str(item["item_id"])
    assert cli.json("items", "show", item_id[:18])["item_id"] == item_id
    assert cli.json("items", "ledger", item_id[:18])[0]["kind"] == "enqueued"
    other = api.enqueue("mail", "y")
    common = 0
    while item_id[common] == str(other["item_id"])[common]:
        common += 1
    ambiguous = cli.run("items", "show", item_id[: max(common, 4)], ok=False)
    assert ambiguous.returncode == 4
    assert "ambiguous-id" in ambiguous.stderr or "not found" in ambiguous.stderr.lower()
    missing = cli.run("items", "show", "ffffffff-ff", ok=False)
    assert missing.returncode == 4

    hook = cli.json("watchers", "create", "https://8.8.8.8/a", "-e", "item.completed")
    shown = cli.json("watchers", "show", hook["watcher_id"][:8])
    assert shown["watcher_id"] == hook["watcher_id"]
    (lease,) = api.acquire("mail")
    api.holder(
        "triage", lease["item_id"], worker="w1", fence=lease["fence"],
        failure={"class": "E", "message": "m", "transient": False}, decision="quarantine",
    )  # fmt: skip
    (dead,) = cli.json("dead-letters", "list")
    detail = cli.json("dead-letters", "show", dead["dead_letter_id"][:10])
    assert detail["dead_letter"]["dead_letter_id"] == dead["dead_letter_id"]
    assert cli.run("dead-letters", "show", str(uuid.uuid4())[:8], ok=False).returncode == 4


def test_a_dead_letter_id_start_two_share_is_refused_and_its_end_names_one(
    cli: Cli, api: Api
) -> None:
    quarantine(api, "mail", 17)
    listed = [d["dead_letter_id"] for d in cli.json("dead-letters", "list")]
    # Seventeen ids of sixteen possible first digits: two of them start alike.
    shared = next(c for c in "0123456789abcdef" if sum(i.startswith(c) for i in listed) > 1)
    for command in ("show", "replay", "discard"):
        refused = cli.run("dead-letters", command, shared, ok=False)
        assert refused.returncode == 4, refused.stdout
        assert f"Ambiguous dead letter id {shared!r}" in " ".join(refused.stderr.split())
    assert len(cli.json("dead-letters", "list")) == 17
    # The end of an id names it, as the start of one does.
    one = listed[5]
    assert cli.json("dead-letters", "show", one[-8:])["dead_letter"]["dead_letter_id"] == one


def test_status_shows_completed_only_queues_and_who_holds_each_lease_since_when(
    cli: Cli, api: Api
) -> None:
    done = api.enqueue("finished", "x")
    (lease,) = api.acquire("finished")
    response = api.holder("complete", done["item_id"], worker="w1", fence=lease["fence"])
    assert response.status_code == 200, response.text
    held = api.enqueue("busy", "y")
    api.acquire("busy", worker="worker-7")
    status = cli.json("status")
    by_queue = {q["queue"]: q for q in status["queues"]}
    assert by_queue["finished"]["completed"] == 1
    (holder,) = status["leases"]
    assert (holder["item_id"], holder["worker"]) == (held["item_id"], "worker-7")
    assert holder["acquired_at"] is not None
    text = cli.run("status", "--wide").stdout
    assert "finished" in text
    assert "worker-7" in text
    assert str(held["item_id"]) in text


@pytest.mark.slow
def test_tenants_list_and_keys_list(cli: Cli, api: Api) -> None:
    cli.run("tenants", "put", "globex", "--backlog-cap", "5", role="admin")
    assert cli.run("tenants", "list", "--quiet", role="admin").stdout.split() == ["acme", "globex"]
    for n in range(2):
        api.enqueue("q", n)
    listed_tenants = {t["tenant"]: t for t in cli.json("tenants", "list", role="admin")}
    assert (listed_tenants["acme"]["backlog"], listed_tenants["globex"]["backlog"]) == (2, 0)
    assert "globex" in cli.run("tenants", "list", role="admin").stdout
    keys = cli.json("keys", "list", "acme", role="admin")
    assert sorted(k["role"] for k in keys) == ["operator", "worker"]
    assert all("secret" not in k for k in keys)
    listed = cli.run("keys", "list", "acme", role="admin").stdout
    assert all(k["key_id"] in listed for k in keys)
    cli.run("keys", "revoke", "acme", keys[0]["key_id"][:6], role="admin")  # a prefix
    assert len(cli.json("keys", "list", "acme", role="admin")) == 1
    assert len(cli.json("keys", "list", "acme", "--revoked", role="admin")) == 2
    assert cli.run("keys", "revoke", "acme", "zz", role="admin", ok=False).returncode == 4
    assert cli.run("keys", "list", "acme", role="operator", ok=False).returncode == 4
    secret = cli.run("keys", "create", "acme", "--quiet", role="admin").stdout
    assert re.fullmatch(r"qsk_\S+\n", secret)
