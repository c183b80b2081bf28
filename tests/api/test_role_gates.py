"""Who may do what (a tenant's key has the role worker or operator; an admin key has every
tenant): every operation of the services, the one way in for the routes, the console
and the CLI, asked by a key of each role of the tenant, of another tenant, and by an admin
key. A worker key works its items and reads; an operator
key also changes and triages; only an admin key manages tenants, keys and policies. Each
gate is the operation's first step, so a refused key is refused before any argument or
the database is looked at: the operations are called here with placeholder arguments."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

from queue_server import errors
from queue_server.app import create_app
from queue_server.auth import Principal
from queue_server.models import Role
from queue_server.services import Services
from queue_server.settings import Settings

TENANT = "acme"
WORKER, OPERATOR = Role.WORKER, Role.OPERATOR
EITHER = (WORKER, OPERATOR)

# service -> operation -> the tenant roles it admits (an admin key is admitted everywhere).
GATES: dict[str, dict[str, tuple[Role, ...]]] = {
    "items": {
        "enqueue": EITHER,
        "get_item": EITHER,
        "dependencies": EITHER,
        "workflow": EITHER,
        "ledger": EITHER,
        "list_items": (OPERATOR,),
        "count_items": (OPERATOR,),
        "cancel": (OPERATOR,),
        "cancel_many": (OPERATOR,),
        "retry_many": (OPERATOR,),
        "delete_many": (OPERATOR,),
    },
    "leases": {
        "acquire": (WORKER,),
        "heartbeat": (WORKER,),
        "heartbeat_many": (WORKER,),
        "complete_many": (WORKER,),
    },
    "queues": {
        "concurrency": EITHER,
        "status": EITHER,
        "activity": EITHER,
        "history": EITHER,
        "get_queue": EITHER,
        "set_concurrency": (OPERATOR,),
        "approve_spend": (OPERATOR,),
        "revoke_spend": (OPERATOR,),
        "spend_approvals": (OPERATOR,),
        "pause": (OPERATOR,),
        "resume": (OPERATOR,),
    },
    "queue_settings": {"get": EITHER, "put": (OPERATOR,)},
    "dead_letters": {
        name: (OPERATOR,)
        for name in (
            "list_dead_letters",
            "dead_letter_of_delivery",
            "open_dead_letter_of_item",
            "show_dead_letter",
            "replay",
            "discard",
            "replay_queue",
        )
    },
    "receipts": {
        "claim": EITHER,
        "settle": EITHER,
        "get": EITHER,
        "list_pending": (OPERATOR,),
        "resolve": (OPERATOR,),
    },
    "runs": {
        "start": EITHER,
        "list_runs": EITHER,
        "get": EITHER,
        "checkpoint": EITHER,
        "complete": EITHER,
        "abandon": (OPERATOR,),
    },
    "schedules": {
        name: (OPERATOR,) for name in ("put", "get", "list", "delete", "change", "trigger")
    },
    "watchers": {
        name: (OPERATOR,)
        for name in ("create", "list", "get", "change", "rotate_secret", "deliveries", "delivery")
    },
    "tenants": {
        "get_tenant": (OPERATOR,),
        "put_tenant": (),
        "delete_tenant": (),
        "list_tenants": (),
    },
    "keys": {
        name: ()
        for name in (
            "create_key",
            "list_keys",
            "revoke_key",
            "create_admin_key",
            "list_admin_keys",
            "revoke_admin_key",
        )
    },
    "policies": {"publish": (), "history": ()},
}
# The operations about no tenant: the admin key's own.
ABOUT_NO_TENANT = {
    ("tenants", "list_tenants"),
    ("keys", "create_admin_key"),
    ("keys", "list_admin_keys"),
    ("keys", "revoke_admin_key"),
    ("policies", "publish"),
    ("policies", "history"),
}


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Services:
    """The services as the app builds them; no database is reached (nothing connects)."""
    data = tmp_path_factory.mktemp("gates")
    app = create_app(Settings(data_dir=Path(data)), "postgresql://nobody@127.0.0.1:1/none")
    services: Services = app.state.services
    return services


def _call(operation: Any, principal: Principal, about_tenant: bool) -> BaseException | None:
    """Call `operation` as `principal` with placeholders; what it raised first (or None)."""
    signature = inspect.signature(operation)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for name, parameter in signature.parameters.items():
        value: Any = principal if name in ("principal", "caller") else None
        if name == "tenant" and about_tenant:
            value = TENANT
        if parameter.default is not inspect.Parameter.empty and value is None:
            continue
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[name] = value
        else:
            args.append(value)
    try:
        result = operation(*args, **kwargs)
        if inspect.iscoroutine(result):
            asyncio.run(result)
    except Exception as exc:  # the first thing it raised is the answer
        return exc
    return None


CASES = [(service, name, roles) for service, ops in GATES.items() for name, roles in ops.items()]


def test_every_operation_that_takes_a_key_has_its_gate_here(services: Services) -> None:
    """A new operation must say here who may call it."""
    found = {
        (field, name)
        for field in (f.name for f in dataclasses.fields(services))
        for name, member in inspect.getmembers(getattr(services, field), inspect.ismethod)
        if not name.startswith("_")
        and {"principal", "caller"} & set(inspect.signature(member).parameters)
    }
    listed = {(service, name) for service, name, _ in CASES}
    # complete, requeue and triage check the role with the lease (test_holder_authority.py);
    # open_session and whoami admit every key of the tenant; verify, about one tenant or
    # every one, has its own tests.
    unlisted = {("leases", "complete"), ("leases", "requeue"), ("leases", "triage")}
    unlisted |= {("keys", "open_session"), ("keys", "whoami"), ("ledgers", "verify")}
    assert found - unlisted == listed


@pytest.mark.parametrize(
    ("service", "operation", "roles"), CASES, ids=[f"{s}.{o}" for s, o, _ in CASES]
)
def test_each_role_is_admitted_or_refused_as_the_api_says(
    services: Services, service: str, operation: str, roles: tuple[Role, ...]
) -> None:
    method = getattr(getattr(services, service), operation)
    about_tenant = (service, operation) not in ABOUT_NO_TENANT
    for role in (WORKER, OPERATOR):
        raised = _call(method, Principal("k1", TENANT, role), about_tenant)
        if role in roles:
            assert not isinstance(raised, errors.ForbiddenRoleError), (role, raised)
            assert not isinstance(raised, errors.TenantNotFoundError), (role, raised)
        else:
            assert isinstance(raised, errors.ForbiddenRoleError), (role, raised)
        if about_tenant:  # another tenant's key learns nothing: 404, never 403
            other = _call(method, Principal("k2", "other", role), about_tenant)
            assert isinstance(other, errors.TenantNotFoundError), (role, other)
    admin = _call(method, Principal("k3", None, Role.ADMIN), about_tenant)
    assert not isinstance(admin, errors.ForbiddenRoleError | errors.TenantNotFoundError), admin
