"""The SDK knows every problem code of the server: each has its typed exception, in its family."""

from __future__ import annotations

import importlib
import pkgutil

import queue_server
from queue_server import errors as server
from queue_server.client import errors as sdk


def server_error_classes() -> set[type[server.QueueServerError]]:
    """Every error class the server answers with (each has a status and a problem code)."""
    for info in pkgutil.walk_packages(queue_server.__path__, "queue_server."):
        if ".migrations." not in info.name and not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    found: set[type[server.QueueServerError]] = {server.QueueServerError}
    todo = [server.QueueServerError]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("queue_server."):
                found.add(sub)
    return found


def unmapped(classes: set[type[server.QueueServerError]]) -> list[str]:
    """The server's codes the SDK has no class for, or a class outside the code's status family."""
    problems = []
    for cls in sorted(classes, key=lambda c: c.code):
        mapped = sdk.BY_CODE.get(cls.code)
        family = sdk.BY_STATUS.get(cls.status, sdk.ProblemError)
        if mapped is None:
            problems.append(f"{cls.code} ({cls.__name__}, {cls.status}): not in BY_CODE")
        elif not issubclass(mapped, family):
            problems.append(f"{cls.code}: {mapped.__name__} is not a {family.__name__}")
    return problems


def test_the_sdk_maps_every_problem_code_of_the_server() -> None:
    assert unmapped(server_error_classes()) == []


def test_the_sdk_maps_no_code_the_server_does_not_have() -> None:
    assert set(sdk.BY_CODE) - {c.code for c in server_error_classes()} == set()


def test_a_code_the_sdk_does_not_know_is_found() -> None:
    class NewConditionError(server.ConflictError):
        code = "new-condition"

    class MovedFamilyError(server.ConflictError):
        code = "item-not-found"  # now a 409: the SDK's 404 class would no longer be caught

    assert unmapped(server_error_classes() | {NewConditionError, MovedFamilyError}) == [
        "item-not-found: ItemNotFoundError is not a ConflictError",
        "new-condition (NewConditionError, 409): not in BY_CODE",
    ]


def test_each_code_is_raised_as_its_class() -> None:
    for cls in server_error_classes():
        body = {"code": cls.code, "title": cls.title, "detail": "x"}
        exc = sdk.problem_error(cls.status, body)
        assert type(exc) is sdk.BY_CODE[cls.code]
        assert (exc.status, exc.code) == (cls.status, cls.code)
