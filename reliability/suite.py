"""The whole suite, in the order ``python -m reliability`` runs it.

The fault scenarios live in :mod:`reliability.scenarios`; hostile input, the
schema fuzzer, the database-timeout, clock-skew and second-PostgreSQL scenarios
in their own modules, which build on the former (hence this registry).
"""

from __future__ import annotations

from collections.abc import Callable

from reliability.alerts import alert_delivery
from reliability.clock import clock_skew
from reliability.database import claim_storm_pg15, lock_timeouts, long_transaction
from reliability.fan_in import fan_in_under_kills
from reliability.fuzz import schema_fuzz
from reliability.hostile import hostile_input
from reliability.hung_worker import hung_worker
from reliability.pgdump import pg_dump_under_load
from reliability.rate_accuracy import rate_accuracy
from reliability.restore import restore_after_mistake
from reliability.scenarios import SCENARIOS as FAULT_SCENARIOS
from reliability.scenarios import ScenarioOutcome
from reliability.schedules import schedules_under_kills
from reliability.workflow_dag import workflow_dag

__all__ = ["QUICK", "SCENARIOS"]

SCENARIOS: dict[str, Callable[[], ScenarioOutcome]] = {
    **FAULT_SCENARIOS,
    "hostile-input": hostile_input,
    "schema-fuzz": schema_fuzz,
    "lock-timeouts": lock_timeouts,
    "long-transaction": long_transaction,
    "clock-skew": clock_skew,
    "claim-storm-pg15": claim_storm_pg15,
    "schedules-kill": schedules_under_kills,
    "hung-worker": hung_worker,
    "restore": restore_after_mistake,
    "pg-dump": pg_dump_under_load,
    "alert-delivery": alert_delivery,
    "rate-accuracy": rate_accuracy,
    "workflow-dag": workflow_dag,
    "fan-in-kill": fan_in_under_kills,
}

#: ``--quick`` (``make reliability-quick``, run by CI): every scenario once with a small
#: load and short phases, judged by the same checkers. Scenarios not named here are
#: already short and run as they are.
QUICK: dict[str, dict[str, object]] = {
    "claim-storm": {"items": 600, "processes": 3, "threads": 3, "duration": 12.0},
    "sigkill-api": {"kills": 2, "duration": 12.0},
    "lost-replies": {"duration": 6.0},
    "pg-crash": {"outage": 4.0, "duration": 12.0},
    "terminate-backends": {"rounds": 3, "duration": 12.0},
    "noisy-tenant": {"phase": 3.0, "flooders": 2},
    "hostile-input": {"rounds": 1},
    # schemathesis's coverage phase walks every schema's boundaries whatever the example
    # count (164 s of a 238 s run): the full mode runs it, the quick one the other phases.
    "schema-fuzz": {"max_examples": 5, "phases": "examples,fuzzing,stateful", "timeout": 420.0},
    "long-transaction": {"phase": 5.0},
    "claim-storm-pg15": {"items": 500, "duration": 10.0},
    "schedules-kill": {"kills": 3, "duration": 10.0},
    "restore": {"duration": 10.0, "producers": 2},
    "pg-dump": {"phase": 6.0, "hold": 10.0},
    "alert-delivery": {"quiet": 20.0, "outage": 15.0},
    "rate-accuracy": {"duration": 12.0},
    "workflow-dag": {"nodes": 300, "poisoned": 4},
    "fan-in-kill": {"rounds": 2, "items": 1_200},
}
