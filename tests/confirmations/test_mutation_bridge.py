"""The confirmed-mutation bridge against the real server: durable receipts over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from queue_server.client import QueueClient
from queue_server.policy import AdmissionRefused, load_policy
from tests.demonstrators.errors import CircuitOpenError, PermitUnavailableError
from tests.demonstrators.mutation import MutationStatus, Outcome, ReceiptStatus
from tests.demonstrators.mutations import ConfirmedMutationBridge
from tests.helpers.api import Api, policy_document

pytestmark = pytest.mark.live  # the SDK opens its own connections

Db = psycopg.Connection[dict[str, object]]


@pytest.fixture
def client(api: Api) -> Iterator[QueueClient]:
    with QueueClient(api.url, api.keys["worker"], tenant="acme") as qs:
        yield qs


def _stored(db: Db, ref: str) -> dict[str, object] | None:
    return db.execute(
        "SELECT status, outcome FROM confirmation_receipts WHERE outcome_ref = %s", (ref,)
    ).fetchone()


def test_bridge_mutation_succeeds_and_settles_the_durable_receipt(
    client: QueueClient, db: Db
) -> None:
    async def effect() -> Outcome:
        return {"refunded": 42}

    bridge = ConfirmedMutationBridge(client)
    report = asyncio.run(bridge.mutate(idempotency_key="k1", outcome_ref="r1", effect=effect))
    assert report.status is MutationStatus.SUCCEEDED
    assert _stored(db, "r1") == {"status": "succeeded", "outcome": {"refunded": 42}}


def test_bridge_attempt_timeout_returns_pending_receipt_that_the_effect_settles_later(
    client: QueueClient, db: Db
) -> None:
    async def scenario() -> None:
        async def slow() -> Outcome:
            await asyncio.sleep(0.5)
            return {"applied": True}

        bridge = ConfirmedMutationBridge(client)
        report = await bridge.mutate(
            idempotency_key="k1", outcome_ref="r1", effect=slow, attempt_timeout=0.1
        )
        assert report.status is MutationStatus.PENDING
        assert report.dispatched
        assert _stored(db, "r1") == {"status": "pending", "outcome": None}
        assert report.settlement is not None
        settled = await report.settlement
        assert settled.status is ReceiptStatus.SUCCEEDED

    asyncio.run(scenario())
    assert _stored(db, "r1") == {"status": "succeeded", "outcome": {"applied": True}}


def test_bridge_caller_cancelled_after_dispatch_still_settles_the_receipt(
    client: QueueClient, db: Db
) -> None:
    async def scenario() -> None:
        started = asyncio.Event()

        async def effect() -> Outcome:
            started.set()
            await asyncio.sleep(0.3)
            return {"applied": True}

        bridge = ConfirmedMutationBridge(client)
        caller = asyncio.create_task(
            bridge.mutate(idempotency_key="k1", outcome_ref="r1", effect=effect)
        )
        await started.wait()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        for _ in range(100):
            receipt = await bridge.receipt("r1")
            if receipt is not None and receipt.status is not ReceiptStatus.PENDING:
                break
            await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert _stored(db, "r1") == {"status": "succeeded", "outcome": {"applied": True}}


async def _replays_yet_refuses_a_new_identity(
    bridge: ConfirmedMutationBridge, first: Any, ref: str, refusal: type[Exception]
) -> None:
    """The settled mutation k1/r1 replays its retained outcome without a dispatch; a new
    identity (`ref`) is refused with `refusal` and never runs either."""
    dispatched: list[str] = []

    async def must_not_run() -> Outcome:
        dispatched.append("dispatched")
        return {"refunded": 0}

    again = await bridge.mutate(idempotency_key="k1", outcome_ref="r1", effect=must_not_run)
    assert again.status is MutationStatus.SUCCEEDED
    assert again.replayed
    assert not again.dispatched
    assert again.receipt == first.receipt
    with pytest.raises(refusal):
        await bridge.mutate(idempotency_key=f"new-{ref}", outcome_ref=ref, effect=must_not_run)
    assert dispatched == []


class _Held:
    """Mutations whose effect runs until released: `fill` holds every permit of a bridge."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running = 0

    async def effect(self) -> Outcome:
        self.running += 1
        await self.release.wait()
        return {"ok": True}

    async def fill(
        self, bridge: ConfirmedMutationBridge, n: int = 8, prefix: str = "k"
    ) -> list[asyncio.Task[Any]]:
        ref = "r" if prefix == "k" else prefix
        tasks = [
            asyncio.create_task(
                bridge.mutate(
                    idempotency_key=f"{prefix}{i}", outcome_ref=f"{ref}{i}", effect=self.effect
                )
            )
            for i in range(n)
        ]
        while self.running < n:
            await asyncio.sleep(0.01)
        return tasks


def test_bridge_rejects_the_ninth_concurrent_mutation_without_claiming(
    client: QueueClient, db: Db
) -> None:
    async def scenario() -> None:
        bridge = ConfirmedMutationBridge(client)
        held = _Held()
        tasks = await held.fill(bridge)
        assert bridge.gate.in_use == 8

        async def at_once() -> Outcome:  # a ninth let in anyway ends now, not at a timeout
            return {"ok": True}

        with pytest.raises(PermitUnavailableError):
            await bridge.mutate(idempotency_key="k9", outcome_ref="r9", effect=at_once)
        held.release.set()
        reports = await asyncio.gather(*tasks)
        assert {r.status for r in reports} == {MutationStatus.SUCCEEDED}

    asyncio.run(scenario())
    assert _stored(db, "r9") is None
    assert db.execute("SELECT count(*) AS n FROM confirmation_receipts").fetchone() == {"n": 8}


def test_bridge_circuit_opens_after_repeated_adapter_failures(client: QueueClient, db: Db) -> None:
    async def scenario() -> None:
        async def broken() -> Outcome:
            raise ConnectionError("adapter down")

        bridge = ConfirmedMutationBridge(client)
        for i in range(3):
            report = await bridge.mutate(
                idempotency_key=f"k{i}", outcome_ref=f"r{i}", effect=broken
            )
            assert report.status is MutationStatus.FAILED
        with pytest.raises(CircuitOpenError):
            await bridge.mutate(idempotency_key="k3", outcome_ref="r3", effect=broken)

    asyncio.run(scenario())
    assert _stored(db, "r0") == {
        "status": "failed",
        "outcome": {"error": "ConnectionError", "detail": "adapter down"},
    }
    assert _stored(db, "r3") is None


def test_bridge_same_identity_replay_returns_retained_outcome_without_redispatch(
    client: QueueClient,
) -> None:
    calls: list[int] = []

    async def effect() -> Outcome:
        calls.append(1)
        return {"n": len(calls)}

    first = asyncio.run(
        ConfirmedMutationBridge(client).mutate(
            idempotency_key="k1", outcome_ref="r1", effect=effect
        )
    )
    # A new bridge, as after a client restart: the receipt is found on the server.
    again = asyncio.run(
        ConfirmedMutationBridge(client).mutate(
            idempotency_key="k1", outcome_ref="r1", effect=effect
        )
    )
    assert calls == [1]
    assert again.replayed
    assert not again.dispatched
    assert again.receipt is not None
    assert again.receipt.outcome == {"n": 1}
    assert first.receipt == again.receipt


def test_bridge_refuses_mutation_without_outcome_reference_before_claiming(
    client: QueueClient, db: Db
) -> None:
    async def effect() -> Outcome:
        raise AssertionError("must not be dispatched")

    bridge = ConfirmedMutationBridge(client)
    with pytest.raises(AdmissionRefused):
        asyncio.run(bridge.mutate(idempotency_key="k1", outcome_ref=" ", effect=effect))
    assert db.execute("SELECT count(*) AS n FROM confirmation_receipts").fetchone() == {"n": 0}


async def _refund() -> Outcome:
    return {"refunded": 42}


async def _broken() -> Outcome:
    raise ConnectionError("adapter down")


def test_bridge_replays_a_settled_mutation_while_its_circuit_is_open_and_refuses_a_new_one(
    client: QueueClient, db: Db
) -> None:
    async def scenario() -> None:
        first = await ConfirmedMutationBridge(client).mutate(
            idempotency_key="k1", outcome_ref="r1", effect=_refund
        )
        # A new bridge, as after a restart, whose adapter then fails: its circuit opens.
        bridge = ConfirmedMutationBridge(client)
        for i in range(3):
            await bridge.mutate(idempotency_key=f"f{i}", outcome_ref=f"f{i}", effect=_broken)
        await _replays_yet_refuses_a_new_identity(bridge, first, "r2", CircuitOpenError)

    asyncio.run(scenario())
    assert _stored(db, "r1") == {"status": "succeeded", "outcome": {"refunded": 42}}
    assert _stored(db, "r2") is None


def test_bridge_replays_a_settled_mutation_while_all_permits_are_held_and_refuses_a_new_one(
    client: QueueClient, db: Db
) -> None:
    async def scenario() -> None:
        bridge = ConfirmedMutationBridge(client)
        first = await bridge.mutate(idempotency_key="k1", outcome_ref="r1", effect=_refund)
        held = _Held()
        tasks = await held.fill(bridge, prefix="h")
        try:
            await _replays_yet_refuses_a_new_identity(bridge, first, "r9", PermitUnavailableError)
        finally:
            held.release.set()
            await asyncio.gather(*tasks)

    asyncio.run(scenario())
    assert _stored(db, "r9") is None


def test_bridge_refuses_the_ninth_mutation_at_once_and_never_runs_it_when_a_permit_frees(
    client: QueueClient, db: Db
) -> None:
    async def scenario() -> None:
        bridge = ConfirmedMutationBridge(client)
        held = _Held()
        tasks = await held.fill(bridge)
        ninth = asyncio.create_task(
            bridge.mutate(idempotency_key="k9", outcome_ref="r9", effect=held.effect)
        )
        await asyncio.sleep(0.2)  # the ninth has its answer by now, or waits in a queue
        held.release.set()
        await asyncio.gather(*tasks)
        with pytest.raises(PermitUnavailableError):
            await ninth

    asyncio.run(scenario())
    assert _stored(db, "r9") is None


def test_bridge_dispatches_a_failing_mutation_once_and_its_replay_returns_the_failure(
    client: QueueClient, db: Db
) -> None:
    calls: list[str] = []

    async def broken() -> Outcome:
        calls.append("dispatched")
        raise ConnectionError("adapter down")

    async def scenario() -> None:
        bridge = ConfirmedMutationBridge(client)
        first = await bridge.mutate(idempotency_key="k1", outcome_ref="r1", effect=broken)
        assert first.status is MutationStatus.FAILED
        assert first.dispatched
        again = await bridge.mutate(idempotency_key="k1", outcome_ref="r1", effect=broken)
        assert again.status is MutationStatus.FAILED
        assert again.replayed
        assert not again.dispatched

    asyncio.run(scenario())
    assert calls == ["dispatched"]
    assert _stored(db, "r1") == {
        "status": "failed",
        "outcome": {"error": "ConnectionError", "detail": "adapter down"},
    }


def test_bridge_attempt_timeout_is_the_loaded_policy_cell_and_a_longer_one_is_refused(
    client: QueueClient, db: Db
) -> None:
    policy = load_policy(
        policy_document(
            {
                "confirmed-mutation": {
                    "attempt-timeout": {"seconds": 0.2, "on-timeout": "return-pending-receipt"}
                }
            },
            "test-mutation-timeout.v1",
        )
    )

    async def slow() -> Outcome:
        await asyncio.sleep(0.5)
        return {"applied": True}

    async def scenario() -> None:
        bridge = ConfirmedMutationBridge(client, policy=policy)
        with pytest.raises(AdmissionRefused):
            await bridge.mutate(
                idempotency_key="k0", outcome_ref="r0", effect=slow, attempt_timeout=0.3
            )
        # Without one of its own, the caller waits the cell's 0.2 s, not the effect's 0.5 s.
        report = await bridge.mutate(idempotency_key="k1", outcome_ref="r1", effect=slow)
        assert report.status is MutationStatus.PENDING
        assert report.settlement is not None
        assert (await report.settlement).status is ReceiptStatus.SUCCEEDED

    asyncio.run(scenario())
    assert _stored(db, "r0") is None
    assert _stored(db, "r1") == {"status": "succeeded", "outcome": {"applied": True}}
