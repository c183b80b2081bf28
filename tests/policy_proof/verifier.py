"""The contract verifier (Decision 8 of docs/decisions/operation-class-policy.md): matrix
totality, the binding registry, and the negative control.

`verify_contract` checks that the policy is total and inside the envelope; that every
cell is bound, not-applicable or declared, exactly once; that every binding's enforcing
code imports and names a test and a weakening; and that the cancellation rule holds on
the real confirmed-mutation path and fails on the cancel-after-dispatch negative
control. `python -m tests.contract` (`make contract`) runs it first, then proves each
binding by applying its weakening to the runtime in a test process and requiring its
test to fail. `render_table` is the table `docs/reliability-policy.md` shows, the one
that verifier writes.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from queue_server.policy.errors import PolicyError
from queue_server.policy.loader import load_policy
from queue_server.policy.model import (
    Dimension,
    NotApplicable,
    OperationClass,
    cell_name,
    describe_cell,
)
from queue_server.policy.values import ReliabilityPolicy
from tests.demonstrators.mutation import (
    ConfirmedMutationPath,
    MutationStatus,
    Outcome,
    Receipt,
    ReceiptStatus,
)
from tests.policy_proof.bindings import (
    BINDINGS,
    DECLARED,
    NEGATIVE_CONTROLS,
    Binding,
    NegativeControl,
)
from tests.policy_proof.mutation import CancelAfterDispatchMutationPath, InMemoryReceiptStore

_SETTLE_WAIT = 2.0

Declared = Mapping[tuple[OperationClass, Dimension], str]


@dataclass(frozen=True)
class ContractFailure:
    cell: str
    message: str


@dataclass
class CancellationVerdict:
    """The result of checking the cancellation rule against one mutation path."""

    path: str
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass
class ContractReport:
    failures: list[ContractFailure] = field(default_factory=list)
    cells_checked: int = 0
    bound: int = 0
    not_applicable: int = 0
    declared: int = 0
    real_path: CancellationVerdict | None = None
    negative_control: CancellationVerdict | None = None

    @property
    def passed(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict[str, Any]:
        def verdict(v: CancellationVerdict | None) -> dict[str, Any] | None:
            return (
                None if v is None else {"path": v.path, "passed": v.passed, "failures": v.failures}
            )

        return {
            "passed": self.passed,
            "cells_checked": self.cells_checked,
            "bound": self.bound,
            "not_applicable": self.not_applicable,
            "declared": self.declared,
            "failures": [{"cell": f.cell, "message": f.message} for f in self.failures],
            "real_path": verdict(self.real_path),
            "negative_control": verdict(self.negative_control),
        }


def resolve(dotted: str) -> object:
    """Import the longest module prefix of `dotted` and walk the rest as attributes."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"no importable module in {dotted!r}")


def _check_code(where: str, dotted: str, test: str, weakening: str) -> list[ContractFailure]:
    failures = []
    try:
        resolve(dotted)
    except (ImportError, AttributeError) as exc:
        failures.append(ContractFailure(where, f"enforced_by {dotted!r} does not resolve: {exc}"))
    path, sep, name = test.partition("::")
    if not sep or not path.startswith("tests/") or not name.startswith("test"):
        failures.append(ContractFailure(where, f"test {test!r} is not tests/...::test_name"))
    if not weakening:
        failures.append(ContractFailure(where, "a binding names the weakening its test catches"))
    return failures


def check_registry(
    policy: ReliabilityPolicy,
    *,
    bindings: Sequence[Binding] = BINDINGS,
    declared: Declared = DECLARED,
    controls: Sequence[NegativeControl] = NEGATIVE_CONTROLS,
    report: ContractReport | None = None,
) -> list[ContractFailure]:
    """Every cell bound, not-applicable or declared, exactly once; every binding well formed."""
    failures: list[ContractFailure] = []
    bound: dict[str, int] = {}
    for binding in bindings:
        bound[binding.cell] = bound.get(binding.cell, 0) + 1
        failures.extend(
            _check_code(binding.cell, binding.enforced_by, binding.test, binding.weakening)
        )
    for cls, dim in itertools.product(OperationClass, Dimension):
        name = cell_name(cls, dim)
        not_applicable = isinstance(policy.cell(cls, dim), NotApplicable)
        ways = bound.pop(name, 0) + int(not_applicable) + int((cls, dim) in declared)
        if ways != 1:
            failures.append(
                ContractFailure(
                    name,
                    f"a cell is exactly one of bound, not-applicable or declared; found {ways}",
                )
            )
        if report is not None:
            report.cells_checked += 1
            report.not_applicable += int(not_applicable)
            report.declared += int((cls, dim) in declared)
            report.bound += int(not not_applicable and (cls, dim) not in declared)
    failures.extend(
        ContractFailure(name, "a binding for a cell outside the matrix") for name in bound
    )
    for cell_key, reason in declared.items():
        if not reason.strip():
            failures.append(ContractFailure(cell_name(*cell_key), "a declared cell says why"))
    paths = {control.path for control in controls}
    if len(paths) < 2:
        failures.append(
            ContractFailure(
                "confirmed-mutation/cancellation",
                "the negative control runs on the in-process path and on the REST-backed bridge",
            )
        )
    for control in controls:
        failures.extend(
            _check_code(
                f"negative control ({control.path})",
                control.enforced_by,
                control.test,
                control.weakening,
            )
        )
    return failures


def render_table(
    bindings: Sequence[Binding] = BINDINGS,
    declared: Declared = DECLARED,
    controls: Sequence[NegativeControl] = NEGATIVE_CONTROLS,
    policy: ReliabilityPolicy | None = None,
) -> str:
    """The markdown table of every cell: its value, its enforcing code, its test and the
    weakening that test catches (or why it is not-applicable or only declared)."""
    checked = policy or load_policy()
    by_cell = {(b.operation_class, b.dimension): b for b in bindings}
    lines = [
        f"| cell | value ({checked.version}) | enforced by | test | weakening caught |",
        "|---|---|---|---|---|",
    ]
    for cls, dim in itertools.product(OperationClass, Dimension):
        name = f"`{cell_name(cls, dim)}`"
        cell = checked.cell(cls, dim)
        binding = by_cell.get((cls, dim))
        if isinstance(cell, NotApplicable):
            lines.append(f"| {name} | not-applicable | {cell.not_applicable} | | |")
            continue
        value = describe_cell(cell)
        if binding is not None:
            lines.append(
                f"| {name} | {value} | `{binding.enforced_by}` | `{binding.test}`"
                f" | `{binding.weakening}` |"
            )
        else:
            lines.append(
                f"| {name} | {value} | declared only: {declared.get((cls, dim), '?')} | | |"
            )
    lines += ["", "| negative control | path | test | weakening caught |", "|---|---|---|---|"]
    for control in controls:
        lines.append(
            f"| cancel after dispatch | `{control.enforced_by}` ({control.path}) |"
            f" `{control.test}` | `{control.weakening}` |"
        )
    return "\n".join(lines) + "\n"


async def _settled(store: InMemoryReceiptStore, ref: str) -> Receipt | None:
    loop = asyncio.get_running_loop()
    until = loop.time() + _SETTLE_WAIT
    while loop.time() < until:
        receipt = await store.get(ref)
        if receipt is not None and receipt.status is not ReceiptStatus.PENDING:
            return receipt
        await asyncio.sleep(0.002)
    return await store.get(ref)


def _expect_outcome(
    failures: list[str], scenario: str, receipt: Receipt | None, outcome: Outcome
) -> None:
    if (
        receipt is None
        or receipt.status is not ReceiptStatus.SUCCEEDED
        or receipt.outcome != outcome
    ):
        state = None if receipt is None else (receipt.status.value, receipt.outcome)
        failures.append(
            f"{scenario}: the dispatched effect did not continue to its outcome receipt "
            f"(expected succeeded {outcome}, got {state})"
        )


async def _check_cancellation_rule(path: ConfirmedMutationPath) -> list[str]:
    failures: list[str] = []
    outcome: Outcome = {"applied": True}

    # 1. A disconnect before dispatch stops the work.
    store = InMemoryReceiptStore()
    applied: list[int] = []

    async def never() -> Outcome:
        applied.append(1)
        return outcome

    gone = asyncio.Event()
    gone.set()
    report = await path(
        store, idempotency_key="k1", outcome_ref="r1", effect=never, disconnect=gone
    )
    if applied or report.dispatched or report.status is not MutationStatus.NOT_DISPATCHED:
        failures.append("disconnect before dispatch: the effect was dispatched")

    # 2. A disconnect arriving after dispatch: never reported cancelled, settles its receipt.
    store = InMemoryReceiptStore()
    gone = asyncio.Event()

    async def disconnects_midway() -> Outcome:
        applied.append(2)  # the dependency has received the request
        gone.set()
        await asyncio.sleep(0.01)
        return outcome

    report = await path(
        store, idempotency_key="k2", outcome_ref="r2", effect=disconnects_midway, disconnect=gone
    )
    if report.status is MutationStatus.CANCELLED:
        failures.append("disconnect after dispatch: a dispatched effect was reported cancelled")
    _expect_outcome(failures, "disconnect after dispatch", await _settled(store, "r2"), outcome)

    # 3. The caller's task is cancelled after dispatch: the receipt still settles.
    store = InMemoryReceiptStore()
    started = asyncio.Event()

    async def slow() -> Outcome:
        applied.append(3)
        started.set()
        await asyncio.sleep(0.02)
        return outcome

    caller = asyncio.create_task(path(store, idempotency_key="k3", outcome_ref="r3", effect=slow))
    await started.wait()
    caller.cancel()
    try:
        report = await caller
    except asyncio.CancelledError:
        pass
    else:
        if report.status is MutationStatus.CANCELLED:
            failures.append("caller cancelled after dispatch: reported cancelled")
    _expect_outcome(
        failures, "caller cancelled after dispatch", await _settled(store, "r3"), outcome
    )

    # 4. An attempt timeout returns the pending receipt, which settlement later completes.
    store = InMemoryReceiptStore()
    report = await path(
        store, idempotency_key="k4", outcome_ref="r4", effect=slow, attempt_timeout=0.005
    )
    if report.status is not MutationStatus.PENDING or report.receipt is None:
        failures.append(f"attempt timeout: expected the pending receipt, got {report.status}")
    _expect_outcome(failures, "attempt timeout", await _settled(store, "r4"), outcome)

    return failures


def verify_cancellation_rule(
    mutation_path: ConfirmedMutationPath | None = None,
) -> CancellationVerdict:
    """Run the confirmed-mutation path through disconnect/cancel/timeout scenarios and judge the rule.

    The rule: a disconnect before dispatch stops; a dispatched effect is never
    reported cancelled and continues to an outcome receipt. Uses its own event
    loop, so call it from synchronous code (or a worker thread).
    """
    path = mutation_path or ConfirmedMutationPath()
    failures = asyncio.run(_check_cancellation_rule(path))
    return CancellationVerdict(path=type(path).__name__, failures=failures)


def verify_contract(
    *,
    policy: ReliabilityPolicy | None = None,
    bindings: Sequence[Binding] = BINDINGS,
    declared: Declared = DECLARED,
    controls: Sequence[NegativeControl] = NEGATIVE_CONTROLS,
    mutation_path: ConfirmedMutationPath | None = None,
    negative_control: ConfirmedMutationPath | None = None,
) -> ContractReport:
    """The loaded policy's totality and envelope, the registry, then the cancellation rule on
    the real mutation path (must hold) and on the negative control (must break)."""
    report = ContractReport()
    try:
        checked = policy or load_policy()
    except PolicyError as error:
        report.failures.extend(ContractFailure(cell, reason) for cell, reason in error.problems)
        checked = None
    if checked is not None:
        report.failures.extend(
            check_registry(
                checked, bindings=bindings, declared=declared, controls=controls, report=report
            )
        )
    report.real_path = verify_cancellation_rule(mutation_path or ConfirmedMutationPath())
    for failure in report.real_path.failures:
        report.failures.append(ContractFailure("confirmed-mutation/cancellation", failure))
    report.negative_control = verify_cancellation_rule(
        negative_control or CancelAfterDispatchMutationPath()
    )
    if report.negative_control.passed:
        report.failures.append(
            ContractFailure(
                "confirmed-mutation/cancellation",
                "the negative control (cancel-after-dispatch) passed; the verifier cannot detect "
                "an unobservable side effect",
            )
        )
    return report
