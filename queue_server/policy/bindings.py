"""The contract registry: each cell bound to the code that enforces it and the test that exercises it.

ADR Decision 8: the contract verifier owns matrix totality and source
bindings. `enforced_by` is a dotted path that must import; `test` is
`path::function` relative to the repository root and must exist and mention
the enforcing object: server and client code where it exists (the receipts
and verification-runs APIs, the mutation bridge, the read-only dependency
client, the leased-work worker, the verifier runner, the turn gate), the
policy package where the policy itself is the enforcement (the loader for
not-applicable cells, tenacity waits, admission envelopes). `moves_to` says
where each class's enforcement now lives; watcher delivery still moves.
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

# The server and client code that now enforces the cells.
BRIDGE = "queue_server.client.mutations.ConfirmedMutationBridge"
DURABLE_CLAIM = "queue_server.client.client.QueueClient.claim_receipt"
READS = "queue_server.client.dependency.ReadOnlyDependencyClient"
TURNS = "queue_server.client.turns.TurnGate"
LEASED_CLIENT = "queue_server.client.leased.LeasedWorkClient"
LEASED_WORKER = "queue_server.client.leased.AdmittedWorker"
RUNNER = "queue_server.client.verifier.VerifierRunner"
SERVER_ACQUIRE = "queue_server.services.items.Items.acquire"
SERVER_ENQUEUE = "queue_server.services.items.Items.enqueue"
CLI_VERIFY = "queue_server.cli.policy.app"  # the `policy` command group: show and verify

_MATRIX = _T + "test_policy_matrix.py::"
_ADMISSION = _T + "test_policy_admission.py::"
_RETRY = _T + "test_policy_retry.py::"
_BREAKER = _T + "test_policy_breaker.py::"
_GATES = _T + "test_policy_gates.py::"
_MUTATION = _T + "test_policy_mutation.py::"
_VERIFIER = _T + "test_policy_verifier.py::"
_BRIDGE_T = "tests/confirmations/test_mutation_bridge.py::"
_RUNNER_T = "tests/verification/test_verifier_runner.py::"
_READS_T = "tests/policy_server/test_read_only_dependency.py::"
_CLIENTS_T = "tests/policy_server/test_leased_worker_and_turns.py::"
_SERVER_T = "tests/policy_server/test_policy_endpoint.py::"
_CLI_T = "tests/policy_server/test_policy_cli.py::"
_LEASES_T = "tests/api/test_leases.py::"
_ITEMS_T = "tests/api/test_items.py::"
_LONG_POLL_T = "tests/api/test_long_poll.py::"

# Where each class's enforcement lives in the server and clients. Only watcher
# delivery still moves: to the watcher outbox's delivery process (watchers issue).
MOVES_TO: dict[OperationClass, str] = {
    OC.INTERACTIVE_TURN: "now in queue_server.client.turns.TurnGate; server acquire long-poll",
    OC.READ_ONLY_DEPENDENCY: "now in queue_server.client.dependency.ReadOnlyDependencyClient",
    OC.CONFIRMED_MUTATION: "now in queue_server.client.mutations + queue_server.services.receipts "
    "(durable receipts API)",
    OC.DURABLE_LEASED_WORK: "now in queue_server.services.items / store.transitions (acquire, heartbeat, "
    "backlog lock) + queue_server.client.leased",
    OC.WATCHER_DELIVERY: "moves to the watcher outbox delivery process",
    OC.ARTIFACT_VERIFICATION: "now in queue_server.services.runs (runs API) + "
    "queue_server.client.verifier.VerifierRunner",
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
    # -- deadline -------------------------------------------------------------------
    Binding(
        IT,
        D.DEADLINE,
        TURNS,
        _CLIENTS_T
        + "test_turn_gate_capacity_rejects_a_turn_beyond_its_limit_and_bounds_the_deadline",
    ),
    Binding(
        RO,
        D.DEADLINE,
        READS,
        _READS_T + "test_read_only_dependency_client_refuses_an_effecting_call_and_a_long_deadline",
    ),
    *_each(
        (CM, LW, WD, AV),
        D.DEADLINE,
        ADMIT,
        _ADMISSION + "test_admission_refuses_deadline_beyond_class_envelope",
    ),
    # -- attempt timeout ---------------------------------------------------------------
    Binding(
        IT,
        D.ATTEMPT_TIMEOUT,
        TURNS,
        _CLIENTS_T + "test_turn_gate_write_in_flight_at_disconnect_still_reaches_its_outcome",
    ),
    Binding(
        RO,
        D.ATTEMPT_TIMEOUT,
        READS,
        _READS_T + "test_read_only_dependency_client_times_out_an_attempt_and_retries",
    ),
    Binding(
        CM,
        D.ATTEMPT_TIMEOUT,
        BRIDGE,
        _BRIDGE_T
        + "test_bridge_attempt_timeout_returns_pending_receipt_that_the_effect_settles_later",
    ),
    Binding(
        LW,
        D.ATTEMPT_TIMEOUT,
        SERVER_ACQUIRE,
        _LEASES_T + "test_expired_lease_is_taken_over_with_a_higher_fence",
    ),
    Binding(
        WD,
        D.ATTEMPT_TIMEOUT,
        ADMIT,
        _ADMISSION + "test_admission_refuses_attempt_timeout_that_does_not_fit_deadline",
    ),
    Binding(
        AV,
        D.ATTEMPT_TIMEOUT,
        RUNNER,
        _RUNNER_T + "test_timeout_is_honoured_only_at_a_checkpoint_boundary",
    ),
    # -- retry ------------------------------------------------------------------------
    Binding(IT, D.RETRY, RETRYING, _RETRY + "test_retrying_single_attempt_classes_call_once"),
    Binding(
        RO, D.RETRY, READS, _READS_T + "test_read_only_dependency_client_stops_after_three_attempts"
    ),
    Binding(
        CM,
        D.RETRY,
        BRIDGE,
        _BRIDGE_T + "test_bridge_same_identity_replay_returns_retained_outcome_without_redispatch",
    ),
    Binding(
        LW,
        D.RETRY,
        LEASED_WORKER,
        _CLIENTS_T + "test_admitted_worker_requeues_a_failure_through_the_queue_not_a_retry_loop",
    ),
    Binding(
        WD, D.RETRY, RETRYING, _RETRY + "test_retrying_watcher_delivery_stops_after_five_attempts"
    ),
    Binding(
        AV,
        D.RETRY,
        RUNNER,
        _RUNNER_T + "test_runner_retries_transient_io_but_not_other_failures",
    ),
    # -- backoff and jitter --------------------------------------------------------------
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
    # -- circuit breaking ------------------------------------------------------------------
    Binding(
        IT,
        D.CIRCUIT_BREAKING,
        BREAKER,
        _BREAKER + "test_circuit_breaker_from_cell_opens_after_threshold",
    ),
    Binding(
        RO,
        D.CIRCUIT_BREAKING,
        READS,
        _READS_T + "test_read_only_dependency_client_circuit_opens_after_repeated_failures",
    ),
    Binding(
        CM,
        D.CIRCUIT_BREAKING,
        BRIDGE,
        _BRIDGE_T + "test_bridge_circuit_opens_after_repeated_adapter_failures",
    ),
    Binding(
        LW,
        D.CIRCUIT_BREAKING,
        SERVER_ACQUIRE,
        _LEASES_T + "test_items_past_their_budget_are_quarantined_not_handed_out",
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
    # -- backpressure -----------------------------------------------------------------------
    Binding(
        IT,
        D.BACKPRESSURE,
        TURNS,
        _CLIENTS_T
        + "test_turn_gate_capacity_rejects_a_turn_beyond_its_limit_and_bounds_the_deadline",
    ),
    Binding(
        RO,
        D.BACKPRESSURE,
        READS,
        _READS_T + "test_read_only_dependency_client_capacity_gate_rejects_beyond_its_limit",
    ),
    Binding(
        CM,
        D.BACKPRESSURE,
        BRIDGE,
        _BRIDGE_T + "test_bridge_rejects_the_ninth_concurrent_mutation_without_claiming",
    ),
    Binding(
        LW, D.BACKPRESSURE, SERVER_ENQUEUE, _ITEMS_T + "test_requeue_is_never_blocked_by_the_cap"
    ),
    Binding(
        WD, D.BACKPRESSURE, BACKLOG, _ADMISSION + "test_outbox_cap_refuses_new_delivery_at_cap"
    ),
    Binding(
        AV,
        D.BACKPRESSURE,
        RUNNER,
        _RUNNER_T + "test_a_second_concurrent_runner_in_the_process_is_rejected",
    ),
    # -- concurrency -------------------------------------------------------------------------
    Binding(
        IT,
        D.CONCURRENCY,
        TURNS,
        _CLIENTS_T
        + "test_turn_gate_capacity_rejects_a_turn_beyond_its_limit_and_bounds_the_deadline",
    ),
    Binding(
        RO,
        D.CONCURRENCY,
        READS,
        _READS_T + "test_read_only_dependency_client_capacity_gate_rejects_beyond_its_limit",
    ),
    Binding(
        CM,
        D.CONCURRENCY,
        BRIDGE,
        _BRIDGE_T + "test_bridge_rejects_the_ninth_concurrent_mutation_without_claiming",
    ),
    Binding(
        LW,
        D.CONCURRENCY,
        LEASED_WORKER,
        _CLIENTS_T + "test_admitted_worker_refuses_local_concurrency_above_one",
    ),
    Binding(
        WD, D.CONCURRENCY, GATE, _GATES + "test_permit_gate_for_class_matches_concurrency_cell"
    ),
    Binding(
        AV,
        D.CONCURRENCY,
        RUNNER,
        _RUNNER_T + "test_a_second_concurrent_runner_in_the_process_is_rejected",
    ),
    # -- idempotency and fencing --------------------------------------------------------------
    Binding(
        IT,
        D.IDEMPOTENCY_AND_FENCING,
        TURNS,
        _CLIENTS_T
        + "test_turn_gate_capacity_rejects_a_turn_beyond_its_limit_and_bounds_the_deadline",
    ),
    Binding(
        RO,
        D.IDEMPOTENCY_AND_FENCING,
        READS,
        _READS_T + "test_read_only_dependency_client_refuses_an_effecting_call_and_a_long_deadline",
    ),
    Binding(
        CM,
        D.IDEMPOTENCY_AND_FENCING,
        BRIDGE,
        _BRIDGE_T + "test_bridge_refuses_mutation_without_outcome_reference_before_claiming",
    ),
    Binding(
        LW,
        D.IDEMPOTENCY_AND_FENCING,
        LEASED_CLIENT,
        _CLIENTS_T
        + "test_leased_work_client_refuses_a_holder_operation_without_fence_before_dispatch",
    ),
    Binding(
        WD,
        D.IDEMPOTENCY_AND_FENCING,
        ADMIT,
        _ADMISSION + "test_admission_refuses_effecting_work_without_idempotency_key",
    ),
    Binding(
        AV,
        D.IDEMPOTENCY_AND_FENCING,
        RUNNER,
        _RUNNER_T + "test_restarted_verifier_resumes_from_its_checkpoints",
    ),
    # -- cancellation ---------------------------------------------------------------------------
    Binding(
        IT,
        D.CANCELLATION,
        TURNS,
        _CLIENTS_T + "test_turn_gate_commits_no_write_after_disconnect",
    ),
    Binding(
        RO,
        D.CANCELLATION,
        READS,
        _READS_T + "test_read_only_dependency_client_times_out_an_attempt_and_retries",
    ),
    Binding(
        CM,
        D.CANCELLATION,
        BRIDGE,
        _BRIDGE_T + "test_bridge_caller_cancelled_after_dispatch_still_settles_the_receipt",
    ),
    Binding(
        LW,
        D.CANCELLATION,
        SERVER_ACQUIRE,
        _LEASES_T + "test_requeue_returns_item_and_next_acquire_raises_fence",
    ),
    Binding(
        WD,
        D.CANCELLATION,
        AUTHORITY,
        _GATES + "test_disconnect_after_dispatch_is_never_reported_cancelled",
    ),
    Binding(
        AV,
        D.CANCELLATION,
        RUNNER,
        _RUNNER_T + "test_restarted_verifier_resumes_from_its_checkpoints",
    ),
    # -- resumability ---------------------------------------------------------------------------
    *_each((IT, RO), D.RESUMABILITY, LOADER, _MATRIX + "test_not_applicable_cells_carry_a_reason"),
    Binding(CM, D.RESUMABILITY, DURABLE_CLAIM, _SERVER_T + "test_receipts_survive_an_app_restart"),
    Binding(
        LW,
        D.RESUMABILITY,
        SERVER_ACQUIRE,
        _LEASES_T + "test_expired_lease_is_taken_over_with_a_higher_fence",
    ),
    Binding(
        WD,
        D.RESUMABILITY,
        NEXT_DELIVERY,
        _RETRY + "test_watcher_next_delivery_instant_is_replay_stable",
    ),
    Binding(
        AV,
        D.RESUMABILITY,
        RUNNER,
        _RUNNER_T + "test_restarted_verifier_resumes_from_its_checkpoints",
    ),
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
        (ADMIT, _P + "queue_decisions.run_key", BRIDGE, LEASED_CLIENT, RUNNER),
        (
            _ADMISSION + "test_admission_refuses_effecting_work_without_idempotency_key",
            _ADMISSION + "test_admission_refuses_effecting_work_without_outcome_reference",
            _ADMISSION + "test_admission_refuses_leased_work_without_fence",
            _GATES + "test_run_key_is_artifact_version_plus_verifier_version",
            _BRIDGE_T + "test_bridge_refuses_mutation_without_outcome_reference_before_claiming",
            _CLIENTS_T
            + "test_leased_work_client_refuses_a_holder_operation_without_fence_before_dispatch",
            _RUNNER_T + "test_restarted_verifier_resumes_from_its_checkpoints",
        ),
    ),
    DecisionBinding(
        6,
        "disconnect before dispatch stops; a dispatched effect is never represented as cancelled",
        (AUTHORITY, MUTATION, BRIDGE, TURNS, SERVER_ACQUIRE),
        (
            _GATES + "test_disconnect_before_dispatch_stops_work",
            _GATES + "test_disconnect_after_dispatch_is_never_reported_cancelled",
            _MUTATION + "test_mutation_caller_cancelled_after_dispatch_still_settles_receipt",
            _BRIDGE_T + "test_bridge_caller_cancelled_after_dispatch_still_settles_the_receipt",
            _CLIENTS_T + "test_turn_gate_write_in_flight_at_disconnect_still_reaches_its_outcome",
            _LONG_POLL_T + "test_a_long_poll_whose_client_disconnected_hands_out_no_lease",
        ),
    ),
    DecisionBinding(
        7,
        "mutation path: permit gate of 8, circuit, pending receipt on timeout, same-identity replay; "
        "turn disconnect authority; stale fence refused; backlog cap with requeue reserve; "
        "verification checkpoints before the terminal marker",
        (
            MUTATION,
            GATE,
            AUTHORITY,
            ADMIT,
            BACKLOG,
            CHECKPOINTS,
            BRIDGE,
            DURABLE_CLAIM,
            TURNS,
            READS,
            LEASED_WORKER,
            RUNNER,
            SERVER_ENQUEUE,
        ),
        (
            _MUTATION + "test_mutation_ninth_concurrent_mutation_is_rejected_without_claim",
            _MUTATION + "test_mutation_attempt_timeout_returns_pending_receipt_that_settles_later",
            _MUTATION + "test_mutation_same_identity_replay_returns_retained_outcome",
            _GATES + "test_disconnect_authority_refuses_later_turn_writes",
            _ADMISSION + "test_admission_refuses_stale_fence",
            _GATES + "test_run_complete_marker_refused_until_every_item_checkpointed",
            _BRIDGE_T + "test_bridge_rejects_the_ninth_concurrent_mutation_without_claiming",
            _BRIDGE_T
            + "test_bridge_attempt_timeout_returns_pending_receipt_that_the_effect_settles_later",
            _SERVER_T + "test_receipts_survive_an_app_restart",
            _CLIENTS_T + "test_turn_gate_commits_no_write_after_disconnect",
            _READS_T + "test_read_only_dependency_client_retries_unavailable_then_succeeds",
            _CLIENTS_T + "test_admitted_worker_completes_leased_work_under_its_fence",
            _ITEMS_T + "test_requeue_is_never_blocked_by_the_cap",
            _RUNNER_T + "test_timeout_is_honoured_only_at_a_checkpoint_boundary",
            _RUNNER_T + "test_runner_retries_transient_io_but_not_other_failures",
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
            CLI_VERIFY,
        ),
        (
            _VERIFIER + "test_verify_contract_passes_on_the_real_policy",
            _VERIFIER + "test_cancellation_rule_fails_on_cancel_after_dispatch_negative_control",
            _CLI_T + "test_policy_verify_passes_and_reports_the_negative_control_failing",
            _CLI_T + "test_policy_verify_exits_non_zero_when_the_mutation_cancels_after_dispatch",
        ),
    ),
)
