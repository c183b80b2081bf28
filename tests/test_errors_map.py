"""errors.py's docstring maps every error class of the package: none is left to be found."""

from __future__ import annotations

import importlib
import pkgutil
import re

import queue_server
from queue_server import errors


def error_classes() -> set[type[BaseException]]:
    """Every public exception class defined in the package."""
    for info in pkgutil.walk_packages(queue_server.__path__, "queue_server."):
        if ".migrations." not in info.name and not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    found: set[type[BaseException]] = set()
    todo: list[type[BaseException]] = [BaseException]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("queue_server") and not sub.__name__.startswith("_"):
                found.add(sub)
    return found


def unmapped(classes: set[type[BaseException]]) -> list[str]:
    names = set(re.findall(r"\b[A-Z]\w+\b", errors.__doc__ or ""))
    return sorted(f"{c.__module__}.{c.__name__}" for c in classes if c.__name__ not in names)


def test_every_error_class_is_on_the_map() -> None:
    assert unmapped(error_classes()) == []


def test_an_unmapped_class_is_found() -> None:
    class UnmappedConditionError(errors.QueueServerError):
        pass

    UnmappedConditionError.__module__ = "queue_server.services.items"
    assert unmapped(error_classes()) == ["queue_server.services.items.UnmappedConditionError"]
