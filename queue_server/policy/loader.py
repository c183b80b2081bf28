"""Load `operation-reliability.v2` and validate totality and the rules of
docs/decisions/operation-class-policy.md.

Every problem is reported with the cell it concerns (`class/dimension`), and
all problems are collected before `PolicyError` is raised.
"""

from __future__ import annotations

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
    ReliabilityPolicy,
    RequeueDelay,
    Resumability,
    RetryAttempts,
    cell_name,
)
from queue_server.policy.v2 import OPERATION_RELIABILITY_V2

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
        if valid and circuit.budget != budget:
            problems.append(
                (
                    name,
                    f"the isolation budget {circuit.budget} differs from the retry cell's {budget}",
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


# Cells that carry identity, fencing and outcome observability: a loaded document
# restates them exactly (the decision's Consequences: weakening them needs a new decision).
_FIXED = (D.IDEMPOTENCY_AND_FENCING, D.CANCELLATION, D.RESUMABILITY)


def _over(problems: Problems, cell: str, what: str, value: float, ceiling: float) -> None:
    if value > ceiling:
        problems.append(
            (
                cell,
                f"{what} {value:g} exceeds the {POLICY_NAME} envelope of {ceiling:g}:"
                " a loaded policy may tighten a value, never loosen it",
            )
        )


def _check_envelope(cls: OC, cp: ClassPolicy, base: ClassPolicy, problems: Problems) -> None:
    """`cp` stays inside `base` (the built-in class): same kinds, no value above its ceiling."""
    for dim in D:
        mine, theirs = cp.cell(dim), base.cell(dim)
        name = cell_name(cls, dim)
        if type(mine) is not type(theirs):
            problems.append(
                (name, f"is {_kind_of(theirs)} in {POLICY_NAME}; a loaded policy keeps its kind")
            )
            continue
        if dim in _FIXED and mine.model_dump(exclude={"note"}) != theirs.model_dump(
            exclude={"note"}
        ):
            problems.append(
                (name, f"identity, fencing and outcome observability stay as in {POLICY_NAME}")
            )
    _over(
        problems, cell_name(cls, D.DEADLINE), "seconds", cp.deadline.seconds, base.deadline.seconds
    )
    _over(
        problems,
        cell_name(cls, D.ATTEMPT_TIMEOUT),
        "seconds",
        cp.attempt_timeout.seconds,
        base.attempt_timeout.seconds,
    )
    retry, base_retry = cp.retry, base.retry
    r_cell = cell_name(cls, D.RETRY)
    if isinstance(retry, QueueReacquisition) and isinstance(base_retry, QueueReacquisition):
        _over(
            problems,
            r_cell,
            "max-acquisitions",
            retry.max_acquisitions,
            base_retry.max_acquisitions,
        )
    if isinstance(retry, RetryAttempts) and isinstance(base_retry, RetryAttempts):
        _over(problems, r_cell, "max-attempts", retry.max_attempts, base_retry.max_attempts)
        extra = sorted(set(retry.retryable) - set(base_retry.retryable))
        if extra:
            problems.append(
                (r_cell, f"retries {', '.join(extra)}, which {POLICY_NAME} does not retry")
            )
    backoff, base_backoff = cp.backoff_and_jitter, base.backoff_and_jitter
    b_cell = cell_name(cls, D.BACKOFF_AND_JITTER)
    if isinstance(backoff, Backoff | RequeueDelay) and isinstance(
        base_backoff, Backoff | RequeueDelay
    ):
        _over(problems, b_cell, "max-seconds", backoff.max_seconds, base_backoff.max_seconds)
        if backoff.jitter != base_backoff.jitter:
            problems.append((b_cell, f"jitter stays {base_backoff.jitter}"))
    circuit, base_circuit = cp.circuit_breaking, base.circuit_breaking
    if isinstance(circuit, CircuitBreakerPolicy) and isinstance(base_circuit, CircuitBreakerPolicy):
        _over(
            problems,
            cell_name(cls, D.CIRCUIT_BREAKING),
            "failure-threshold",
            circuit.failure_threshold,
            base_circuit.failure_threshold,
        )
    bp_cell = cell_name(cls, D.BACKPRESSURE)
    if cp.backpressure.mechanism != base.backpressure.mechanism:
        problems.append((bp_cell, f"the mechanism stays {base.backpressure.mechanism}"))
    _over(problems, bp_cell, "max-queued", cp.backpressure.max_queued, base.backpressure.max_queued)
    c_cell = cell_name(cls, D.CONCURRENCY)
    if cp.concurrency.scope != base.concurrency.scope:
        problems.append((c_cell, f"the scope stays {base.concurrency.scope}"))
    _over(problems, c_cell, "limit", cp.concurrency.limit, base.concurrency.limit)


def _kind_of(cell: Cell) -> str:
    if isinstance(cell, NotApplicable):
        return "not-applicable"
    kind = getattr(cell, "kind", None)
    return repr(kind) if kind else type(cell).__name__


# Keys of a document besides its classes: `revision` labels a document of one's own;
# `loaded` is what GET /v1/policy adds about the server's copy, and is not policy data.
_TOP_LEVEL = frozenset({"policy", "revision", "dimensions", "classes", "loaded"})


def load_policy(
    raw: Mapping[str, Any] | None = None,
    *,
    source: str = "built-in",
    bounded: bool = True,
) -> ReliabilityPolicy:
    """Validate a policy document (the canonical v2 literal by default) and return it typed.

    A document other than the canonical literal must also stay inside the canonical
    policy's envelope: same kinds, identity cells as they are, and no value above
    its ceiling. `bounded=False` checks only totality and the decision's rules, as for a
    versioned edit of `v2.py` itself. Every problem names its cell.
    """
    source_doc: Mapping[str, Any] = OPERATION_RELIABILITY_V2 if raw is None else raw
    problems: Problems = []
    if not isinstance(source_doc, Mapping):
        raise PolicyError([("document", f"a policy is a JSON object, got {type(raw).__name__}")])
    if source_doc.get("policy") != POLICY_NAME:
        problems.append(("policy", f"expected {POLICY_NAME!r}, got {source_doc.get('policy')!r}"))
    for key in source_doc:
        if key not in _TOP_LEVEL:
            problems.append((str(key), "unknown top-level key"))
    revision = source_doc.get("revision")
    if revision is not None and not (isinstance(revision, str) and revision.strip()):
        problems.append(("revision", "a revision is a non-empty string"))
        revision = None
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
    base = default_policy() if raw is not None and bounded else None
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
        if base is not None:
            # One message per cell: the decision's rule, when a cell breaks one, says enough.
            outside: Problems = []
            _check_envelope(cls, class_policy, base.for_class(cls), outside)
            named = {cell for cell, _ in problems}
            problems.extend(p for p in outside if p[0] not in named)
        parsed[cls] = class_policy
    if problems:
        raise PolicyError(problems)
    return ReliabilityPolicy(name=POLICY_NAME, classes=parsed, source=source, revision=revision)


@cache
def default_policy() -> ReliabilityPolicy:
    """The canonical policy, validated once per process."""
    return load_policy()
