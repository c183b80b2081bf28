"""The alert rules of deploy/prometheus/: promtool checks and tests them, every alert is seen
firing and seen quiet with a runbook section of its own, and every series they read is one
the server exports, with the objectives read from the server's settings."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from queue_server.settings import Settings
from tests.helpers.api import Api
from tests.helpers.items import sample
from tests.helpers.watchers import register

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "queue-server.rules.yml"
TESTS = ROOT / "deploy" / "prometheus" / "queue-server.tests.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"
Db = psycopg.Connection[dict[str, object]]


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: `make test` installs Debian's prometheus, which has it")
    return found


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in _rules() if "alert" in rule}


def test_promtool_checks_the_rules_and_their_tests_pass() -> None:
    promtool = _promtool()
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", TESTS.name],
        cwd=TESTS.parent, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_is_tested_firing_and_quiet_and_has_a_runbook_section() -> None:
    cases = [
        case
        for test in yaml.safe_load(TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("## ")
    }
    alerts = _alerts()
    assert len(alerts) >= 12
    for name, rule in alerts.items():
        firing = [c for c in cases if c["alertname"] == name and c["exp_alerts"]]
        quiet = [c for c in cases if c["alertname"] == name and not c["exp_alerts"]]
        assert firing, f"{name} is never seen firing"
        assert quiet, f"{name} is never seen quiet"
        anchor = rule["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor == name.lower()
        assert anchor in headings, f"docs/runbook.md has no section `## {name}`"
        assert rule["labels"]["severity"] in ("page", "ticket")


def _exported(text: str) -> set[str]:
    """The names a scrape's samples can have: each family's, with its type's suffixes."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            suffixes = {
                "counter": ("_total", "_created"),
                "histogram": ("_bucket", "_count", "_sum", "_created"),
            }.get(kind, ("",))
            names.update(name.removesuffix("_total") + suffix for suffix in suffixes)
            names.add(name)
    return names


def test_the_rules_read_only_series_the_server_exports(api: Api) -> None:
    api.enqueue("q")
    api.acquire("q")
    exported = _exported(api.admin.get("/metrics").text)
    read = {
        name
        for rule in _rules()
        for name in re.findall(r"\b(queue_server_[a-z_]+)\b", rule["expr"])
    }
    assert {"queue_server_late_leases_total", "queue_server_slo_objective"} <= read
    assert read - exported == set()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Objectives of their own, to be seen in the scrape."""
    return Settings(
        data_dir=tmp_path,
        poll_interval=0.2,
        lock_timeout_ms=2000,
        slo_lease_wait_seconds=5.0,
        slo_lease_wait_target=0.95,
        slo_delivery_lag_seconds=120.0,
        transport_allow=["127.0.0.1"],  # the watcher below: nothing delivers to it here
    )


def test_a_lease_later_than_the_objective_after_its_item_was_due_is_counted_late(
    api: Api, db: Db
) -> None:
    late = api.enqueue("mail")
    just_late = api.enqueue("mail")
    api.enqueue("mail")
    # The first item has been due for a minute, the second for 7 s (the objective is 5 s):
    # whoever leases them now is late.
    for item, seconds in ((late, 60), (just_late, 7)):
        db.execute(
            "UPDATE work_items SET available_at = available_at - make_interval(secs => %s)"
            " WHERE item_id = %s",
            (seconds, item["item_id"]),
        )
    api.approve("mail", 3)
    assert len(api.acquire("mail", max_items=3)) == 3
    text = api.operator.get("/metrics").text
    assert sample(text, "queue_server_lease_wait_seconds_count", tenant="acme", queue="mail") == 3
    assert sample(text, "queue_server_late_leases_total", tenant="acme", queue="mail") == 2
    waited = sample(text, "queue_server_lease_wait_seconds_sum", tenant="acme", queue="mail")
    assert waited is not None
    assert 67 <= waited < 97
    assert sample(text, "queue_server_slo_objective", objective="lease_wait_seconds") == 5
    assert sample(text, "queue_server_slo_objective", objective="lease_wait_target") == 0.95
    assert sample(text, "queue_server_slo_objective", objective="api_availability") == 0.999


def test_a_watchers_oldest_pending_delivery_is_its_delivery_lag(api: Api, db: Db) -> None:
    watcher = register(api, "http://127.0.0.1:9/hook", events=["item.enqueued"])
    series = {"tenant": "acme", "watcher": watcher["watcher_id"]}
    lag = "queue_server_watcher_oldest_pending_age_seconds"
    assert sample(api.operator.get("/metrics").text, lag, **series) == 0
    api.enqueue("mail")
    api.enqueue("mail")
    db.execute(
        "UPDATE outbox_deliveries SET created_at = created_at - interval '10 min'"
        " WHERE ctid = (SELECT min(ctid) FROM outbox_deliveries)"
    )
    text = api.operator.get("/metrics").text
    assert sample(text, "queue_server_watcher_deliveries", **series, state="pending") == 2
    age = sample(text, lag, **series)
    assert age is not None
    assert 600 <= age < 660
    assert sample(text, "queue_server_slo_objective", objective="delivery_lag_seconds") == 120


def test_the_delivery_scenario_runs_the_same_rules_at_a_sixtieth_of_their_durations(
    tmp_path: Path,
) -> None:
    """reliability/alerts.py proves delivery with these rules, each duration divided by 60."""
    from reliability.alerts import scaled_rules

    scaled = tmp_path / "scaled.rules.yml"
    scaled.write_text(scaled_rules(RULES.read_text(), 60))
    checked = subprocess.run(
        [_promtool(), "check", "rules", str(scaled)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    original = _alerts()
    quick = {
        rule["alert"]: rule
        for group in yaml.safe_load(scaled.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    assert set(quick) == set(original)
    assert original["QueueServerOldestReadyItemTooOld"]["for"] == "5m"
    assert quick["QueueServerOldestReadyItemTooOld"]["for"] == "5s"
    assert quick["QueueServerDeadLettersGrowing"]["for"] == "60s"
    fast = quick["QueueServerLeaseWaitBudgetBurnFast"]["expr"]
    assert "ratio_rate1h" in fast  # recording rules keep their names
    recorded = yaml.safe_load(scaled.read_text())["groups"][0]["rules"]
    windows = {r["record"]: r["expr"] for r in recorded}
    assert "[60s]" in windows["queue_server:late_leases:ratio_rate1h"]
    assert "[360s]" in windows["queue_server:late_leases:ratio_rate6h"]
