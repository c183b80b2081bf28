"""Load a policy document (the built-in `operation-reliability.v2` or a version of one's own)
and validate totality, the rules of docs/decisions/operation-class-policy.md and the
absolute bounds of durable-leased-work.

Every problem is reported with the cell it concerns (`class/dimension`), and
all problems are collected before `PolicyError` is raised.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from pydantic import ValidationError

from queue_server.policy.errors import PolicyError
from queue_server.policy.model import (
    MAX_ATTEMPTS,
    POLICY_NAME,
    AttemptTimeout,
    Backoff,
    Backpressure,
    Cancellation,
    Cell,
    CircuitBreakerPolicy,
    ClassPolicy,
    Concurrency,
    Deadline,
    Dimension,
    IdempotencyAndFencing,
    IsolationBoundary,
    NotApplicable,
    OperationClass,
    QueueReacquisition,
    RequeueDelay,
    Resumability,
    RetryAttempts,
    cell_name,
)
from queue_server.policy.v2 import OPERATION_RELIABILITY_V2
from queue_server.policy.values import ReliabilityPolicy

OC = OperationClass
D = Dimension

# The cell models each dimension accepts, by `kind` (None: the only kind, `kind` may be omitted).
_KINDS: dict[Dimension, dict[str | None, type[Cell]]] = {
    D.DEADLINE: {None: Deadline},
    D.ATTEMPT_TIMEOUT: {None: AttemptTimeout},
    D.RETRY: {"attempts": RetryAttempts, "queue-reacquisition": QueueReacquisition},
    D.BACKOFF_AND_JITTER: {None: Backoff, "requeue-delay": RequeueDelay},
    D.CIRCUIT_BREAKING: {
        "circuit-breaker": CircuitBreakerPolicy,
        "isolation-boundary": IsolationBoundary,
    },
    D.BACKPRESSURE: {None: Backpressure},
    D.CONCURRENCY: {None: Concurrency},
    D.IDEMPOTENCY_AND_FENCING: {None: IdempotencyAndFencing},
    D.CANCELLATION: {None: Cancellation},
    D.RESUMABILITY: {None: Resumability},
}

# Dimensions that may never be not-applicable, and why (Decisions 3-6).
_REQUIRED: dict[Dimension, str] = {
    D.DEADLINE: "deadlines bound every operation",
    D.ATTEMPT_TIMEOUT: "every attempt is bounded inside the deadline",
    D.RETRY: "retry is explicit: max-attempts 1 for a single attempt, or queue-reacquisition",
    D.BACKPRESSURE: "every class has finite backpressure",
    D.CONCURRENCY: "every class has finite concurrency",
    D.IDEMPOTENCY_AND_FENCING: "every class states its effects and the identity they need",
    D.CANCELLATION: "every class states what a disconnect does before and after dispatch",
}

# Decision 4: these classes use the canonical circuit breaker.
_CIRCUIT_CLASSES = frozenset({OC.INTERACTIVE_TURN, OC.READ_ONLY_DEPENDENCY, OC.CONFIRMED_MUTATION})
# Decision 4: local leased work and verification remain concurrency one.
_CONCURRENCY_ONE = frozenset({OC.DURABLE_LEASED_WORK, OC.ARTIFACT_VERIFICATION})
# Decision 5: the exclusive grants that replace a separate fence.
_EXCLUSIVE_GRANT = frozenset({OC.CONFIRMED_MUTATION, OC.ARTIFACT_VERIFICATION})

Problems = list[tuple[str, str]]


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        loc = ".".join(str(p) for p in item["loc"])
        parts.append(f"{loc}: {item['msg']}" if loc else str(item["msg"]))
    return "; ".join(parts)


def _parse_cell(cls: str, dim: Dimension, raw: Any, problems: Problems) -> Cell | None:
    name = cell_name(cls, dim)
    if not isinstance(raw, Mapping):
        problems.append((name, f"a cell is a mapping, got {type(raw).__name__}"))
        return None
    if "not-applicable" in raw:
        if dim in _REQUIRED:
            problems.append((name, f"may not be not-applicable: {_REQUIRED[dim]}"))
            return None
        model: type[Cell] = NotApplicable
    else:
        kinds = _KINDS[dim]
        kind = raw.get("kind")
        if kind is None and None in kinds:
            model = kinds[None]
        elif kind in kinds and kind is not None:
            model = kinds[kind]
        else:
            known = ", ".join(k for k in kinds if k is not None) or "(none)"
            problems.append((name, f"unknown kind {kind!r}; expected one of: {known}"))
            return None
    try:
        return model.model_validate(raw)
    except ValidationError as error:
        problems.append((name, _describe(error)))
        return None


def _check_retry(cls: OC, cp: ClassPolicy, problems: Problems) -> None:
    retry, backoff = cp.retry, cp.backoff_and_jitter
    identity = cp.idempotency_and_fencing
    r_cell, b_cell = cell_name(cls, D.RETRY), cell_name(cls, D.BACKOFF_AND_JITTER)
    if cls is OC.DURABLE_LEASED_WORK and not isinstance(retry, QueueReacquisition):
        problems.append(
            (r_cell, "leased work has no automatic retry loop: use queue-reacquisition")
        )
    if isinstance(retry, QueueReacquisition):
        if cls is not OC.DURABLE_LEASED_WORK:
            problems.append((r_cell, "queue-reacquisition applies to durable-leased-work only"))
        if retry.delay_seconds != 0:
            problems.append((r_cell, "re-acquisition is zero-delay"))
        if not (retry.advances_fence and retry.advances_acquisition_count):
            problems.append(
                (r_cell, "each re-acquisition advances the fence and acquisition count")
            )
        if isinstance(backoff, Backoff):
            problems.append(
                (b_cell, "queue re-acquisition has no client backoff: at most a requeue-delay cap")
            )
        return
    if isinstance(backoff, RequeueDelay):
        problems.append((b_cell, "requeue-delay applies to queue re-acquisition only"))
    n = retry.max_attempts
    if not 1 <= n <= MAX_ATTEMPTS:
        problems.append(
            (r_cell, f"1 to {MAX_ATTEMPTS} attempts, the first attempt included; got {n}")
        )
    if n > 1 and not retry.retryable:
        problems.append((r_cell, "retries must name their retryable failure classes"))
    if n == 1 and retry.retryable:
        problems.append((r_cell, "a single attempt has no retryable failure classes"))
    if n > 1 and identity.effects != "never" and not identity.durable_receipt:
        problems.append(
            (
                r_cell,
                "effecting work is single-attempt unless it owns a durable idempotency receipt",
            )
        )
    if n > 1 and isinstance(backoff, NotApplicable):
        problems.append((b_cell, "retries need capped exponential backoff"))
    if n == 1 and not isinstance(backoff, NotApplicable):
        problems.append((b_cell, "a single attempt has no backoff: mark it not-applicable"))
    if isinstance(backoff, Backoff) and 1 <= n <= MAX_ATTEMPTS:
        delays = sum(
            min(backoff.initial_seconds * backoff.multiplier ** (k - 1), backoff.max_seconds)
            for k in range(1, n)
        )
        worst = n * cp.attempt_timeout.seconds + delays
        if worst > cp.deadline.seconds:
            problems.append(
                (
                    r_cell,
                    f"{n} attempts of {cp.attempt_timeout.seconds:g}s plus {delays:g}s of backoff "
                    f"({worst:g}s) do not fit the deadline of {cp.deadline.seconds:g}s",
                )
            )


def _check_backoff(cls: OC, cp: ClassPolicy, problems: Problems) -> None:
    backoff = cp.backoff_and_jitter
    name = cell_name(cls, D.BACKOFF_AND_JITTER)
    if not isinstance(backoff, Backoff):
        return
    if backoff.initial_seconds > backoff.max_seconds:
        problems.append((name, "initial-seconds exceeds the cap max-seconds"))
    if backoff.persisted_schedule and backoff.jitter != "none":
        problems.append((name, "a persisted schedule must be replay-stable: jitter none"))
    if cls is OC.WATCHER_DELIVERY and (backoff.jitter != "none" or not backoff.persisted_schedule):
        problems.append(
            (name, "the watcher outbox persists a replay-stable schedule: jitter none, persisted")
        )
    if cls is OC.READ_ONLY_DEPENDENCY and backoff.jitter != "full":
        problems.append((name, "read dependencies use full jitter"))


def _check_isolation(cls: OC, cp: ClassPolicy, problems: Problems) -> None:
    circuit = cp.circuit_breaking
    name = cell_name(cls, D.CIRCUIT_BREAKING)
    if cls in _CIRCUIT_CLASSES and not isinstance(circuit, CircuitBreakerPolicy):
        problems.append((name, "this class uses the canonical circuit breaker"))
    if isinstance(circuit, IsolationBoundary):
        retry = cp.retry
        budget = (
            retry.max_acquisitions if isinstance(retry, QueueReacquisition) else retry.max_attempts
        )
        valid = isinstance(retry, QueueReacquisition) or 1 <= budget <= MAX_ATTEMPTS
        if valid and circuit.budget is not None and circuit.budget != budget:
            problems.append(
                (
                    name,
                    f"the isolation budget {circuit.budget} differs from the retry cell's"
                    f" {budget}: set its budget to {budget} too",
                )
            )
    bp = cp.backpressure
    bp_name = cell_name(cls, D.BACKPRESSURE)
    if bp.mechanism == "reject-at-capacity" and bp.max_queued != 0:
        problems.append((bp_name, "reject-at-capacity never queues: max-queued is 0"))
    if bp.mechanism != "reject-at-capacity" and bp.max_queued < 1:
        problems.append((bp_name, f"{bp.mechanism} needs a positive cap"))
    conc = cp.concurrency
    c_name = cell_name(cls, D.CONCURRENCY)
    if conc.scope == "cloud" and not conc.spend_approval:
        problems.append((c_name, "cloud concurrency requires a human spend approval"))
    if cls in _CONCURRENCY_ONE and conc.scope == "local" and conc.limit != 1:
        problems.append((c_name, f"local {cls.value} remains concurrency one, got {conc.limit}"))


def _check_identity(cls: OC, cp: ClassPolicy, problems: Problems) -> None:
    ident = cp.idempotency_and_fencing
    name = cell_name(cls, D.IDEMPOTENCY_AND_FENCING)
    if ident.effects != "never" and not (
        ident.requires_idempotency_key and ident.requires_outcome_reference
    ):
        problems.append(
            (name, "effecting work needs an idempotency key and outcome reference before dispatch")
        )
    if cls is OC.READ_ONLY_DEPENDENCY and ident.effects != "never":
        problems.append((name, "a read-only dependency has no effects"))
    if cls is OC.DURABLE_LEASED_WORK and ident.fencing != "monotonic-fence":
        problems.append((name, "leased work presents its current monotonic fence"))
    if cls in _EXCLUSIVE_GRANT and ident.fencing != "exclusive-grant":
        problems.append((name, "this class's exclusive grant replaces a separate fence"))
    if ident.fencing == "exclusive-grant" and not (ident.exclusive_grant or "").strip():
        problems.append((name, "name the exclusive grant"))
    cancel = cp.cancellation
    k_name = cell_name(cls, D.CANCELLATION)
    if ident.effects != "never" and cancel.after_dispatch == "discard-read":
        problems.append(
            (k_name, "a dispatched effect is not discarded: it continues to an outcome receipt")
        )
    if cls is OC.INTERACTIVE_TURN and not cancel.disconnect_authority:
        problems.append((k_name, "the interactive turn's disconnect authority is required"))
    if cls is OC.CONFIRMED_MUTATION and cp.attempt_timeout.on_timeout != "return-pending-receipt":
        problems.append(
            (cell_name(cls, D.ATTEMPT_TIMEOUT), "a mutation's timeout returns its pending receipt")
        )


def _check_class(cls: OC, cp: ClassPolicy, problems: Problems) -> None:
    if cp.attempt_timeout.seconds > cp.deadline.seconds:
        problems.append(
            (
                cell_name(cls, D.ATTEMPT_TIMEOUT),
                f"attempt timeout {cp.attempt_timeout.seconds:g}s does not fit the deadline "
                f"{cp.deadline.seconds:g}s",
            )
        )
    _check_retry(cls, cp, problems)
    _check_backoff(cls, cp, problems)
    _check_isolation(cls, cp, problems)
    _check_identity(cls, cp, problems)


# Cells that carry identity, fencing and outcome observability: a document of one's own
# restates them exactly (the decision's Consequences: weakening them needs a new decision).
_FIXED = (D.IDEMPOTENCY_AND_FENCING, D.CANCELLATION, D.RESUMABILITY)

# The absolute bounds of durable-leased-work: how far a document of one's own may go.
MAX_LEASED_DEADLINE = 604800.0  # 7 days: the longest life of one lease
MAX_LEASED_ATTEMPT_TIMEOUT = 3600.0  # 1 hour: the longest lease TTL
MAX_LEASED_ACQUISITIONS = 100  # the acquisition budget of one item
MAX_LEASED_BACKOFF = 86400.0  # 24 hours: the longest requeue / triage delay


def _bound(problems: Problems, cell: str, what: str, value: float, bound: float) -> None:
    if value > bound:
        problems.append((cell, f"{what} {value:g} exceeds the bound of {bound:g}"))


def _check_bounds(cls: OC, cp: ClassPolicy, problems: Problems) -> None:
    """durable-leased-work stays inside its absolute bounds, whatever the document's version."""
    if cls is not OC.DURABLE_LEASED_WORK:
        return
    _bound(
        problems,
        cell_name(cls, D.DEADLINE),
        "seconds",
        cp.deadline.seconds,
        MAX_LEASED_DEADLINE,
    )
    _bound(
        problems,
        cell_name(cls, D.ATTEMPT_TIMEOUT),
        "seconds",
        cp.attempt_timeout.seconds,
        MAX_LEASED_ATTEMPT_TIMEOUT,
    )
    if isinstance(cp.retry, QueueReacquisition):
        _bound(
            problems,
            cell_name(cls, D.RETRY),
            "max-acquisitions",
            cp.retry.max_acquisitions,
            MAX_LEASED_ACQUISITIONS,
        )
    if isinstance(cp.backoff_and_jitter, Backoff | RequeueDelay):
        _bound(
            problems,
            cell_name(cls, D.BACKOFF_AND_JITTER),
            "max-seconds",
            cp.backoff_and_jitter.max_seconds,
            MAX_LEASED_BACKOFF,
        )


def _check_fixed(cls: OC, cp: ClassPolicy, base: ClassPolicy, problems: Problems) -> None:
    for dim in _FIXED:
        if _values(cp.cell(dim)) != _values(base.cell(dim)):
            problems.append(
                (
                    cell_name(cls, dim),
                    f"identity, fencing and outcome observability stay as in {POLICY_NAME}:"
                    " weakening them needs a new decision",
                )
            )


def _values(cell: Cell) -> dict[str, Any]:
    """A cell's values, its note aside."""
    return cell.model_dump(mode="json", exclude={"note"})


# Keys of a document besides its classes: `version` names it (`policy` is the older
# spelling of the same); `loaded` is what GET /v1/policy adds about the server's copy.
_TOP_LEVEL = frozenset({"version", "policy", "dimensions", "classes", "loaded"})
VERSION_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")


def builtin_changed_message() -> str:
    """Why a changed document may not keep the built-in's version (its cell is `version`)."""
    return (
        f"{POLICY_NAME} is the built-in policy; a changed document needs a"
        " version of its own (policy new --version NAME)"
    )


def _version(doc: Mapping[str, Any], problems: Problems) -> str:
    version, older = doc.get("version"), doc.get("policy")
    if version is not None and older is not None and version != older:
        problems.append(
            ("version", f"version {version!r} and its older spelling policy {older!r} differ")
        )
    name = version if version is not None else older
    if name is None:
        problems.append(("version", "missing: a document names itself with a version"))
        return POLICY_NAME
    if not (isinstance(name, str) and VERSION_PATTERN.match(name)):
        problems.append(
            (
                "version",
                f"a version is 1 to 100 letters, digits and . _ + -, got {name!r}",
            )
        )
        return POLICY_NAME
    return name


def load_policy(
    raw: Mapping[str, Any] | None = None, *, source: str = "built-in"
) -> ReliabilityPolicy:
    """Validate a policy document (the canonical v2 literal by default) and return it typed.

    A document names itself with its `version`. Every document must be total and obey the
    decision's rules; durable-leased-work stays inside its absolute bounds and the
    identity, fencing and outcome observability cells stay as in the built-in. A document
    that keeps the built-in's version must be the built-in: a change is a version of its
    own. Every problem names its cell.
    """
    source_doc: Mapping[str, Any] = OPERATION_RELIABILITY_V2 if raw is None else raw
    problems: Problems = []
    if not isinstance(source_doc, Mapping):
        raise PolicyError([("document", f"a policy is a JSON object, got {type(raw).__name__}")])
    name = _version(source_doc, problems)
    for key in source_doc:
        if key == "revision":
            problems.append(
                ("revision", "a revision label is gone: a changed document is a version of its own")
            )
        elif key not in _TOP_LEVEL:
            problems.append((str(key), "unknown top-level key"))
    if "dimensions" in source_doc and list(source_doc["dimensions"]) != [d.value for d in D]:
        problems.append(("dimensions", "the dimensions are exactly the ten of the policy"))
    classes = source_doc.get("classes")
    if not isinstance(classes, Mapping):
        raise PolicyError([*problems, ("classes", "missing: a mapping of operation classes")])
    for cls_name in classes:
        if cls_name not in {c.value for c in OC}:
            problems.append(
                (
                    cell_name(cls_name, "*"),
                    "unknown operation class: a new class requires a versioned policy edit",
                )
            )
    base = default_policy() if raw is not None else None
    parsed: dict[OperationClass, ClassPolicy] = {}
    for cls in OC:
        raw_class = classes.get(cls.value)
        if not isinstance(raw_class, Mapping):
            problems.append((cell_name(cls, "*"), "class omitted: every class has all ten cells"))
            continue
        for key in raw_class:
            if key not in {d.value for d in D}:
                problems.append((cell_name(cls, key), "unknown dimension"))
        cells: dict[str, Cell] = {}
        for dim in D:
            if dim.value not in raw_class:
                problems.append(
                    (
                        cell_name(cls, dim),
                        "cell omitted: give a value or not-applicable with a reason; "
                        "transport defaults are not inherited",
                    )
                )
                continue
            cell = _parse_cell(cls, dim, raw_class[dim.value], problems)
            if cell is not None:
                cells[dim.value] = cell
        if len(cells) != len(D):
            continue
        class_policy = ClassPolicy.model_validate(cells)
        _check_class(cls, class_policy, problems)
        _check_bounds(cls, class_policy, problems)
        if base is not None:
            # One message per cell: the decision's rule, when a cell breaks one, says enough.
            fixed: Problems = []
            _check_fixed(cls, class_policy, base.for_class(cls), fixed)
            named = {cell for cell, _ in problems}
            problems.extend(p for p in fixed if p[0] not in named)
        parsed[cls] = class_policy
    if base is not None and name == POLICY_NAME and not _same_values(parsed, base):
        problems.insert(0, ("version", builtin_changed_message()))
    if problems:
        raise PolicyError(problems)
    return ReliabilityPolicy(name=name, classes=parsed, source=source)


def _same_values(parsed: Mapping[OperationClass, ClassPolicy], base: ReliabilityPolicy) -> bool:
    """Every class present and every cell as in `base`, notes aside."""
    return set(parsed) == set(OC) and all(
        _values(parsed[cls].cell(dim)) == _values(base.for_class(cls).cell(dim))
        for cls in OC
        for dim in D
    )


@cache
def default_policy() -> ReliabilityPolicy:
    """The canonical policy, validated once per process."""
    return load_policy()
