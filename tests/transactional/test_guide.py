"""Every example of docs/transactional-enqueue.md, run as written against a real PostgreSQL
as the application's own role (the psql session through psql, each Python example in a
process of its own), checked by what the API then shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from queue_server.infra.embedded import EmbeddedPostgres
from tests.helpers.api import Api
from tests.helpers.roles import Roles

DB = psycopg.Connection[dict[str, object]]
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "transactional-enqueue.md"
BLOCK = re.compile(r"<!-- example: (\S+) -->\n```(?:python|sql)\n(.*?)```", re.DOTALL)


def examples() -> dict[str, str]:
    return dict(BLOCK.findall(GUIDE.read_text()))


def items(api: Api, queue: str) -> list[dict[str, object]]:
    response = api.operator.get("/v1/tenants/acme/items", params={"queue": queue})
    assert response.status_code == 200, response.text
    found: list[dict[str, object]] = response.json()["items"]
    return found


@pytest.mark.slow
def test_every_example_of_the_guide_runs_as_written(
    api: Api, db: DB, roles: Roles, pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    code = examples()
    assert set(code) == {
        "session.sql",
        "orders_psycopg.py",
        "orders_async.py",
        "orders_sqlalchemy.py",
        "orders_traced.py",
    }
    app = roles.make("acme")
    for name, text in code.items():
        (tmp_path / name).write_text(text)

    # psql, as the role: the rolled-back transaction leaves nothing, the committed one an item.
    psql = subprocess.run(
        [str(pg.bin_dir / "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-f", "session.sql", app.url],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert psql.returncode == 0, psql.stderr
    [item] = items(api, "emails")
    assert item["payload"] == {"order": 1}
    assert db.execute("SELECT count(*) AS n FROM orders").fetchone() == {"n": 1}
    lease = api.acquire("emails")
    assert [entry["item_id"] for entry in lease] == [item["item_id"]]

    env = {"DATABASE_URL": app.url, "PATH": os.environ.get("PATH", "")}

    def run(name: str) -> str:
        done = subprocess.run(
            [sys.executable, name], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    # psycopg: ada's order and email commit; mallory's roll back together.
    # (A rolled-back INSERT still takes its identity value: psql's took 1, mallory's 4.)
    assert run("orders_psycopg.py") == "3 None"
    # asyncio: one email and two invoice pages, in one transaction.
    item_id, pages = run("orders_async.py").split()
    assert pages == "2"
    # SQLAlchemy: linus commits, eve rolls back.
    assert run("orders_sqlalchemy.py") == "done"
    # OpenTelemetry: tim's receipt is in the trace of the span it was enqueued in.
    receipt_id, trace_id = run("orders_traced.py").split()

    orders = db.execute("SELECT order_id, customer FROM orders ORDER BY order_id").fetchall()
    assert [o["customer"] for o in orders] == ["ada", "ada", "grace", "linus", "tim"]
    emails = {str(i["item_id"]): i["payload"] for i in items(api, "emails")}
    assert sorted(p["order"] for p in emails.values()) == [1, 3, 5, 6]  # type: ignore[index]
    assert emails[item_id] == {"order": 5}
    invoices = items(api, "invoices")
    assert sorted(i["payload"]["page"] for i in invoices) == [1, 2]  # type: ignore[index]
    [receipt] = api.acquire("receipts")
    assert receipt["item_id"] == receipt_id
    assert receipt["payload"] == {"order": orders[-1]["order_id"]}
    trace = receipt["trace"]
    assert isinstance(trace, dict)
    assert trace["traceparent"].split("-")[1] == trace_id
