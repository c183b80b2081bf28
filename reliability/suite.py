"""The whole suite, in the order ``python -m reliability`` runs it.

The fault scenarios live in :mod:`reliability.scenarios`; hostile input, the
schema fuzzer, the database-timeout, clock-skew and second-PostgreSQL scenarios
in their own modules, which build on the former (hence this registry).
"""

from __future__ import annotations

from collections.abc import Callable

from reliability.fuzz import schema_fuzz
from reliability.hostile import hostile_input
from reliability.scenarios import SCENARIOS as FAULT_SCENARIOS
from reliability.scenarios import ScenarioOutcome

__all__ = ["SCENARIOS"]

SCENARIOS: dict[str, Callable[[], ScenarioOutcome]] = {
    **FAULT_SCENARIOS,
    "hostile-input": hostile_input,
    "schema-fuzz": schema_fuzz,
}
