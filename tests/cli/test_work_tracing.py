"""`queue-server work` hands each command the trace it runs in, as TRACEPARENT: its own
span's when it exports spans (OTEL_EXPORTER_OTLP_ENDPOINT), else the item's enqueue
context; an item without one gets none, whatever the worker inherited."""

from __future__ import annotations

import dataclasses
import uuid

from tests.helpers.api import Api
from tests.helpers.cli import Cli
from tests.helpers.otlp import otlp_receiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
# The command answers with what it was given.
PRINT_TRACEPARENT = 'cat >/dev/null\nprintf \'{"traceparent": "%s"}\' "$TRACEPARENT"\n'


def enqueue(api: Api, headers: dict[str, str]) -> str:
    response = api.worker.post(
        "/v1/tenants/acme/queues/q/items",
        json={"payload": {"n": 1}},
        headers={"Idempotency-Key": uuid.uuid4().hex, **headers},
    )
    assert response.status_code == 201, response.text
    item_id: str = response.json()["item_id"]
    return item_id


def handed(api: Api, item_id: str) -> str:
    item = api.worker.get(f"/v1/tenants/acme/items/{item_id}").json()
    assert item["state"] == "completed", item
    value: str = item["result"]["traceparent"]
    return value


def test_the_command_gets_the_items_enqueue_context_as_traceparent(cli: Cli, api: Api) -> None:
    script = cli.script("print-traceparent.sh", PRINT_TRACEPARENT)
    traced = enqueue(api, {"traceparent": TRACEPARENT})
    cli.run("work", "q", "--drain", "--wait", "0", "--", script, role="worker")
    assert handed(api, traced) == TRACEPARENT
    # An item enqueued without one: nothing, not what the worker itself was started with.
    untraced = enqueue(api, {})
    inherited = f"00-{'e' * 32}-{'f' * 16}-01"
    cli = dataclasses.replace(cli, env={**cli.env, "TRACEPARENT": inherited})
    cli.run("work", "q", "--drain", "--wait", "0", "--", script, role="worker")
    assert handed(api, untraced) == ""


def test_with_an_endpoint_the_command_runs_in_the_exported_span_of_its_run(
    cli: Cli, api: Api
) -> None:
    script = cli.script("print-traceparent.sh", PRINT_TRACEPARENT)
    item_id = enqueue(api, {"traceparent": TRACEPARENT})
    with otlp_receiver() as (endpoint, receiver):
        exporting = dataclasses.replace(
            cli,
            env={
                **cli.env,
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_BSP_SCHEDULE_DELAY": "50",
            },
        )
        exporting.run("work", "q", "--drain", "--wait", "0", "--", script, role="worker")
        # Flushed at exit: the worker has already sent its spans.
        spans = receiver.wait_for(lambda spans: any(s.name == "process q" for s in spans))
    (span,) = [s for s in spans if s.name == "process q"]
    assert span.trace_id == TRACE_ID
    assert span.parent_span_id == PARENT_ID
    assert span.kind == 5  # SPAN_KIND_CONSUMER
    assert span.service == "queue-server-work"
    assert span.attributes["queue_server.item_id"] == item_id
    assert span.attributes["queue_server.outcome"] == "completed"
    # The command's TRACEPARENT names that span: its own spans would be its children.
    assert handed(api, item_id) == f"00-{TRACE_ID}-{span.span_id}-01"
