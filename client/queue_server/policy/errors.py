"""Errors of the reliability policy data: a document that breaks a rule, a file that is none."""

from __future__ import annotations

from collections.abc import Sequence


class PolicyError(ValueError):
    """The reliability policy data is invalid; each problem names its cell as `class/dimension`."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems: tuple[tuple[str, str], ...] = tuple(problems)
        super().__init__("; ".join(f"{cell}: {reason}" for cell, reason in self.problems))

    @property
    def cells(self) -> tuple[str, ...]:
        """The cells (`class/dimension`) named by the problems, in order."""
        return tuple(cell for cell, _ in self.problems)

    @classmethod
    def single(cls, cell: str, reason: str) -> PolicyError:
        return cls([(cell, reason)])


class PolicyFileError(PolicyError):
    """The policy file cannot be read as a document at all (missing, not UTF-8, not JSON,
    nested too deeply): a usage error, answered in one line."""
