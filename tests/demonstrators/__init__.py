"""Thin clients of the operation classes the policy describes beside leased work: test code.

The reliability policy (docs/decisions/operation-class-policy.md) gives every operation class
its cells; the server enforces durable leased work, watcher delivery, verification runs and
confirmed-mutation receipts itself, and the SDK (`queue_server.client`) enforces leased work on
the worker's side. The other classes' thin clients live here, because only the policy's proofs
use them: each shows a cell enforced by code that reads it from the loaded policy, and the
contract (`python -m tests.contract`) proves it by weakening that code.

- `breaker.py`: the one circuit breaker (closed -> open -> half-open), sized by a class's
  `circuit-breaking` cell; `permits.py`: a permit gate that rejects the (n+1)th holder.
- `cancellation.py`: disconnect authority (Decision 6): stop before dispatch, never after.
- `mutation.py`: the confirmed-mutation path (admit, replay, permit, circuit, claim,
  dispatch, settle) over a receipt store; `mutations.py` runs it over the server's durable
  receipts API (`ConfirmedMutationBridge`).
- `turns.py`: the interactive turn gate; `dependency.py`: admitted read-only dependency reads
  through the transport broker; `verifier.py`: the artifact verifier runner over the runs API.
- `errors.py`: what they raise (`CircuitOpenError`, `PermitUnavailableError`,
  `OperationStoppedError`).

Not installed: nothing in `queue_server` imports them.
"""
