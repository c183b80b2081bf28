"""The FastAPI application: `create_app(settings, database_url)` builds every service once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
from fastapi import APIRouter, FastAPI, Request
from fastapi_offline import FastAPIOffline
from starlette.responses import JSONResponse, Response

from queue_server import errors
from queue_server.api import (
    dead_letters,
    ledgers,
    openapi,
    problems,
    queues,
    receipts,
    routes,
    runs,
)
from queue_server.api import schedules as schedule_routes
from queue_server.api import watchers as watcher_routes
from queue_server.api.deps import PROBLEMS, Caller
from queue_server.api.hot import LeasePath
from queue_server.api.middleware import BodyLimitAndMetrics
from queue_server.api.schemas import Problem
from queue_server.background.notifier import Notifier
from queue_server.background.scheduler import run_schedules_forever
from queue_server.background.sweeper import fold_forever, sweep_forever, sweep_runs_forever
from queue_server.console import install as install_console
from queue_server.db import Database
from queue_server.infra import backup, migrate, tracing
from queue_server.infra.http_protocol import ConnectionLimits, use_limits
from queue_server.infra.metrics import CONTENT_TYPE, Metrics
from queue_server.infra.tasks import stop_tasks, wait_event
from queue_server.models import Role
from queue_server.policy import ReliabilityPolicy, runtime_policy
from queue_server.services import Services
from queue_server.services.keys import Keys
from queue_server.settings import Settings
from queue_server.store import channels, reads
from queue_server.version import __version__

log = logging.getLogger("queue_server")


def create_app(
    settings: Settings, database_url: str, *, policy: ReliabilityPolicy | None = None
) -> FastAPI:
    """The app with every service built once, under `policy` (default: `runtime_policy()` of
    `settings.policy`). A policy document or a setting outside the envelope raises PolicyError."""
    policy = policy or runtime_policy(settings.policy or None)
    settings.bounded_by(policy)
    # Under a policy file the file wins; else the published version activated last runs.
    pinned = policy.source != "built-in"
    # Read once, here: without an OTLP endpoint nothing of tracing is loaded or installed.
    traced = tracing.configure("queue-server")
    metrics = Metrics()
    db = Database.for_api(settings, database_url, outbox_cap=policy.delivery.outbox_cap)
    db.on_unavailable = lambda cause: metrics.database_unavailable.labels(cause).inc()
    keys = Keys(db, trust_window=settings.key_cache_trust)

    async def read_secret() -> str:
        async with db.conn() as conn:
            return await channels.installation_secret(conn)

    def keys_changed(listening: bool) -> None:
        # Told at each connect and disconnect of the listener (and key notification): the
        # gauge follows it, for every reader of the metrics (the metrics listener included,
        # which never runs the /metrics route below).
        metrics.listener_connected.set(int(listening))
        keys.keys_changed(listening)

    async def placed_since(since: str | None) -> tuple[str, list[tuple[str, str]] | None]:
        metrics.watch_looks.inc()
        async with db.conn() as conn:
            return await channels.placed_since(conn, since)

    policy_published = asyncio.Event()
    notifier = Notifier(
        settings.listen_url(database_url),
        read_secret=read_secret,
        placed_since=placed_since,
        watch_interval=settings.watch_interval,
        # Probes come often enough that a healthy listener always vouches for the key cache.
        probe_interval=settings.key_cache_trust / 3,
        on_keys_changed=keys_changed,
        on_disconnect=metrics.listener_disconnects.inc,
        on_alive=keys.listener_alive,
        # A version published through another process: read at once, not at the next poll.
        on_policy=lambda: policy_published.set(),
    )
    switching = asyncio.Lock()
    scheduler: list[asyncio.Task[None]] = []

    def build(under: ReliabilityPolicy) -> Services:
        return Services.build(
            settings,
            db,
            keys=keys,
            wakeups=notifier,
            metrics=metrics,
            policy=under,
            pinned=pinned,
            adopt=adopt,
        )

    async def adopt(new: ReliabilityPolicy) -> None:
        """Run `new` in this process: every service built again under it (requests already
        running finish under the old), its load recorded, the scheduler restarted."""
        async with switching:
            running = app.state.policy
            if (new.version, new.sha256) == (running.version, running.sha256):
                return  # adopted already (the publication and its notification both ask)
            settings.bounded_by(new)
            built = build(new)
            await built.policies.record_load()
            app.state.services, app.state.policy = built, new
            if scheduler:
                scheduler.pop().cancel()
                scheduler.append(schedule(built))
            log.info("queue-server now under policy %s", new.describe())

    def schedule(under: Services) -> asyncio.Task[None]:
        return asyncio.create_task(
            run_schedules_forever(under.schedules, poll_interval=settings.schedule_poll_interval)
        )

    async def start_policy() -> None:
        """The published version activated last, if this process should run it; else the
        loaded policy's start recorded (once the database is back)."""
        with contextlib.suppress(Exception):  # no database yet: the loaded policy runs
            published = await app.state.services.policies.active()
            if published is not None:
                await adopt(published)
                return
        await app.state.services.policies.record_load_until_done()

    async def follow_published() -> None:
        """Run the published version activated last: told by the policy channel that one
        was published, and every `policy_poll_interval` in any case."""
        while True:
            await wait_event(policy_published, settings.policy_poll_interval)
            policy_published.clear()
            try:
                published = await app.state.services.policies.active()
                if published is not None:
                    await adopt(published)
            except Exception as exc:  # the next poll tries again
                log.warning("could not load the published policy: %s", exc)

    services = build(policy)

    def approval_limits() -> tuple[int, int | None]:
        """The acquire's concurrency terms under the policy the process runs now."""
        queues = app.state.services.queues
        return queues.base_limit, queues.max_approved

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log.info("queue-server %s under policy %s", __version__, policy.describe())
        await db.open()
        # Every version the server has run under is kept, with its digest and starts. The
        # app starts without its database (readyz says so): then it is recorded when back.
        recording = asyncio.create_task(start_policy())
        try:
            # At most 5 s; past them the recording goes on as the process serves.
            done, _ = await asyncio.wait({recording}, timeout=5)
            if done:
                recording.result()  # a refused start is raised here
        except BaseException:
            # A refused start (a policy file reusing a kept version's name) closes the
            # pool: its connection tasks left running could keep the process from exiting.
            await db.close()
            raise
        await notifier.start()
        scheduler.append(schedule(app.state.services))
        loops = [
            recording,
            asyncio.create_task(sweep_forever(db, settings, approval_limits)),
            asyncio.create_task(fold_forever(db)),
            asyncio.create_task(sweep_runs_forever(db, settings.run_sweep_interval)),
        ]
        if not pinned:
            loops.append(asyncio.create_task(follow_published()))
        try:
            yield
        finally:
            await stop_tasks([*loops, *scheduler])
            # A policy adopted while the loops stopped started a scheduler of its own.
            await stop_tasks(scheduler)
            await notifier.stop()
            await db.close()

    # Swagger UI (/docs) and ReDoc (/redoc) from the installed package's files: no CDN.
    app = FastAPIOffline(
        title="queue-server",
        version=__version__,
        description=(
            "A durable work-queue and lease server on PostgreSQL. Request bodies are JSON"
            " in UTF-8 with each object's member names unique (RFC 8259); any other body,"
            " or a charset other than UTF-8, is refused with 422 `invalid-request`."
        ),
        lifespan=lifespan,
        # Metrics are our own (/metrics); OpenTelemetry hooks would only cost time per request.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.state.settings = settings
    app.state.policy = policy
    app.state.services = services
    app.state.notifier = notifier
    app.state.metrics = metrics
    app.state.db = db
    problems.install(app)
    for module in (
        routes,
        queues,
        dead_letters,
        ledgers,
        receipts,
        runs,
        watcher_routes,
        schedule_routes,
    ):
        # The routes as their router built them at import (path, responses, parameters).
        # `include_router` would rebuild every route's parameters for each new app, on its
        # first request: about 0.1 s of CPU per app (a test suite builds hundreds).
        app.router.routes.extend(module.router.routes)
    app.router.routes.extend(service.routes)  # /healthz, /readyz, /metrics
    install_console(app)
    app.openapi = lambda: openapi.document(app)  # type: ignore[method-assign]

    # Inside the body limit and the metrics: the lean path's requests are counted and
    # limited like every other.
    app.add_middleware(LeasePath, routes_of=app.router.routes)
    app.add_middleware(
        BodyLimitAndMetrics,
        max_body=settings.max_body_bytes,
        metrics=metrics,
        base_uri=settings.problem_base_uri,
    )
    if traced:
        tracing.instrument_app(app)
    return app


def backup_ages(repo: Path | None) -> dict[str, float] | None:
    """The backup repository's ages for /metrics (a few small files read: cheap enough for
    every scrape); None without a repository."""
    if repo is None:
        return None
    return backup.Repository(repo).ages()


# The service routes, built once at import like the API's (a route's parameters and
# responses cost about a millisecond each to build, /metrics's problems three): each reads
# its app's own objects from `app.state`.
service = APIRouter(tags=["service"])


@service.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@service.get("/readyz", responses={503: {"model": Problem}})
async def readyz(request: Request) -> Response:
    """The database is reachable and its schema is at the head revision; the detail
    names the loaded reliability policy."""
    state = request.app.state
    if await _ready(state.db):
        return JSONResponse({"status": "ready", "policy": state.policy.loaded()})
    raise errors.ServiceUnavailableError(
        "The database is unreachable or its schema is not at the head revision."
    )


@service.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {}}}, **PROBLEMS},
)
async def metrics_text(request: Request, caller: Caller) -> Response:
    """Prometheus text format (an operator or admin key): requests and latency by route,
    then per queue items by state, ages, leases, dead letters, pause and counters of
    finished work, per watcher its pending and dead deliveries, and what holds back the
    database's xmin horizon. An operator key reads its own tenant's figures, an admin key
    every tenant's and the hot tables' live and dead row versions. Without a key,
    `serve --metrics-listen` publishes the same on an address of its own."""
    if caller.role is not Role.ADMIN:
        caller.require(caller.tenant or "", Role.OPERATOR)
    state = request.app.state
    metrics: Metrics = state.metrics
    settings: Settings = state.settings
    metrics.listener_connected.set(int(state.notifier.listening))
    tenant = None if caller.role is Role.ADMIN else caller.tenant
    snapshot = None
    with contextlib.suppress(errors.QueueServerError):
        snapshot = await state.services.figures.snapshot(tenant)
    ages = await asyncio.to_thread(backup_ages, settings.backup_repo)
    return Response(
        metrics.render(snapshot, tenant=tenant, backup_ages=ages, objectives=settings.objectives()),
        media_type=CONTENT_TYPE,
    )


async def _ready(db: Database) -> bool:
    """The database answers and its schema is at the head revision."""
    try:
        # Readiness probes have short timeouts of their own: answer within a second.
        async with db.conn(timeout=1.0) as conn:
            revisions = await reads.schema_revisions(conn)
    except (errors.QueueServerError, psycopg.Error):
        return False
    return revisions == migrate.head_revisions()


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory` and multi-worker serving: settings from the environment."""
    settings = Settings()
    if not settings.database_url:
        raise RuntimeError("QUEUE_SERVER_DATABASE_URL must be set for app_from_env")
    use_limits(
        ConnectionLimits(
            header_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
            keep_alive=settings.keep_alive_timeout,
            max_connections=settings.max_connections,
            max_connections_per_address=settings.max_connections_per_address,
        )
    )
    return create_app(settings, settings.database_url)
