"""The contract verifier (ADR Decision 8): matrix totality, source bindings, and the negative control.

`verify_contract` checks that the policy loads (it is total and obeys the
ADR), that every cell has exactly one binding, that each binding's enforcing
object imports, and that each named test exists in the tests tree and mentions
that object. It then runs `verify_cancellation_rule` on the real confirmed-
mutation path, which must pass, and on the cancel-after-dispatch variant, which
must fail. Any failure makes the report fail.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from queue_server.policy.bindings import BINDINGS, DECISIONS, Binding, DecisionBinding
from queue_server.policy.errors import PolicyError
from queue_server.policy.loader import load_policy
from queue_server.policy.model import Dimension, OperationClass, ReliabilityPolicy, cell_name
from queue_server.policy.mutation import (
    CancelAfterDispatchMutationPath,
    ConfirmedMutationPath,
    InMemoryReceiptStore,
    MutationStatus,
    Outcome,
    Receipt,
    ReceiptStatus,
)

_SETTLE_WAIT = 2.0


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
    bindings_checked: int = 0
    decisions_checked: int = 0
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
            "bindings_checked": self.bindings_checked,
            "decisions_checked": self.decisions_checked,
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


def default_tests_root() -> Path:
    """The repository root that holds `tests/`: the parent of the `queue_server` package."""
    return Path(__file__).resolve().parents[2]


def _names_in(node: ast.AST) -> set[str]:
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.add(sub.attr)
    return names


def _find_test(
    root: Path, spec: str, cache: dict[Path, ast.Module | None]
) -> tuple[ast.AST, ast.Module] | None:
    rel, _, name = spec.partition("::")
    path = root / rel
    if path not in cache:
        cache[path] = ast.parse(path.read_text(), str(path)) if path.is_file() else None
    module = cache[path]
    if module is None:
        return None
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node, module
    return None


def _exercised_names(test: ast.AST, module: ast.Module) -> set[str]:
    """Names a test uses, following calls into helper functions of its own module."""
    helpers = {
        node.name: node
        for node in module.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    names: set[str] = set()
    pending: list[ast.AST] = [test]
    seen: set[str] = set()
    while pending:
        node = pending.pop()
        found = _names_in(node)
        names |= found
        for helper in found & helpers.keys() - seen:
            seen.add(helper)
            pending.append(helpers[helper])
    return names


def _check_binding(
    binding: Binding, root: Path, cache: dict[Path, ast.Module | None]
) -> list[ContractFailure]:
    failures = []
    try:
        resolve(binding.enforced_by)
    except (ImportError, AttributeError) as exc:
        failures.append(
            ContractFailure(
                binding.cell, f"enforced_by {binding.enforced_by!r} does not resolve: {exc}"
            )
        )
    _, sep, name = binding.test.partition("::")
    if not sep or not name.startswith("test"):
        failures.append(
            ContractFailure(binding.cell, f"test {binding.test!r} is not path::test_name")
        )
        return failures
    found = _find_test(root, binding.test, cache)
    if found is None:
        failures.append(
            ContractFailure(binding.cell, f"test {binding.test!r} not found under {root}")
        )
        return failures
    wanted = set(binding.enforced_by.split(".")[-2:])
    if not failures and not wanted & _exercised_names(*found):
        failures.append(
            ContractFailure(
                binding.cell,
                f"test {name} does not exercise {binding.enforced_by} (names none of {sorted(wanted)})",
            )
        )
    return failures


def _check_decisions(
    decisions: Sequence[DecisionBinding], root: Path, cache: dict[Path, ast.Module | None]
) -> list[ContractFailure]:
    """Each ADR Decision point 1-8 maps to code that resolves and to tests that exercise it."""
    failures = []
    points = sorted(d.point for d in decisions)
    if points != list(range(1, 9)):
        failures.append(
            ContractFailure("decisions", f"expected points 1-8 once each, got {points}")
        )
    for decision in decisions:
        where = f"decision-{decision.point}"
        wanted: set[str] = set()
        for dotted in decision.enforced_by:
            try:
                resolve(dotted)
            except (ImportError, AttributeError) as exc:
                failures.append(ContractFailure(where, f"{dotted!r} does not resolve: {exc}"))
            wanted |= set(dotted.split(".")[-2:])
        for test in decision.tests:
            found = _find_test(root, test, cache)
            if found is None:
                failures.append(ContractFailure(where, f"test {test!r} not found under {root}"))
            elif not wanted & _exercised_names(*found):
                failures.append(ContractFailure(where, f"test {test!r} exercises none of its code"))
    return failures


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
    tests_root: Path | None = None,
    mutation_path: ConfirmedMutationPath | None = None,
    negative_control: ConfirmedMutationPath | None = None,
    decisions: Sequence[DecisionBinding] = DECISIONS,
) -> ContractReport:
    """Check totality, bindings and named tests, then the cancellation rule and its negative control."""
    report = ContractReport()
    try:
        checked = policy or load_policy()
    except PolicyError as error:
        report.failures.extend(ContractFailure(cell, reason) for cell, reason in error.problems)
        checked = None
    if checked is not None:
        for cls, dim in itertools.product(OperationClass, Dimension):
            checked.cell(cls, dim)
            report.cells_checked += 1

    bound: dict[str, int] = {}
    for binding in bindings:
        bound[binding.cell] = bound.get(binding.cell, 0) + 1
    for cls, dim in itertools.product(OperationClass, Dimension):
        name = cell_name(cls, dim)
        count = bound.pop(name, 0)
        if count != 1:
            report.failures.append(
                ContractFailure(name, f"expected exactly one binding, found {count}")
            )
    for name in bound:
        report.failures.append(ContractFailure(name, "binding for a cell outside the matrix"))

    root = tests_root or default_tests_root()
    cache: dict[Path, ast.Module | None] = {}
    for binding in bindings:
        report.failures.extend(_check_binding(binding, root, cache))
        report.bindings_checked += 1

    report.failures.extend(_check_decisions(decisions, root, cache))
    report.decisions_checked = len(decisions)

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
