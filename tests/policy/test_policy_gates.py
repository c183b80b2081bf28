"""Permit gates, the disconnect authority, queue re-acquisition and verification checkpoints."""

from __future__ import annotations

import threading

import pytest

from queue_server.policy import OperationClass, default_policy, run_key
from tests.demonstrators.cancellation import DisconnectAuthority
from tests.demonstrators.errors import OperationStoppedError, PermitUnavailableError
from tests.demonstrators.permits import PermitGate


def test_permit_gate_rejects_ninth_concurrent_mutation() -> None:
    gate = PermitGate.for_class("confirmed-mutation")
    assert gate.capacity == 8
    for _ in range(8):
        gate.acquire()
    with pytest.raises(PermitUnavailableError):
        gate.acquire()
    assert gate.in_use == 8
    gate.release()
    gate.acquire()  # a freed permit is available again
    assert gate.in_use == 8


def test_permit_gate_rejects_ninth_of_concurrent_threads_immediately() -> None:
    gate = PermitGate.for_class("confirmed-mutation")
    start, hold = threading.Barrier(9), threading.Event()
    outcomes: list[str] = []
    lock = threading.Lock()

    def mutate() -> None:
        start.wait()
        try:
            with gate.permit():
                with lock:
                    outcomes.append("held")
                hold.wait(timeout=5)
        except PermitUnavailableError:
            with lock:
                outcomes.append("rejected")
            hold.set()  # the rejection came at once, while eight permits are still held

    threads = [threading.Thread(target=mutate) for _ in range(9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=5)
    assert sorted(outcomes) == ["held"] * 8 + ["rejected"]
    assert gate.in_use == 0


@pytest.mark.parametrize(
    "cls",
    [
        OperationClass.INTERACTIVE_TURN,
        OperationClass.READ_ONLY_DEPENDENCY,
        OperationClass.CONFIRMED_MUTATION,
        OperationClass.ARTIFACT_VERIFICATION,
    ],
)
def test_permit_gate_rejects_holder_beyond_capacity_immediately(cls: OperationClass) -> None:
    bp = default_policy().for_class(cls).backpressure
    assert (bp.mechanism, bp.max_queued) == ("reject-at-capacity", 0)
    gate = PermitGate.for_class(cls)
    for _ in range(gate.capacity):
        assert gate.try_acquire()
    assert not gate.try_acquire()
    with pytest.raises(PermitUnavailableError):
        gate.acquire()


@pytest.mark.parametrize("cls", list(OperationClass))
def test_permit_gate_for_class_matches_concurrency_cell(cls: OperationClass) -> None:
    gate = PermitGate.for_class(cls)
    assert gate.capacity == default_policy().for_class(cls).concurrency.limit
    assert gate.capacity < 100


@pytest.mark.parametrize("capacity", [0, -1, float("inf"), True])
def test_permit_gate_rejects_non_finite_capacity(capacity: object) -> None:
    with pytest.raises(ValueError, match="finite"):
        PermitGate(capacity)  # type: ignore[arg-type]


def test_permit_gate_release_without_permit_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        PermitGate(1).release()


@pytest.mark.parametrize("cls", list(OperationClass))
def test_disconnect_before_dispatch_stops_work(cls: OperationClass) -> None:
    authority = DisconnectAuthority(cls)
    assert authority.disconnect() == "stopped"
    with pytest.raises(OperationStoppedError):
        authority.dispatch()
    assert not authority.dispatched


@pytest.mark.parametrize("cls", list(OperationClass))
def test_disconnect_after_dispatch_is_never_reported_cancelled(cls: OperationClass) -> None:
    authority = DisconnectAuthority(cls)
    authority.dispatch()
    outcome = authority.disconnect()
    assert outcome == default_policy().for_class(cls).cancellation.after_dispatch
    assert "cancel" not in outcome
    if cls is not OperationClass.READ_ONLY_DEPENDENCY:
        assert outcome != "discard-read"


def test_disconnect_authority_refuses_later_turn_writes() -> None:
    turn = DisconnectAuthority("interactive-turn")
    turn.dispatch()
    turn.dispatch()  # connected: the turn may write again
    assert turn.disconnect() == "continue-to-outcome-receipt"
    with pytest.raises(OperationStoppedError):
        turn.dispatch()  # a later write of the turn is refused


def race_dispatch_against_disconnect() -> tuple[DisconnectAuthority, bool]:
    authority = DisconnectAuthority("confirmed-mutation")
    start = threading.Barrier(2)
    stopped: list[bool] = []

    def dispatch() -> None:
        start.wait()
        try:
            authority.dispatch()
        except OperationStoppedError:
            stopped.append(True)

    def disconnect() -> None:
        start.wait()
        authority.disconnect()

    threads = [threading.Thread(target=dispatch), threading.Thread(target=disconnect)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return authority, bool(stopped)


def test_disconnect_racing_dispatch_has_exactly_one_winner() -> None:
    for _ in range(200):
        authority, stopped = race_dispatch_against_disconnect()
        assert authority.dispatched != stopped
        expected = "continue-to-outcome-receipt" if authority.dispatched else "stopped"
        assert authority.outcome() == expected


def test_run_key_is_artifact_version_plus_verifier_version() -> None:
    assert run_key("artifact@3", "verifier@1.2") == "artifact@3+verifier@1.2"
    with pytest.raises(ValueError, match="both"):
        run_key("artifact@3", " ")
