"""Which code enforces each cell, which test proves it, and the weakening that test catches.

Decision 8 of docs/decisions/operation-class-policy.md: the contract verifier owns
matrix totality and source bindings. Every one of the 60 cells is exactly one of:

- a `Binding`: `enforced_by` (a dotted path that must import: the runtime code that
  reads the cell), `test` (`path::name`, a test exercising that runtime, mostly a live
  server on a real PostgreSQL), and `weakening`, the name of a weakening of the runtime
  (`tests/weakenings.py`) under which that test must fail. `python -m tests.contract`
  (run by `make test`) applies each weakening and requires the failure; a binding
  whose test survives its weakening proves nothing and fails the contract;
- `not-applicable` in the policy itself, with its reason;
- `DECLARED`: a value the policy states but no runtime path of this server applies,
  with the reason. Listed, never claimed as enforced.

`NEGATIVE_CONTROLS` are Decision 8's negative control (a mutation weakened to cancel
after dispatch) on the in-process path and on the REST-backed bridge: each must make
its test fail too. `EXTRA_PROOFS` are further weakenings of cells bound here (the batch
routes, triage, each guard of each holder statement), proven beside the bindings.
"""

from __future__ import annotations

from dataclasses import dataclass

from queue_server.policy.model import Dimension, OperationClass, cell_name

OC = OperationClass
D = Dimension


@dataclass(frozen=True)
class Binding:
    operation_class: OperationClass
    dimension: Dimension
    enforced_by: str
    test: str
    weakening: str

    @property
    def cell(self) -> str:
        return cell_name(self.operation_class, self.dimension)


@dataclass(frozen=True)
class NegativeControl:
    """Decision 8's negative control on one mutation path: `weakening` must fail `test`."""

    path: str
    enforced_by: str
    test: str
    weakening: str


IT, RO, CM = OC.INTERACTIVE_TURN, OC.READ_ONLY_DEPENDENCY, OC.CONFIRMED_MUTATION
LW, WD, AV = OC.DURABLE_LEASED_WORK, OC.WATCHER_DELIVERY, OC.ARTIFACT_VERIFICATION

# The runtime code.
ENVELOPE = "queue_server.services.envelope.LeaseEnvelope"
ACQUIRE = "queue_server.store.transitions.acquire"
HEARTBEAT = "queue_server.store.transitions.heartbeat"
HOLDER = "queue_server.store.transitions.complete"
ENQUEUE = "queue_server.services.items.Items.enqueue"
RUNS = "queue_server.services.runs.VerificationRuns"
RUN_START = "queue_server.store.verification_runs.start"
RUNNER = "tests.demonstrators.verifier.VerifierRunner"
RECEIPTS = "queue_server.services.receipts.ConfirmationReceipts.list_pending"
BRIDGE = "tests.demonstrators.mutations.ConfirmedMutationBridge"
IN_PROCESS = "tests.demonstrators.mutation.ConfirmedMutationPath"
READS = "tests.demonstrators.dependency.ReadOnlyDependencyClient"
TURNS = "tests.demonstrators.turns.TurnGate"
DELIVERER = "queue_server.background.deliverer.Deliverer"

# The tests.
_ENV_T = "tests/api/test_lease_envelope.py::"
_LEASES_T = "tests/api/test_leases.py::"
_ITEMS_T = "tests/api/test_items.py::"
_FOLDS_T = "tests/operators/test_counter_folds.py::"
_SHARDS_T = "tests/transactional/test_admission_shards.py::"
_RUNS_T = "tests/verification/test_run_deadline.py::"
_RUNNER_T = "tests/verification/test_verifier_runner.py::"
_STALE_T = "tests/confirmations/test_stale_receipts.py::"
_BRIDGE_T = "tests/confirmations/test_mutation_bridge.py::"
_MUTATION_T = "tests/policy/test_policy_mutation.py::"
_READS_T = "tests/policy_server/test_read_only_dependency.py::"
_TURNS_T = "tests/policy_server/test_leased_worker_and_turns.py::"
_DELIVERY_T = "tests/watchers/test_delivery.py::"
_DEADLINE_T = "tests/watchers/test_delivery_deadline.py::"

BINDINGS: tuple[Binding, ...] = (
    # -- durable-leased-work: the server ------------------------------------------------
    Binding(
        LW,
        D.DEADLINE,
        HEARTBEAT,
        _ENV_T + "test_a_heartbeat_past_the_deadline_is_refused_and_the_item_taken_over_with_a"
        "_higher_fence",
        "drop-lease-deadline",
    ),
    Binding(
        LW,
        D.ATTEMPT_TIMEOUT,
        ENVELOPE + ".lease_ttl",
        _ENV_T
        + "test_lease_ttl_above_the_attempt_timeout_is_refused_naming_the_field_and_the_cell",
        "lift-lease-ttl-bound",
    ),
    Binding(
        LW,
        D.RETRY,
        ENVELOPE + ".budget",
        _ENV_T + "test_budget_above_the_attempt_cap_is_refused_naming_the_field_and_the_cell",
        "lift-attempt-cap",
    ),
    Binding(
        LW,
        D.BACKOFF_AND_JITTER,
        ENVELOPE + ".delay",
        _ENV_T + "test_requeue_and_triage_delay_the_item_up_to_the_backoff_cap",
        "lift-requeue-delay-cap",
    ),
    Binding(
        LW,
        D.CIRCUIT_BREAKING,
        ACQUIRE,
        _ENV_T + "test_an_item_is_acquired_at_most_the_attempt_cap_then_quarantined",
        "no-quarantine-at-budget",
    ),
    Binding(
        LW,
        D.BACKPRESSURE,
        ENQUEUE,
        _ITEMS_T + "test_enqueue_at_the_cap_is_429_and_batch_is_all_or_nothing",
        "drop-backlog-cap",
    ),
    Binding(
        LW,
        D.CONCURRENCY,
        ACQUIRE,
        _LEASES_T + "test_concurrency_limit_is_one_without_an_approval",
        "lift-leased-concurrency",
    ),
    Binding(
        LW,
        D.IDEMPOTENCY_AND_FENCING,
        HOLDER,
        _LEASES_T + "test_a_superseded_fence_is_refused_even_for_the_same_worker",
        "drop-fence-guard",
    ),
    Binding(
        LW,
        D.CANCELLATION,
        "queue_server.services.leases.Leases.acquire",
        "tests/api/test_long_poll.py::test_a_long_poll_whose_client_disconnected_hands_out_no_lease",
        "lease-to-a-gone-client",
    ),
    Binding(
        LW,
        D.RESUMABILITY,
        ACQUIRE,
        _LEASES_T + "test_expired_lease_is_taken_over_with_a_higher_fence",
        "no-expired-takeover",
    ),
    # -- artifact-verification: the runs API and the runner ------------------------------
    Binding(
        AV,
        D.DEADLINE,
        RUNS + ".checkpoint",
        _RUNS_T + "test_a_run_past_its_deadline_fails_at_its_next_checkpoint_and_blocks_nothing",
        "drop-run-deadline",
    ),
    Binding(
        AV,
        D.IDEMPOTENCY_AND_FENCING,
        RUN_START,
        "tests/verification/test_runs_api.py::"
        "test_a_complete_run_is_found_again_by_its_key_and_never_run_twice",
        "drop-run-key",
    ),
    Binding(
        AV,
        D.CONCURRENCY,
        RUN_START,
        _RUNS_T + "test_an_operator_abandons_a_run_with_a_reason_and_the_next_one_starts",
        "let-a-second-run-in",
    ),
    Binding(
        AV,
        D.BACKPRESSURE,
        RUNNER,
        _RUNNER_T + "test_a_second_concurrent_runner_in_the_process_is_rejected",
        "lift-verification-concurrency",
    ),
    Binding(
        AV,
        D.RETRY,
        RUNNER,
        _RUNNER_T + "test_runner_retries_transient_io_but_not_other_failures",
        "single-attempt-verification",
    ),
    Binding(
        AV,
        D.ATTEMPT_TIMEOUT,
        RUNNER + ".run",
        _RUNNER_T + "test_a_runner_without_a_timeout_of_its_own_stops_at_the_class_attempt_timeout",
        "lift-verification-attempt-timeout",
    ),
    Binding(
        AV,
        D.BACKOFF_AND_JITTER,
        RUNNER + "._verify_one",
        _RUNNER_T + "test_runner_waits_the_class_backoff_between_transient_retries",
        "lift-verification-backoff",
    ),
    Binding(
        AV,
        D.CANCELLATION,
        RUNNER + ".run",
        _RUNNER_T + "test_restarted_verifier_resumes_from_its_checkpoints",
        "runner-ignores-stop",
    ),
    Binding(
        AV,
        D.RESUMABILITY,
        RUNS + ".start",
        _RUNNER_T + "test_restarted_verifier_resumes_from_its_checkpoints",
        "run-read-back-without-checkpoints",
    ),
    # -- confirmed-mutation: the receipts API and the REST-backed bridge -----------------
    Binding(
        CM,
        D.DEADLINE,
        RECEIPTS,
        _STALE_T + "test_an_operator_settles_a_stale_pending_receipt_with_a_recorded_reason",
        "drop-receipt-deadline",
    ),
    Binding(
        CM,
        D.IDEMPOTENCY_AND_FENCING,
        "queue_server.store.confirmation_receipts.claim",
        "tests/confirmations/test_receipts_api.py::"
        "test_claim_refuses_a_key_bound_to_another_reference",
        "drop-one-shot-claim",
    ),
    Binding(
        CM,
        D.CANCELLATION,
        BRIDGE,
        _BRIDGE_T + "test_bridge_caller_cancelled_after_dispatch_still_settles_the_receipt",
        "cancel-dispatched-mutation-in-rest-bridge",
    ),
    Binding(
        CM,
        D.CONCURRENCY,
        BRIDGE,
        _BRIDGE_T + "test_bridge_rejects_the_ninth_concurrent_mutation_without_claiming",
        "lift-mutation-permits",
    ),
    Binding(
        CM,
        D.CIRCUIT_BREAKING,
        BRIDGE,
        _BRIDGE_T + "test_bridge_circuit_opens_after_repeated_adapter_failures",
        "lift-mutation-circuit",
    ),
    Binding(
        CM,
        D.ATTEMPT_TIMEOUT,
        BRIDGE,
        _BRIDGE_T
        + "test_bridge_attempt_timeout_is_the_loaded_policy_cell_and_a_longer_one_is_refused",
        "lift-mutation-attempt-timeout",
    ),
    Binding(
        CM,
        D.RETRY,
        IN_PROCESS + "._run_effect",
        _BRIDGE_T
        + "test_bridge_dispatches_a_failing_mutation_once_and_its_replay_returns_the_failure",
        "retry-a-failed-mutation",
    ),
    Binding(
        CM,
        D.RESUMABILITY,
        IN_PROCESS + "._retained",
        _BRIDGE_T
        + "test_bridge_replays_a_settled_mutation_while_its_circuit_is_open_and_refuses_a_new_one",
        "replay-behind-the-gates",
    ),
    Binding(
        CM,
        D.BACKPRESSURE,
        "tests.demonstrators.permits.PermitGate.acquire",
        _BRIDGE_T
        + "test_bridge_refuses_the_ninth_mutation_at_once_and_never_runs_it_when_a_permit_frees",
        "queue-the-ninth-mutation",
    ),
    # -- read-only-dependency: the dependency client -------------------------------------
    Binding(
        RO,
        D.RETRY,
        READS,
        _READS_T + "test_read_only_dependency_client_stops_after_three_attempts",
        "lift-read-attempts",
    ),
    Binding(
        RO,
        D.ATTEMPT_TIMEOUT,
        READS,
        _READS_T + "test_read_only_dependency_client_times_out_an_attempt_and_retries",
        "lift-read-attempt-timeout",
    ),
    Binding(
        RO,
        D.DEADLINE,
        READS,
        _READS_T + "test_read_only_dependency_client_refuses_an_effecting_call_and_a_long_deadline",
        "lift-read-deadline",
    ),
    Binding(
        RO,
        D.CIRCUIT_BREAKING,
        READS,
        _READS_T + "test_read_only_dependency_client_circuit_opens_after_repeated_failures",
        "lift-read-circuit",
    ),
    Binding(
        RO,
        D.CONCURRENCY,
        READS,
        _READS_T + "test_read_only_dependency_client_capacity_gate_rejects_beyond_its_limit",
        "lift-read-concurrency",
    ),
    Binding(
        RO,
        D.BACKOFF_AND_JITTER,
        READS,
        _READS_T
        + "test_read_only_dependency_client_waits_at_most_the_class_backoff_between_attempts",
        "lift-read-backoff",
    ),
    Binding(
        RO,
        D.IDEMPOTENCY_AND_FENCING,
        "queue_server.policy.admission.admit_operation",
        "tests/policy/test_policy_admission.py::"
        "test_admission_refuses_effecting_read_only_dependency",
        "let-reads-have-effects",
    ),
    Binding(
        RO,
        D.CANCELLATION,
        READS + ".get",
        _READS_T
        + "test_read_only_dependency_client_cancelled_by_its_caller_leaves_a_cancelled_receipt",
        "reads-run-on-after-cancel",
    ),
    # -- interactive-turn: the turn gate ---------------------------------------------------
    Binding(
        IT,
        D.CONCURRENCY,
        TURNS,
        _TURNS_T
        + "test_turn_gate_capacity_rejects_a_turn_beyond_its_limit_and_bounds_the_deadline",
        "lift-turn-concurrency",
    ),
    Binding(
        IT,
        D.DEADLINE,
        TURNS,
        _TURNS_T
        + "test_turn_gate_capacity_rejects_a_turn_beyond_its_limit_and_bounds_the_deadline",
        "lift-turn-deadline",
    ),
    Binding(
        IT,
        D.CIRCUIT_BREAKING,
        TURNS,
        _TURNS_T + "test_turn_gate_circuit_opens_after_the_class_threshold_of_failed_turns",
        "lift-turn-circuit",
    ),
    Binding(
        IT,
        D.IDEMPOTENCY_AND_FENCING,
        TURNS + ".turn",
        _TURNS_T + "test_turn_gate_refuses_a_writing_turn_without_its_id_before_it_runs",
        "turn-without-an-id",
    ),
    Binding(
        IT,
        D.CANCELLATION,
        "tests.demonstrators.cancellation.DisconnectAuthority",
        _TURNS_T + "test_turn_gate_commits_no_write_after_disconnect",
        "turn-write-after-disconnect",
    ),
    # -- watcher delivery: the deliverer and the outbox ------------------------------------
    Binding(
        WD,
        D.DEADLINE,
        DELIVERER + ".run_once",
        _DEADLINE_T + "test_a_pending_delivery_past_its_deadline_is_dead_without_an_attempt",
        "lift-delivery-deadline",
    ),
    Binding(
        WD,
        D.ATTEMPT_TIMEOUT,
        DELIVERER + "._broker",
        _DEADLINE_T + "test_an_attempt_is_cut_at_the_loaded_policy_attempt_timeout",
        "lift-delivery-attempt-timeout",
    ),
    Binding(
        WD,
        D.RETRY,
        DELIVERER + "._retry_or_dead",
        _DELIVERY_T
        + "test_failing_receiver_is_retried_on_the_persisted_schedule_then_dead_lettered",
        "lift-delivery-attempts",
    ),
    Binding(
        WD,
        D.BACKOFF_AND_JITTER,
        "queue_server.background.deliverer.schedule",
        _DELIVERY_T + "test_unscaled_schedule_is_persisted_at_the_policy_instants",
        "lift-delivery-backoff",
    ),
    Binding(
        WD,
        D.CIRCUIT_BREAKING,
        "queue_server.store.outbox.record",
        "tests/watchers/test_watchers_api.py::"
        "test_dead_delivery_is_a_dead_letter_and_replay_resends_under_the_same_key",
        "no-delivery-dead-letter",
    ),
    Binding(
        WD,
        D.CONCURRENCY,
        "queue_server.store.outbox.claim",
        "tests/watchers/test_delivery_concurrency.py::"
        "test_one_deliverer_keeps_at_most_the_class_concurrency_in_flight",
        "lift-delivery-concurrency",
    ),
    Binding(
        WD,
        D.IDEMPOTENCY_AND_FENCING,
        DELIVERER + "._request",
        _DELIVERY_T
        + "test_failing_receiver_is_retried_on_the_persisted_schedule_then_dead_lettered",
        "fresh-delivery-key-on-retry",
    ),
    Binding(
        WD,
        D.CANCELLATION,
        DELIVERER + "._cancelled",
        _DEADLINE_T
        + "test_request_timeout_wall_deadline_and_cancellation_are_three_receipt_outcomes",
        "stopped-delivery-keeps-its-claim",
    ),
    Binding(
        WD,
        D.RESUMABILITY,
        "queue_server.store.outbox.claim",
        _DELIVERY_T + "test_a_claim_lost_with_its_deliverer_is_taken_over_under_the_same_key",
        "no-lost-claim-takeover",
    ),
    # -- watcher-delivery: the outbox cap ----------------------------------------------------
    Binding(
        WD,
        D.BACKPRESSURE,
        "queue_server.db.session_settings",
        "tests/watchers/test_outbox_cap.py::"
        "test_a_flood_leaves_the_cap_pending_marks_the_watcher_and_drains_once_each_in_order",
        "lift-outbox-cap",
    ),
)

NEGATIVE_CONTROLS: tuple[NegativeControl, ...] = (
    NegativeControl(
        "in-process mutation path",
        IN_PROCESS,
        _MUTATION_T + "test_mutation_caller_cancelled_after_dispatch_still_settles_receipt",
        "cancel-dispatched-mutation-in-process",
    ),
    NegativeControl(
        "REST-backed mutation bridge",
        BRIDGE,
        _BRIDGE_T + "test_bridge_caller_cancelled_after_dispatch_still_settles_the_receipt",
        "cancel-dispatched-mutation-in-rest-bridge",
    ),
)

# -- batch routes and triage --
# Further proofs of cells bound above: the verifier binds each cell exactly once (the table
# names one enforcing point), so these run beside BINDINGS (`python -m tests.contract`) and
# stay out of the registry and the table. Each weakening removes one guard of one statement.
_BATCH_T = "tests/api/test_batch_authority.py::"
_TRIAGE_T = "tests/api/test_triage_authority.py::"
_HOLDER_T = "tests/api/test_holder_authority.py::"
COMPLETE_MANY = "queue_server.store.transitions.complete_many"
HEARTBEAT_MANY = "queue_server.store.transitions.heartbeat_many"
TRIAGE = "queue_server.store.transitions.triage"
_BATCH_COMPLETE = (
    _BATCH_T
    + "test_batch_complete_completes_only_the_live_holders_entry_and_leaves_the_refused_unchanged"
)
_BATCH_HEARTBEAT = (
    _BATCH_T
    + "test_batch_heartbeat_extends_only_the_live_holders_lease_and_leaves_the_refused_unchanged"
)
_TRIAGE_REQUEUE = (
    _TRIAGE_T
    + "test_triage_requeue_without_the_live_holders_authority_is_refused_and_changes_nothing"
)
_TRIAGE_QUARANTINE = (
    _TRIAGE_T
    + "test_triage_quarantine_without_the_live_holders_authority_is_refused_and_changes_nothing"
)
_SINGLE = (
    _HOLDER_T
    + "test_heartbeat_complete_and_requeue_without_the_live_holders_authority_change_nothing"
)
FENCING, RESUMING = D.IDEMPOTENCY_AND_FENCING, D.RESUMABILITY

EXTRA_PROOFS: tuple[Binding, ...] = (
    Binding(LW, FENCING, COMPLETE_MANY, _BATCH_COMPLETE, "batch-complete-any-holder"),
    Binding(LW, FENCING, COMPLETE_MANY, _BATCH_COMPLETE, "batch-complete-any-fence"),
    Binding(LW, RESUMING, COMPLETE_MANY, _BATCH_COMPLETE, "batch-complete-after-expiry"),
    Binding(LW, FENCING, COMPLETE_MANY, _BATCH_COMPLETE, "batch-complete-any-tenant"),
    Binding(LW, FENCING, HEARTBEAT_MANY, _BATCH_HEARTBEAT, "batch-heartbeat-any-holder"),
    Binding(LW, FENCING, HEARTBEAT_MANY, _BATCH_HEARTBEAT, "batch-heartbeat-any-fence"),
    Binding(LW, RESUMING, HEARTBEAT_MANY, _BATCH_HEARTBEAT, "batch-heartbeat-after-expiry"),
    Binding(
        LW,
        D.DEADLINE,
        HEARTBEAT_MANY,
        _BATCH_T + "test_heartbeats_single_and_batch_never_extend_a_lease_past_its_deadline",
        "batch-heartbeat-past-deadline",
    ),
    Binding(LW, FENCING, TRIAGE, _TRIAGE_REQUEUE, "triage-requeue-any-holder"),
    Binding(LW, FENCING, TRIAGE, _TRIAGE_QUARANTINE, "triage-quarantine-any-holder"),
    Binding(LW, FENCING, TRIAGE, _TRIAGE_REQUEUE, "triage-requeue-any-fence"),
    Binding(LW, FENCING, TRIAGE, _TRIAGE_QUARANTINE, "triage-quarantine-any-fence"),
    Binding(LW, RESUMING, TRIAGE, _TRIAGE_REQUEUE, "triage-requeue-after-expiry"),
    Binding(LW, RESUMING, TRIAGE, _TRIAGE_QUARANTINE, "triage-quarantine-after-expiry"),
    Binding(
        LW,
        FENCING,
        "queue_server.store.transitions.record_triage_rejected",
        _TRIAGE_T
        + "test_triage_of_an_unleased_item_by_any_key_of_the_tenant_is_refused_and_ledgered_by"
        "_its_actor",
        "triage-rejection-unrecorded",
    ),
    Binding(
        LW,
        FENCING,
        "queue_server.services.leases.Leases.triage",
        _TRIAGE_T
        + "test_a_triage_replayed_under_its_accepted_key_after_a_successor_answers_the_original_200",
        "triage-replay-rechecks-authority",
    ),
    Binding(
        LW,
        FENCING,
        HOLDER,
        "tests/api/test_lease_keys.py::"
        "test_another_worker_key_with_the_holders_name_and_fence_is_not_the_holder",
        "any-key-holds-the-lease",
    ),
    Binding(LW, FENCING, HOLDER, _SINGLE, "drop-holder-guard"),
    Binding(LW, RESUMING, HOLDER, _SINGLE, "drop-expiry-guard"),
    # drop-fence-guard (the single routes and triage) is caught by more than its bound test.
    Binding(LW, FENCING, HOLDER, _SINGLE, "drop-fence-guard"),
    Binding(LW, FENCING, TRIAGE, _TRIAGE_REQUEUE, "drop-fence-guard"),
    # The backlog the cap is checked against is the counters' latest base and the deltas
    # since (migration 0023): the fold's horizon, the readers' range and each transition's
    # delta each hold it exact.
    Binding(
        LW,
        D.BACKPRESSURE,
        "queue_server.store.counters.fold",
        _FOLDS_T + "test_a_delta_committed_after_a_fold_began_is_counted_once",
        "fold-past-running-transactions",
    ),
    Binding(
        LW,
        D.BACKPRESSURE,
        "queue_server.store.tenants.take_admission",
        _FOLDS_T + "test_a_delta_committed_after_a_fold_began_is_counted_once",
        "counters-read-above-the-base",
    ),
    Binding(
        LW,
        D.BACKPRESSURE,
        "queue_server.store.transitions.complete",
        _FOLDS_T + "test_racing_transitions_and_folds_leave_figures_equal_to_the_items_states",
        "complete-uncounted",
    ),
    Binding(
        LW,
        D.BACKPRESSURE,
        "queue_server.store.transitions.enqueue_rows",
        _FOLDS_T
        + "test_under_a_held_snapshot_reading_the_figures_and_the_backlog_does_not_grow_with_work",
        "admission-updates-the-tenant",
    ),
    # The cap in admission shards (migration 0028): each shard's room is read under its
    # lock, and each release gives the room back to the shard that admitted the item.
    Binding(
        LW,
        D.BACKPRESSURE,
        ENQUEUE,
        _SHARDS_T + "test_racing_admissions_commits_rollbacks_and_releases_keep_the_cap_exact",
        "admission-shard-unlocked",
    ),
    Binding(
        LW,
        D.BACKPRESSURE,
        HOLDER,
        _SHARDS_T + "test_racing_admissions_commits_rollbacks_and_releases_keep_the_cap_exact",
        "release-to-shard-zero",
    ),
)

# Cells the policy states that no runtime path of this server proves by a weakening yet.
DECLARED: dict[tuple[OperationClass, Dimension], str] = {
    (IT, D.ATTEMPT_TIMEOUT): "a turn's attempt is the caller's model call: the turn gate bounds"
    " the whole turn by the deadline (bound above) and no runtime path times the attempt",
    (IT, D.RETRY): "a turn is never re-run: nothing retries it, so there is nothing to weaken",
    (IT, D.BACKPRESSURE): "max-queued 0: no runtime path reads it; the turn gate rejects at"
    " its concurrency limit (bound above), so no queue forms",
    (RO, D.BACKPRESSURE): "max-queued 0: no runtime path reads it; the capacity gate rejects"
    " at the concurrency limit (bound above), so no queue forms",
}
