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
RUNNER = "queue_server.client.verifier.VerifierRunner"
RECEIPTS = "queue_server.services.receipts.ConfirmationReceipts.list_pending"
BRIDGE = "queue_server.client.mutations.ConfirmedMutationBridge"
IN_PROCESS = "queue_server.policy.mutation.ConfirmedMutationPath"
READS = "queue_server.client.dependency.ReadOnlyDependencyClient"
TURNS = "queue_server.client.turns.TurnGate"

# The tests.
_ENV_T = "tests/api/test_lease_envelope.py::"
_LEASES_T = "tests/api/test_leases.py::"
_ITEMS_T = "tests/api/test_items.py::"
_RUNS_T = "tests/verification/test_run_deadline.py::"
_RUNNER_T = "tests/verification/test_verifier_runner.py::"
_STALE_T = "tests/confirmations/test_stale_receipts.py::"
_BRIDGE_T = "tests/confirmations/test_mutation_bridge.py::"
_MUTATION_T = "tests/policy/test_policy_mutation.py::"
_READS_T = "tests/policy_server/test_read_only_dependency.py::"
_TURNS_T = "tests/policy_server/test_leased_worker_and_turns.py::"

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
        "queue_server.services.items.Items.acquire",
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
        "queue_server.services.items.Items.triage",
        _TRIAGE_T
        + "test_a_triage_replayed_under_its_accepted_key_after_a_successor_answers_the_original_200",
        "triage-replay-rechecks-authority",
    ),
    Binding(LW, FENCING, HOLDER, _SINGLE, "drop-holder-guard"),
    Binding(LW, RESUMING, HOLDER, _SINGLE, "drop-expiry-guard"),
    # drop-fence-guard (the single routes and triage) is caught by more than its bound test.
    Binding(LW, FENCING, HOLDER, _SINGLE, "drop-fence-guard"),
    Binding(LW, FENCING, TRIAGE, _TRIAGE_REQUEUE, "drop-fence-guard"),
)

_WATCHERS = (
    "watcher delivery is enforced by the deliverer and the outbox; its bindings come with that"
    " work (see tests/policy_proof/README.md, 'Adding a class's bindings')"
)

# Cells the policy states that no runtime path of this server proves by a weakening yet.
DECLARED: dict[tuple[OperationClass, Dimension], str] = {
    **{(WD, d): _WATCHERS for d in D},
    (IT, D.ATTEMPT_TIMEOUT): "a turn's attempt is the caller's model call; the turn gate admits"
    " the caller's timeout but runs no attempt itself",
    (IT, D.RETRY): "a turn is never re-run: nothing retries it, so there is nothing to weaken",
    (IT, D.CIRCUIT_BREAKING): "the turn gate's breaker is built from the cell; no live test"
    " trips it yet",
    (IT, D.BACKPRESSURE): "max-queued 0: the turn gate rejects at its concurrency limit (bound"
    " above); there is no queue",
    (IT, D.IDEMPOTENCY_AND_FENCING): "the turn id keys the caller's writes; the gate only"
    " admits it",
    (IT, D.CANCELLATION): "the disconnect authority is exercised by its test, not yet by a"
    " weakening",
    (RO, D.BACKOFF_AND_JITTER): "full jitter is random: no weakening of it fails a test"
    " deterministically",
    (RO, D.BACKPRESSURE): "max-queued 0: the capacity gate rejects at the concurrency limit"
    " (bound above); there is no queue",
    (RO, D.IDEMPOTENCY_AND_FENCING): "reads have no effects; an effecting call is refused by"
    " admission before dispatch",
    (RO, D.CANCELLATION): "a read in flight may be discarded; nothing to observe",
    (CM, D.ATTEMPT_TIMEOUT): "the bridge's callers pass their own attempt timeout within the"
    " cell; its pending receipt is exercised by its test, not yet by a weakening",
    (CM, D.RETRY): "single attempt: the bridge replays the retained outcome instead of"
    " retrying; not yet proven by a weakening",
    (CM, D.BACKPRESSURE): "max-queued 0: the permit gate rejects at its limit (bound above)",
    (CM, D.RESUMABILITY): "receipts are rows of PostgreSQL and survive restarts; not yet"
    " proven by a weakening",
    (AV, D.ATTEMPT_TIMEOUT): "the runner stops at a checkpoint boundary past its timeout"
    " (tested); not yet proven by a weakening",
    (AV, D.BACKOFF_AND_JITTER): "the runner's retries wait the class's capped backoff; not yet"
    " proven by a weakening",
    (AV, D.CANCELLATION): "a stopped runner resumes at its checkpoints (tested); not yet proven"
    " by a weakening",
    (AV, D.RESUMABILITY): "a restarted runner resumes from its checkpoints (tested); not yet"
    " proven by a weakening",
}
