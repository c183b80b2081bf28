"""The OpenAPI document as generated clients read it.

FastAPI describes an error response's model under `application/json`, which the server
never sends for an error; every error is `application/problem+json` (RFC 9457). The
document is corrected once, when first asked for:

- every 4xx and 5xx response has `application/problem+json` with the `Problem` schema,
  whose `code` is an open string (a client generated today must still read a code added
  later), the codes the server answers today listed in its description (the domain
  errors' and the HTTP layer's), and which admits the extra members some problems carry
  (`errors`, `tenant`, `limit`...);
- the routes that need no key (`/healthz`, `/readyz`, `/v1/policy`: no bearer dependency)
  say `security: []`, as the document's readers require;
- `servers` names this server (a relative URL: wherever the document was fetched from);
- each operation's id is its route function's name (`enqueue`, `acquire`, `complete`...):
  short and stable, unique across the document, where FastAPI's default spells the path;
- a request body's fields keep their defaults in their descriptions, not as `default`:
  a generator that treats a defaulted field as always present (openapi-typescript)
  would otherwise make the caller send every one of them.
"""

from __future__ import annotations

import importlib
import pkgutil
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

import queue_server
from queue_server import errors
from queue_server.api.schemas import Problem

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
    known = ", ".join(f"`{code}`" for code in problem_codes())
    fixed["properties"] = {
        **schema["properties"],
        "code": {
            "type": "string",
            "title": "Code",
            "description": "What happened, for a program to branch on. An open set: read an"
            f" unknown code by the response's status. Answered today: {known}.",
        },
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
    # `Problem` is no route's model (queue_server/api/deps.py: PROBLEMS); described here as
    # FastAPI describes a response model, with no `default` on a member.
    problem = Problem.model_json_schema(mode="serialization")
    for member in problem["properties"].values():
        member.pop("default", None)
    schemas["Problem"] = _problem_schema(problem)
    ref = {"$ref": "#/components/schemas/Problem"}
    for operations in doc["paths"].values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                if status[:1] in "45":
                    response["content"] = {PROBLEM_JSON: {"schema": ref}}
            operation.setdefault("security", [])
    _name_operations(app, doc)
    _defaults_described(doc)
    app.openapi_schema = doc
    return doc


def _name_operations(app: FastAPI, doc: dict[str, Any]) -> None:
    """Each operation's id: its route function's name, once in the document."""
    names = {
        (route.path_format, method.lower()): route.name
        for route in app.routes
        if isinstance(route, APIRoute) and route.include_in_schema
        for method in route.methods or ()
    }
    seen: set[str] = set()
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            name = names[(path, method)]
            if name in seen:
                raise ValueError(f"two operations are named {name!r}: rename a route function")
            seen.add(name)
            operation["operationId"] = name


def _defaults_described(doc: dict[str, Any]) -> None:
    """A request body's defaulted fields: optional, their default said in words."""
    schemas = doc.get("components", {}).get("schemas", {})
    bodies = {
        media["schema"]["$ref"].rsplit("/", 1)[-1]
        for operations in doc["paths"].values()
        for operation in operations.values()
        for media in operation.get("requestBody", {}).get("content", {}).values()
        if "$ref" in media.get("schema", {})
    }
    for name in bodies:
        for field in schemas.get(name, {}).get("properties", {}).values():
            if "default" in field:
                default = field.pop("default")
                said = f"Default: `{orjson.dumps(default).decode()}`."
                field["description"] = (
                    f"{field['description']} {said}" if field.get("description") else said
                )
