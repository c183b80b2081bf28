"""Backups and point-in-time restore of the embedded database, on real processes: `serve
--backup-repo` streaming WAL into a Barman repository, `queue-server backup create` (full and
incremental), `backup check`, `/metrics`, then an operator's mistake, a stop, `queue-server
restore --to T` into a new directory and a server on it; and the refusals of each command."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from queue_server.infra import backup
from tests.helpers import web
from tests.helpers.items import sample
from tests.helpers.serving import Served, environment, open_dir, run


def _enqueue(admin: httpx.Client, tenant: str, numbers: range) -> dict[str, dict[str, Any]]:
    """One request per item, each with its own idempotency key (`e<n>`): {key: answer}."""
    answers = {}
    for n in numbers:
        key = f"e{n}"
        r = admin.post(
            f"/v1/tenants/{tenant}/queues/q/items",
            json={"payload": {"n": n}},
            headers={"Idempotency-Key": key},
        )
        assert r.status_code == 201, r.text
        answers[key] = r.json()
    return answers


def _complete(admin: httpx.Client, tenant: str, count: int, prefix: str) -> dict[str, Any]:
    """Lease and complete `count` items, each completion with its key (`<prefix><n>`)."""
    answers = {}
    for n in range(count):
        leases = admin.post(
            f"/v1/tenants/{tenant}/queues/q/leases",
            json={"worker": "w1", "lease_ttl": 30, "max_items": 1},
        ).json()["leases"]
        (lease,) = leases
        key = f"{prefix}{n}"
        r = admin.post(
            f"/v1/tenants/{tenant}/items/{lease['item_id']}/complete",
            json={"worker": "w1", "fence": lease["fence"], "result": {"ok": n}},
            headers={"Idempotency-Key": key},
        )
        assert r.status_code == 200, r.text
        answers[key] = (lease, r.json())
    return answers


def _items(admin: httpx.Client, tenant: str) -> dict[str, tuple[str, int]]:
    """Every item of `tenant`: {item_id: (state, fence)}."""
    found: dict[str, tuple[str, int]] = {}
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        page = admin.get(f"/v1/tenants/{tenant}/items", params=params).json()
        found |= {i["item_id"]: (i["state"], i["fence"]) for i in page["items"]}
        cursor = page["next_cursor"]
        if cursor is None:
            return found


@pytest.mark.slow
def test_restore_to_a_moment_brings_back_everything_acknowledged_before_it_and_nothing_after() -> (
    None
):
    with open_dir("qs-backup-") as root:
        data, repo, new = root / "data", root / "repo", root / "restored"
        # Retention: the newest full backup (with the incremental ones on it).
        served = Served(data, "--backup-repo", str(repo), "--backup-retention", "1")
        try:
            served.wait_ready()
            admin = served.admin()
            # No backup yet: no age to show (an alert on its absence fires).
            scrape = admin.get("/metrics").text
            assert sample(scrape, "queue_server_backup_last_good_age_seconds") is None
            for tenant in ("acme", "other"):
                assert admin.put(f"/v1/tenants/{tenant}", json={"backlog_cap": 1000}).is_success
            first = run("backup", "create", "--data-dir", str(data), "--json")
            assert first.returncode == 0, first.stderr
            enqueued = _enqueue(admin, "acme", range(100))
            completed = _complete(admin, "acme", 5, "c")

            full = run("backup", "create", "--data-dir", str(data))
            assert full.returncode == 0, full.stderr
            assert "(full," in full.stdout
            # Past the retention: the first backup is gone.
            kept = [b.backup_id for b in backup.Repository(repo).backups()]
            assert json.loads(first.stdout)["backup_id"] not in kept
            assert len(kept) == 1
            enqueued |= _enqueue(admin, "acme", range(100, 130))
            incremental = run("backup", "create", "--incremental", "--data-dir", str(data))
            assert incremental.returncode == 0, incremental.stderr
            assert "(incremental," in incremental.stdout
            enqueued |= _enqueue(admin, "acme", range(130, 150))
            completed |= _complete(admin, "acme", 5, "d")

            scrape = admin.get("/metrics").text
            backup_age = sample(scrape, "queue_server_backup_last_good_age_seconds")
            wal_age = sample(scrape, "queue_server_backup_last_archived_wal_age_seconds")
            assert backup_age is not None, scrape
            assert 0 <= backup_age < 60
            assert wal_age is not None, scrape
            assert 0 <= wal_age < 60
            checked = run("backup", "check", "--data-dir", str(data), "--json")
            assert checked.returncode == 0, checked.stdout + checked.stderr
            listed = run("backup", "list", "--data-dir", str(data), "--json")
            kinds = [b["kind"] for b in json.loads(listed.stdout)["backups"]]
            assert kinds == ["full", "incremental"]

            before = _items(admin, "acme")
            ledgers = {
                item_id: admin.get(f"/v1/tenants/acme/items/{item_id}/ledger").json()
                for item_id in list(before)[::15]
            }
            time.sleep(0.3)
            moment = datetime.now(UTC)  # an operator notes the time
            time.sleep(0.3)
            # After the moment: work that must not come back, then the mistake.
            _enqueue(admin, "other", range(1000, 1001))
            assert admin.delete("/v1/tenants/acme").status_code == 204
            mistake = datetime.now(UTC)
            served.stop()
            assert served.proc.returncode == 0, served.output
        except BaseException:
            served.kill()
            raise
        # A stopped server's WAL is archived, to its last transaction.
        listed = run("backup", "list", "--data-dir", str(data), "--json")
        archived = json.loads(listed.stdout)["wal_archived_until"]
        assert datetime.fromisoformat(archived) >= mistake.replace(microsecond=0)
        # A base backup reads the running database.
        stopped = run("backup", "create", "--data-dir", str(data))
        assert stopped.returncode == 3
        assert "The database is not running" in stopped.stderr

        # Never over the live data directory, nor into a directory that holds something.
        env = environment(QUEUE_SERVER_DATA_DIR=str(data))
        live = run("restore", "--to", moment.isoformat(), "--data-dir", str(data), env=env)
        assert live.returncode == 2
        assert "live data directory" in live.stderr
        busy = run("restore", "--to", moment.isoformat(), "--data-dir", str(root), env=env)
        assert busy.returncode == 2
        # Nor inside the backup repository, refused before anything is made there.
        inside = run(
            "restore", "--to", moment.isoformat(), "--data-dir", str(repo / "restored"), env=env
        )
        assert inside.returncode == 2
        assert "backup repository" in inside.stderr
        assert not (repo / "restored").exists()
        too_early = run(
            "restore",
            "--to",
            (moment - timedelta(hours=1)).isoformat(),
            "--data-dir",
            str(new),
            env=env,
        )
        assert too_early.returncode == 1
        assert "no backup ended before" in too_early.stderr
        assert not new.exists()
        too_late = run(
            "restore",
            "--to",
            (moment + timedelta(hours=1)).isoformat(),
            "--data-dir",
            str(new),
            env=env,
        )
        assert too_late.returncode == 1
        assert "restore --to latest for everything it holds" in too_late.stderr
        assert not new.exists()  # nothing half-restored: the command can run again

        restored = run("restore", "--to", moment.isoformat(), "--data-dir", str(new), env=env)
        assert restored.returncode == 0, restored.stdout + restored.stderr
        assert f"queue-server serve --data-dir {new}" in restored.stdout
        assert (data / "pgdata").exists()  # the live one untouched

        server = Served(new)
        try:
            server.wait_ready()
            admin = server.admin()
            figures = admin.get("/v1/tenants/acme").json()
            assert (figures["ready"], figures["completed"], figures["backlog"]) == (140, 10, 140)
            assert _items(admin, "acme") == before  # every item, state and fence
            for item_id, ledger in ledgers.items():
                assert admin.get(f"/v1/tenants/acme/items/{item_id}/ledger").json() == ledger
            assert _items(admin, "other") == {}  # nothing from after the moment
            verified = run("ledger", "verify", "--data-dir", str(new))
            assert verified.returncode == 0, verified.stdout + verified.stderr
            assert "150 items verified" in verified.stdout

            # Receipts: a request retried by the key that sent it, with its Idempotency-Key,
            # replays its original answer (a receipt is its API key's: the restore's new admin
            # key would not replay it).
            old_key = (data / "admin.key").read_text().strip()
            sender = web.client(
                base_url=server.url, headers={"Authorization": f"Bearer {old_key}"}, timeout=30
            )
            again = sender.post(
                "/v1/tenants/acme/queues/q/items",
                json={"payload": {"n": 137}},
                headers={"Idempotency-Key": "e137"},
            )
            assert again.headers.get("idempotent-replayed") == "true"
            assert again.json() == enqueued["e137"]
            lease, answer = completed["d3"]
            replayed = sender.post(
                f"/v1/tenants/acme/items/{lease['item_id']}/complete",
                json={"worker": "w1", "fence": lease["fence"], "result": {"ok": 3}},
                headers={"Idempotency-Key": "d3"},
            )
            assert replayed.headers.get("idempotent-replayed") == "true"
            assert replayed.json() == answer
            # Fences: the next lease of an item goes above the fence it had.
            lease = admin.post(
                "/v1/tenants/acme/queues/q/leases", json={"worker": "w2", "lease_ttl": 30}
            ).json()["leases"][0]
            assert lease["fence"] == before[lease["item_id"]][1] + 1
            # The keys of the moment still work; the restore's new admin key too.
            assert web.get(
                f"{server.url}/v1/tenants/acme", headers={"Authorization": f"Bearer {old_key}"}
            ).is_success
            server.stop()
        except BaseException:
            server.kill()
            raise

        # A WAL segment lost from the repository is a gap `backup check` finds.
        segments = sorted((repo / "barman" / "queue-server" / "wals").glob("*/*"))
        lost = segments[len(segments) // 2]
        lost.unlink()
        checked = run("backup", "check", "--data-dir", str(data), "--json")
        assert checked.returncode == 1
        (archive,) = [
            c for c in json.loads(checked.stdout)["checks"] if c["check"] == "WAL archive complete"
        ]
        assert not archive["ok"]
        assert lost.name in archive["detail"]


def test_backup_commands_say_when_no_repository_is_configured(tmp_path: Path) -> None:
    for command in (["backup", "create"], ["backup", "check"]):
        done = run(*command, "--data-dir", str(tmp_path))
        assert done.returncode == 2, done.stderr
        assert "No backup repository is configured" in done.stderr
        assert "--backup-repo" in done.stderr
    done = run("restore", "--to", "latest", "--data-dir", str(tmp_path / "new"))
    assert done.returncode == 2
    assert "No backup repository is configured" in done.stderr
    done = run("backup", "list", "--backup-repo", str(tmp_path))
    assert done.returncode == 2
    assert "is not a backup repository" in done.stderr


def test_restore_refuses_a_time_it_cannot_read(tmp_path: Path) -> None:
    done = run("restore", "--to", "yesterday noon", "--data-dir", str(tmp_path / "new"))
    assert done.returncode == 2
    assert "neither `latest` nor a time" in done.stderr


def test_serve_refuses_a_retention_it_cannot_read(tmp_path: Path) -> None:
    done = run(
        "serve",
        "--data-dir",
        str(tmp_path),
        "--backup-repo",
        str(tmp_path / "r"),
        "--backup-retention",
        "a week",
    )
    assert done.returncode == 2
    assert "is not a retention" in done.stderr
    assert not (tmp_path / "pgdata").exists()  # refused before anything started


@pytest.mark.parametrize(
    ("given", "policy"),
    [
        ("7d", "RECOVERY WINDOW OF 7 DAYS"),
        ("4w", "RECOVERY WINDOW OF 4 WEEKS"),
        ("6M", "RECOVERY WINDOW OF 6 MONTHS"),
        ("3", "REDUNDANCY 3"),
        ("", None),
    ],
)
def test_retention_becomes_barmans_policy(given: str, policy: str | None) -> None:
    assert backup.parse_retention(given) == policy


@pytest.mark.slow
def test_restore_after_a_crash_keeps_what_the_receiver_streamed_before_it() -> None:
    with open_dir("qs-crash-") as root:
        data, repo, new = root / "data", root / "repo", root / "restored"
        served = Served(data, "--backup-repo", str(repo))
        try:
            served.wait_ready()
            admin = served.admin()
            assert admin.put("/v1/tenants/acme", json={"backlog_cap": 1000}).is_success
            made = run("backup", "create", "--data-dir", str(data))
            assert made.returncode == 0, made.stderr
            # Acknowledged after the backup, in a WAL segment that never filled up.
            enqueued = _enqueue(admin, "acme", range(20))
            acknowledged = time.time()
            # The receiver streams asynchronously: what it had not received is lost (the RPO).
            wal = backup.Repository(repo)
            deadline = time.monotonic() + 10
            while (wal.last_wal_at() or 0) < acknowledged - 0.05 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            served.kill()  # the machine dies: no stop, no last switch of the WAL segment
        env = environment(QUEUE_SERVER_DATA_DIR=str(data))
        restored = run("restore", "--to", "latest", "--data-dir", str(new), env=env)
        assert restored.returncode == 0, restored.stdout + restored.stderr
        server = Served(new)
        try:
            server.wait_ready()
            items = _items(server.admin(), "acme")
            assert sorted(items) == sorted(a["item_id"] for a in enqueued.values())
            server.stop()
        except BaseException:
            server.kill()
            raise
        # Served again without the repository: nothing reads the slot, which would keep
        # every WAL segment from then on; it goes.
        again = Served(data)
        try:
            again.wait_ready()
            output = again.stop()
        except BaseException:
            again.kill()
            raise
        assert "dropped the replication slot queue_server_backup" in output
        assert not (data / "backup.repo").exists()
