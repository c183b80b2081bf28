"""The FastAPI application: `create_app(settings, database_url)`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from queue_server import __version__, errors
from queue_server.api import dead_letters, problems, receipts, routes, runs, watchers
from queue_server.api.middleware import BodyLimitAndMetrics
from queue_server.services.items import QueueService
from queue_server.settings import Settings

log = logging.getLogger(__name__)

RECEIPT_PURGE_INTERVAL = 600.0


async def _purge_receipts_forever(service: QueueService) -> None:
    """Drop idempotency receipts past their retention, now and then."""
    while True:
        await asyncio.sleep(RECEIPT_PURGE_INTERVAL)
        try:
            await service.purge_receipts()
        except errors.QueueServerError as exc:
            log.warning("could not purge expired receipts: %s", exc.detail)


def create_app(settings: Settings, database_url: str) -> FastAPI:
    service = QueueService(settings, database_url)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.open()
        purge = asyncio.create_task(_purge_receipts_forever(service))
        try:
            yield
        finally:
            purge.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await purge
            await service.close()

    app = FastAPI(
        title="queue-server",
        version=__version__,
        description="A durable work-queue and lease server on PostgreSQL.",
        lifespan=lifespan,
        # Metrics are our own (/metrics); OpenTelemetry hooks would only cost time per request.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.state.settings = settings
    app.state.service = service
    problems.install(app)
    app.include_router(routes.router)
    app.include_router(dead_letters.router)
    app.include_router(receipts.router)
    app.include_router(runs.router)
    app.include_router(watchers.router)

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["service"], responses={503: {"model": problems_model()}})
    async def readyz() -> Response:
        """The database is reachable and its schema is at the head revision."""
        if await service.ready():
            return JSONResponse({"status": "ready"})
        raise errors.ServiceUnavailableError(
            "The database is unreachable or its schema is not at the head revision."
        )

    @app.get("/metrics", tags=["service"], response_class=Response)
    async def metrics(request: Request) -> Response:
        """Prometheus text format: requests by route and status, acquire latency, items by state."""
        with contextlib.suppress(errors.QueueServerError):
            service.metrics.items.clear()
            for row in await service.state_counts():
                service.metrics.items.labels(row["tenant_id"], row["state"]).set(row["n"])
        return Response(
            service.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    app.add_middleware(
        BodyLimitAndMetrics,
        max_body=settings.max_body_bytes,
        metrics=service.metrics,
        base_uri=settings.problem_base_uri,
    )
    return app


def problems_model() -> type:
    from queue_server.api.schemas import Problem

    return Problem


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory` and multi-worker serving: settings from the environment."""
    settings = Settings()
    if not settings.database_url:
        raise RuntimeError("QUEUE_SERVER_DATABASE_URL must be set for app_from_env")
    return create_app(settings, settings.database_url)
