"""The artifact verifier runner: one run per (artifact version, verifier version), resumable.

Decision 7 of docs/decisions/operation-class-policy.md for `artifact-verification`: the run
key is admitted before dispatch; concurrency is one (a second runner in this process is
rejected, and the server keeps one running run per tenant); each item is verified under
`retrying_for` (only classified transient I/O is retried, with the class's capped backoff);
each result becomes an idempotent checkpoint before the next item starts; a timeout or stop
is honoured only at that checkpoint boundary, never in the middle of an item; the terminal
marker is written after every declared item has a checkpoint. A restarted runner reads the
run back and verifies only what remains.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from queue_server.client.client import QueueClient
from queue_server.policy import (
    OperationClass,
    ReliabilityPolicy,
    admit_operation,
    retrying_for,
    run_key,
)
from queue_server.wire import VerificationRun
from tests.demonstrators.permits import PermitGate

AV = OperationClass.ARTIFACT_VERIFICATION


@functools.cache
def _process_gate() -> PermitGate:
    """Local verification runs one at a time per process (the concurrency cell is 1): one
    gate for the process, sized when first used."""
    return PermitGate.for_class(AV)


Verify = Callable[[str], Any]


@dataclass(frozen=True)
class RunReport:
    run_id: str
    run_key: str
    state: Literal["complete", "stopped-at-checkpoint"]
    resumed_from: int
    verified: tuple[str, ...]
    remaining: tuple[str, ...]
    results: dict[str, Any]


class VerifierRunner:
    """Verifies the items of one artifact with one verifier version, checkpointing each.

    Example::

        runner = VerifierRunner(client, artifact_version="app-1.4.2", verifier_version="v3",
                                items=files, verify=check_file)
        report = runner.run()            # resumes if a previous runner stopped part-way
    """

    def __init__(
        self,
        client: QueueClient,
        *,
        artifact_version: str,
        verifier_version: str,
        items: Sequence[str],
        verify: Verify,
        timeout: float | None = None,
        policy: ReliabilityPolicy | None = None,
        sleep: Callable[[float], None] | None = None,
        gate: PermitGate | None = None,
    ) -> None:
        self.key = run_key(artifact_version, verifier_version)
        # Admission before anything is dispatched: the run key is the identity and the grant.
        self.admission = admit_operation(
            AV,
            idempotency_key=self.key,
            outcome_ref=self.key,
            attempt_timeout=timeout,
            concurrency=1,
            policy=policy,
        )
        self.client = client
        self.artifact_version = artifact_version
        self.verifier_version = verifier_version
        self.items = tuple(dict.fromkeys(items))
        self.verify = verify
        self.policy = policy
        self.sleep = sleep
        self.gate = gate or _process_gate()
        self.stop = threading.Event()

    def _verify_one(self, item: str) -> Any:
        """One item under the class's retry cell: only transient I/O is retried."""
        retrying = retrying_for(AV, policy=self.policy, sleep=self.sleep)
        return retrying(self.verify, item)

    def run(self) -> RunReport:
        """Start or resume the run; stop only at a checkpoint boundary; mark it complete."""
        with self.gate.permit():
            run = self.client.start_verification_run(
                self.artifact_version, self.verifier_version, self.items
            )
            resumed_from = len(run.checkpoints)
            started = time.monotonic()
            limit = self.admission.attempt_timeout_seconds
            verified: list[str] = []
            for item in run.remaining:
                # The boundary: the previous item's checkpoint is durable before we stop.
                if self.stop.is_set() or time.monotonic() - started >= limit:
                    return self._report(
                        self.client.get_verification_run(run.run_id), verified, resumed_from
                    )
                result = self._verify_one(item)
                self.client.checkpoint(run.run_id, item, result)
                verified.append(item)
            done = self.client.complete_verification_run(run.run_id)
            return self._report(done, verified, resumed_from)

    def _report(self, run: VerificationRun, verified: list[str], resumed_from: int) -> RunReport:
        return RunReport(
            run_id=run.run_id,
            run_key=run.run_key,
            state="complete" if run.state == "complete" else "stopped-at-checkpoint",
            resumed_from=resumed_from,
            verified=tuple(verified),
            remaining=tuple(run.remaining),
            results=run.results(),
        )
