"""The contract registry: each cell bound to the code that enforces it and the test that exercises it.

ADR Decision 8: the contract verifier owns matrix totality and source
bindings. `enforced_by` is a dotted path that must import; `test` is
`path::function` relative to the repository root and must exist and mention
the enforcing object. `moves_to` names where the enforcement will live once
the server and client code exists; the binding then moves with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from queue_server.policy.model import Dimension, OperationClass

OC = OperationClass
D = Dimension

_P = "queue_server.policy."
_T = "tests/policy/"

ADMIT = _P + "admission.admit_operation"
BACKLOG = _P + "admission.admit_backlog"
RETRYING = _P + "retry.retrying_for"
WAIT = _P + "retry.wait_for"
SCHEDULE = _P + "retry.backoff_schedule"
NEXT_DELIVERY = _P + "retry.next_delivery_at"
BREAKER = _P + "breaker.CircuitBreaker.for_class"
GATE = _P + "permits.PermitGate.for_class"
AUTHORITY = _P + "cancellation.DisconnectAuthority"
MUTATION = _P + "mutation.ConfirmedMutationPath"
REACQUIRE = _P + "queue_decisions.decide_reacquisition"
CHECKPOINTS = _P + "queue_decisions.RunCheckpoints"
LOADER = _P + "loader.load_policy"

_MATRIX = _T + "test_policy_matrix.py::"
_ADMISSION = _T + "test_policy_admission.py::"
_RETRY = _T + "test_policy_retry.py::"
_BREAKER = _T + "test_policy_breaker.py::"
_GATES = _T + "test_policy_gates.py::"
_MUTATION = _T + "test_policy_mutation.py::"
_VERIFIER = _T + "test_policy_verifier.py::"

# Where each class's enforcement moves once the server and client exist.
MOVES_TO: dict[OperationClass, str] = {
    OC.INTERACTIVE_TURN: "queue_server.client interactive-turn gate; server acquire long-poll",
    OC.READ_ONLY_DEPENDENCY: "queue_server.client read-only dependency client",
    OC.CONFIRMED_MUTATION: "queue_server.client confirmed-mutation bridge + receipts API/store",
    OC.DURABLE_LEASED_WORK: "queue_server.store.transitions / service (acquire, heartbeat, backlog lock) + worker SDK",
    OC.WATCHER_DELIVERY: "watcher outbox delivery process",
    OC.ARTIFACT_VERIFICATION: "verification-runs API/store + verifier runner client",
}


@dataclass(frozen=True)
class Binding:
    operation_class: OperationClass
    dimension: Dimension
    enforced_by: str
    test: str

    @property
    def cell(self) -> str:
        return f"{self.operation_class.value}/{self.dimension.value}"

    @property
    def moves_to(self) -> str:
        return MOVES_TO[self.operation_class]


def _each(
    classes: tuple[OperationClass, ...], dimension: Dimension, enforced_by: str, test: str
) -> list[Binding]:
    return [Binding(c, dimension, enforced_by, test) for c in classes]


IT, RO, CM = OC.INTERACTIVE_TURN, OC.READ_ONLY_DEPENDENCY, OC.CONFIRMED_MUTATION
LW, WD, AV = OC.DURABLE_LEASED_WORK, OC.WATCHER_DELIVERY, OC.ARTIFACT_VERIFICATION
ALL = tuple(OC)

BINDINGS: tuple[Binding, ...] = (
    *_each(
        ALL, D.DEADLINE, ADMIT, _ADMISSION + "test_admission_refuses_deadline_beyond_class_envelope"
    ),
    *_each(
        (IT, RO, LW, WD, AV),
        D.ATTEMPT_TIMEOUT,
        ADMIT,
        _ADMISSION + "test_admission_refuses_attempt_timeout_that_does_not_fit_deadline",
    ),
    Binding(
        CM,
        D.ATTEMPT_TIMEOUT,
        MUTATION,
        _MUTATION + "test_mutation_attempt_timeout_returns_pending_receipt_that_settles_later",
    ),
    *_each((IT, CM), D.RETRY, RETRYING, _RETRY + "test_retrying_single_attempt_classes_call_once"),
    Binding(
        RO,
        D.RETRY,
        RETRYING,
        _RETRY + "test_retrying_read_only_dependency_stops_after_three_attempts",
    ),
    Binding(
        WD, D.RETRY, RETRYING, _RETRY + "test_retrying_watcher_delivery_stops_after_five_attempts"
    ),
    Binding(
        AV,
        D.RETRY,
        RETRYING,
        _RETRY + "test_retrying_artifact_verification_retries_only_transient_io",
    ),
    Binding(
        LW, D.RETRY, REACQUIRE, _GATES + "test_reacquisition_advances_fence_and_acquisition_count"
    ),
    Binding(
        RO, D.BACKOFF_AND_JITTER, WAIT, _RETRY + "test_read_only_dependency_wait_uses_full_jitter"
    ),
    Binding(
        WD,
        D.BACKOFF_AND_JITTER,
        SCHEDULE,
        _RETRY + "test_watcher_schedule_is_identical_across_calls",
    ),
    Binding(
        AV,
        D.BACKOFF_AND_JITTER,
        WAIT,
        _RETRY + "test_artifact_verification_wait_is_capped_exponential_without_jitter",
    ),
    *_each(
        (IT, CM),
        D.BACKOFF_AND_JITTER,
        LOADER,
        _MATRIX + "test_load_rejects_backoff_on_single_attempt_class",
    ),
    Binding(
        LW, D.BACKOFF_AND_JITTER, LOADER, _MATRIX + "test_load_rejects_retry_loop_for_leased_work"
    ),
    *_each(
        (IT, RO, CM),
        D.CIRCUIT_BREAKING,
        BREAKER,
        _BREAKER + "test_circuit_breaker_from_cell_opens_after_threshold",
    ),
    Binding(
        LW,
        D.CIRCUIT_BREAKING,
        REACQUIRE,
        _GATES + "test_reacquisition_quarantines_when_budget_spent",
    ),
    Binding(
        WD,
        D.CIRCUIT_BREAKING,
        NEXT_DELIVERY,
        _RETRY + "test_watcher_delivery_dead_letters_after_final_attempt",
    ),
    Binding(
        AV,
        D.CIRCUIT_BREAKING,
        BREAKER,
        _BREAKER + "test_circuit_breaker_refuses_class_without_breaker_cell",
    ),
    *_each(
        (IT, RO, CM, AV),
        D.BACKPRESSURE,
        GATE,
        _GATES + "test_permit_gate_rejects_holder_beyond_capacity_immediately",
    ),
    Binding(
        LW,
        D.BACKPRESSURE,
        BACKLOG,
        _ADMISSION + "test_backlog_cap_refuses_new_work_but_admits_requeue",
    ),
    Binding(
        WD, D.BACKPRESSURE, BACKLOG, _ADMISSION + "test_outbox_cap_refuses_new_delivery_at_cap"
    ),
    *_each(
        (IT, RO, WD),
        D.CONCURRENCY,
        GATE,
        _GATES + "test_permit_gate_for_class_matches_concurrency_cell",
    ),
    Binding(CM, D.CONCURRENCY, GATE, _GATES + "test_permit_gate_rejects_ninth_concurrent_mutation"),
    *_each(
        (LW, AV),
        D.CONCURRENCY,
        ADMIT,
        _ADMISSION + "test_admission_refuses_concurrency_above_class_limit",
    ),
    *_each(
        (IT, CM, WD, AV),
        D.IDEMPOTENCY_AND_FENCING,
        ADMIT,
        _ADMISSION + "test_admission_refuses_effecting_work_without_idempotency_key",
    ),
    Binding(
        LW,
        D.IDEMPOTENCY_AND_FENCING,
        ADMIT,
        _ADMISSION + "test_admission_refuses_leased_work_without_fence",
    ),
    Binding(
        RO,
        D.IDEMPOTENCY_AND_FENCING,
        ADMIT,
        _ADMISSION + "test_admission_refuses_effecting_read_only_dependency",
    ),
    Binding(
        CM,
        D.CANCELLATION,
        MUTATION,
        _VERIFIER + "test_cancellation_rule_passes_on_real_mutation_path",
    ),
    Binding(
        IT,
        D.CANCELLATION,
        AUTHORITY,
        _GATES + "test_disconnect_authority_refuses_later_turn_writes",
    ),
    *_each(
        (RO, LW, WD, AV),
        D.CANCELLATION,
        AUTHORITY,
        _GATES + "test_disconnect_after_dispatch_is_never_reported_cancelled",
    ),
    Binding(
        CM,
        D.RESUMABILITY,
        MUTATION,
        _MUTATION + "test_mutation_same_identity_replay_returns_retained_outcome",
    ),
    Binding(
        LW,
        D.RESUMABILITY,
        REACQUIRE,
        _GATES + "test_reacquisition_advances_fence_and_acquisition_count",
    ),
    Binding(
        WD,
        D.RESUMABILITY,
        NEXT_DELIVERY,
        _RETRY + "test_watcher_next_delivery_instant_is_replay_stable",
    ),
    Binding(
        AV, D.RESUMABILITY, CHECKPOINTS, _GATES + "test_restarted_run_resumes_from_checkpoints"
    ),
    *_each((IT, RO), D.RESUMABILITY, LOADER, _MATRIX + "test_not_applicable_cells_carry_a_reason"),
)


@dataclass(frozen=True)
class DecisionBinding:
    """An ADR Decision point, the code that implements it, and the tests that exercise that code."""

    point: int
    summary: str
    enforced_by: tuple[str, ...]
    tests: tuple[str, ...]


DECISIONS: tuple[DecisionBinding, ...] = (
    DecisionBinding(
        1,
        "one canonical policy; every operation classified before dispatch; a new class needs a policy edit",
        (LOADER, ADMIT),
        (
            _MATRIX + "test_load_rejects_unknown_class_naming_it",
            _ADMISSION + "test_admission_refuses_unknown_class",
        ),
    ),
    DecisionBinding(
        2,
        "all ten dimensions explicit per class; not-applicable carries a reason; no omission",
        (LOADER,),
        (
            _MATRIX + "test_load_rejects_omitted_cell_naming_it",
            _MATRIX + "test_load_rejects_not_applicable_for_required_dimension",
            _MATRIX + "test_not_applicable_cells_carry_a_reason",
        ),
    ),
    DecisionBinding(
        3,
        "deadline bounds attempts; <=5 attempts naming failure classes; capped exponential backoff, "
        "full jitter for reads, none for the watcher outbox; single-attempt mutation; no leased retry loop",
        (LOADER, RETRYING, WAIT, SCHEDULE, REACQUIRE),
        (
            _MATRIX + "test_load_rejects_more_than_five_attempts",
            _MATRIX + "test_load_rejects_jittered_watcher_schedule",
            _RETRY + "test_retrying_read_only_dependency_stops_after_three_attempts",
            _RETRY + "test_read_only_dependency_wait_uses_full_jitter",
            _RETRY + "test_watcher_schedule_is_identical_across_calls",
            _RETRY + "test_retrying_single_attempt_classes_call_once",
            _GATES + "test_reacquisition_advances_fence_and_acquisition_count",
        ),
    ),
    DecisionBinding(
        4,
        "canonical circuit breaker for turn/read/mutation; leased and watcher isolation boundaries; "
        "finite concurrency and backpressure; spend approval for cloud concurrency; local leased "
        "work and verification at one",
        (BREAKER, GATE, BACKLOG, LOADER),
        (
            _BREAKER + "test_circuit_breaker_from_cell_opens_after_threshold",
            _GATES + "test_permit_gate_for_class_matches_concurrency_cell",
            _ADMISSION + "test_backlog_cap_refuses_new_work_but_admits_requeue",
            _MATRIX + "test_load_rejects_cloud_concurrency_without_spend_approval",
            _MATRIX + "test_load_rejects_local_leased_work_above_concurrency_one",
        ),
    ),
    DecisionBinding(
        5,
        "effecting work needs an idempotency key and outcome reference before dispatch; leased work "
        "its current fence; one-shot claim and run key are exclusive grants",
        (ADMIT, _P + "queue_decisions.run_key"),
        (
            _ADMISSION + "test_admission_refuses_effecting_work_without_idempotency_key",
            _ADMISSION + "test_admission_refuses_effecting_work_without_outcome_reference",
            _ADMISSION + "test_admission_refuses_leased_work_without_fence",
            _GATES + "test_run_key_is_artifact_version_plus_verifier_version",
        ),
    ),
    DecisionBinding(
        6,
        "disconnect before dispatch stops; a dispatched effect is never represented as cancelled",
        (AUTHORITY, MUTATION),
        (
            _GATES + "test_disconnect_before_dispatch_stops_work",
            _GATES + "test_disconnect_after_dispatch_is_never_reported_cancelled",
            _MUTATION + "test_mutation_caller_cancelled_after_dispatch_still_settles_receipt",
        ),
    ),
    DecisionBinding(
        7,
        "mutation path: permit gate of 8, circuit, pending receipt on timeout, same-identity replay; "
        "turn disconnect authority; stale fence refused; backlog cap with requeue reserve; "
        "verification checkpoints before the terminal marker",
        (MUTATION, GATE, AUTHORITY, ADMIT, BACKLOG, CHECKPOINTS),
        (
            _MUTATION + "test_mutation_ninth_concurrent_mutation_is_rejected_without_claim",
            _MUTATION + "test_mutation_attempt_timeout_returns_pending_receipt_that_settles_later",
            _MUTATION + "test_mutation_same_identity_replay_returns_retained_outcome",
            _GATES + "test_disconnect_authority_refuses_later_turn_writes",
            _ADMISSION + "test_admission_refuses_stale_fence",
            _GATES + "test_run_complete_marker_refused_until_every_item_checkpointed",
        ),
    ),
    DecisionBinding(
        8,
        "the contract verifier owns totality and bindings; the cancel-after-dispatch negative "
        "control must fail",
        (
            _P + "verifier.verify_contract",
            _P + "verifier.verify_cancellation_rule",
            _P + "mutation.CancelAfterDispatchMutationPath",
        ),
        (
            _VERIFIER + "test_verify_contract_passes_on_the_real_policy",
            _VERIFIER + "test_cancellation_rule_fails_on_cancel_after_dispatch_negative_control",
        ),
    ),
)
