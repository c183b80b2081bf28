"""The OpenAPI document as generated clients read it.

FastAPI describes an error response's model under `application/json`, which the server
never sends for an error; every error is `application/problem+json` (RFC 9457). The
document is corrected once, when first asked for:

- every 4xx and 5xx response has `application/problem+json` with the `Problem` schema,
  whose `code` is an enum of every code the server can answer (the domain errors' and
  the HTTP layer's), and which admits the extra members some problems carry (`errors`,
  `tenant`, `limit`...);
- the routes that need no key (`/healthz`, `/readyz`, `/v1/policy`: no bearer dependency)
  say `security: []`, as the document's readers require;
- `servers` names this server (a relative URL: wherever the document was fetched from).
"""

from __future__ import annotations

import importlib
import pkgutil
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

import queue_server
from queue_server import errors

PROBLEM_JSON = "application/problem+json"
# Answered below the application: an unparsable request, a process at its connection limit.
PROTOCOL_CODES = ("malformed-request", "server-busy")


def _subclasses(base: type[BaseException]) -> list[type[BaseException]]:
    found, todo = [], [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            found.append(sub)
    return found


def problem_codes() -> list[str]:
    """Every `code` a problem document of this server can carry."""
    for info in pkgutil.walk_packages(queue_server.__path__, "queue_server."):
        if info.name.startswith(
            ("queue_server.api", "queue_server.services", "queue_server.console")
        ):
            importlib.import_module(info.name)
    codes = {getattr(cls, "code", None) for cls in _subclasses(errors.QueueServerError)}
    # Starlette's own errors (404 of an unknown path, 405...): the status's phrase.
    codes |= {s.phrase.lower().replace(" ", "-") for s in HTTPStatus if s >= 400}
    codes |= set(PROTOCOL_CODES)
    return sorted(c for c in codes if isinstance(c, str) and c)


def _problem_schema(schema: dict[str, Any]) -> dict[str, Any]:
    fixed = dict(schema)
    fixed["properties"] = {
        **schema["properties"],
        "code": {"type": "string", "enum": problem_codes(), "title": "Code"},
    }
    fixed["additionalProperties"] = True
    fixed["description"] = "An RFC 9457 problem document: `code` says what happened."
    return fixed


def document(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document, corrected as the module docstring says; built once."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
        servers=[{"url": "/", "description": "this server"}],
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas["Problem"] = _problem_schema(schemas["Problem"])
    ref = {"$ref": "#/components/schemas/Problem"}
    for operations in doc["paths"].values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                if status[:1] in "45":
                    response["content"] = {PROBLEM_JSON: {"schema": ref}}
            operation.setdefault("security", [])
    app.openapi_schema = doc
    return doc
