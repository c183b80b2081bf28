"""`dead-letters replay --queue` at the backlog cap: what fits, and a clear account of the rest."""

from __future__ import annotations

import json

from tests.helpers.api import Api
from tests.helpers.cli import Cli, quarantine


def test_bulk_replay_stops_at_the_cap_reports_what_is_left_and_exits_1(cli: Cli, api: Api) -> None:
    quarantine(api, "mail", 4)
    quarantine(api, "news", 2)
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 3})
    done = cli.run("dead-letters", "replay", "--all", "--yes", "--json", ok=False)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout) == {"replayed": 3, "skipped": 0, "over_cap": 3}
    assert "backlog cap is reached" in done.stderr
    assert api.admin.get("/v1/tenants/acme").json()["backlog"] == 3
    assert len(cli.json("dead-letters", "list")) == 3
