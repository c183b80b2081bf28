"""Load generators. Each function runs in its own process (spawned by the orchestrator).

Every phase starts at an agreed wall-clock instant and ends by itself at an
agreed deadline. Each process reports its own CPU time over the phase, so the
load generator's share of the two cores is known.
"""

from __future__ import annotations

import asyncio
import resource
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvloop

from bench.http import HttpConnection, KeyMaker


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _sleep_until(wall: float) -> None:
    delay = wall - time.time()
    if delay > 0:
        await asyncio.sleep(delay)


@dataclass(frozen=True)
class CycleSpec:
    """Lease cycles: acquire `batch` items, complete them with their fences, repeat."""

    host: str
    port: int
    key: str
    tenant: str
    queue: str
    workers: int
    worker_offset: int
    batch: int
    batch_route: bool
    start_at: float
    end_at: float
    record_latency: bool = False
    window: float = 0.0
    complete_conns: int = 8


@dataclass
class CycleResult:
    items: int = 0
    acquires: int = 0
    empty_acquires: int = 0
    complete_calls: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    ran_dry_at: float = 0.0
    acquire_latency: list[float] = field(default_factory=list)
    complete_latency: list[float] = field(default_factory=list)
    windows: list[int] = field(default_factory=list)
    cpu: float = 0.0

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what[:300])


async def _cycle_worker(spec: CycleSpec, index: int, result: CycleResult) -> None:
    worker = f"w{spec.worker_offset + index}"
    acquire_path = f"/v1/tenants/{spec.tenant}/queues/{spec.queue}/leases"
    acquire_body = {"worker": worker, "lease_ttl": 30, "max_items": spec.batch, "wait": 0}
    conn = HttpConnection(spec.host, spec.port, spec.key)
    extra = [
        HttpConnection(spec.host, spec.port, spec.key)
        for _ in range(spec.complete_conns if spec.batch > 1 and not spec.batch_route else 0)
    ]
    keys = KeyMaker()
    record = spec.record_latency
    result_doc = {"ok": True}

    async def complete_one(c: HttpConnection, lease: dict[str, Any]) -> None:
        body = {"worker": worker, "fence": lease["fence"], "result": result_doc}
        t = time.perf_counter()
        status, content = await c.request(
            "POST",
            f"/v1/tenants/{spec.tenant}/items/{lease['item_id']}/complete",
            body,
            idempotency_key=keys(),
        )
        if record:
            result.complete_latency.append(time.perf_counter() - t)
        result.complete_calls += 1
        if status != 200:
            result.error(f"complete {status}: {content[:200]!r}")
        else:
            count(1)

    def count(n: int) -> None:
        result.items += n
        if spec.window > 0:
            slot = int((time.time() - spec.start_at) / spec.window)
            while len(result.windows) <= slot:
                result.windows.append(0)
            result.windows[slot] += n

    async def complete_many(leases: list[dict[str, Any]]) -> None:
        body = {
            "worker": worker,
            "completions": [
                {"item_id": lease["item_id"], "fence": lease["fence"], "result": result_doc}
                for lease in leases
            ],
        }
        t = time.perf_counter()
        status, content = await conn.request(
            "POST", f"/v1/tenants/{spec.tenant}/completions", body, idempotency_key=keys()
        )
        if record:
            result.complete_latency.append(time.perf_counter() - t)
        result.complete_calls += 1
        if status not in (200, 201, 207):
            result.error(f"completions {status}: {content[:200]!r}")
            return
        answers = orjson.loads(content)
        entries = answers.get("results", answers.get("completions", []))
        good = 0
        for entry in entries:
            entry_status = entry.get("status", 200)
            if (
                (isinstance(entry_status, int) and 200 <= entry_status < 300)
                or entry_status == "ok"
                or entry.get("state") == "completed"
            ):
                good += 1
            else:
                result.error(f"completion entry: {orjson.dumps(entry)[:200]!r}")
        count(good)

    await _sleep_until(spec.start_at)
    try:
        while time.time() < spec.end_at:
            t = time.perf_counter()
            status, content = await conn.request("POST", acquire_path, acquire_body)
            if record:
                result.acquire_latency.append(time.perf_counter() - t)
            result.acquires += 1
            if status != 200:
                result.error(f"acquire {status}: {content[:200]!r}")
                await asyncio.sleep(0.01)
                continue
            leases: list[dict[str, Any]] = orjson.loads(content)["leases"]
            if not leases:
                result.empty_acquires += 1
                result.ran_dry_at = max(result.ran_dry_at, time.time())
                break
            if len(leases) == 1:
                await complete_one(conn, leases[0])
            elif spec.batch_route:
                await complete_many(leases)
            else:
                pool = [conn, *extra]

                async def complete_slice(c: HttpConnection, part: list[dict[str, Any]]) -> None:
                    for lease in part:
                        await complete_one(c, lease)

                await asyncio.gather(
                    *(complete_slice(c, leases[i :: len(pool)]) for i, c in enumerate(pool))
                )
    finally:
        for c in (conn, *extra):
            await c.close()


async def _run_cycles(spec: CycleSpec) -> CycleResult:
    result = CycleResult()
    cpu0 = _cpu_self()
    await asyncio.gather(*(_cycle_worker(spec, i, result) for i in range(spec.workers)))
    result.cpu = _cpu_self() - cpu0
    return result


def run_cycles(spec: CycleSpec) -> CycleResult:
    return uvloop.run(_run_cycles(spec))


@dataclass(frozen=True)
class EnqueueSpec:
    host: str
    port: int
    key: str
    tenant: str
    queue: str
    producers: int
    batch: int
    start_at: float
    end_at: float
    # 0: as fast as possible; else a steady total rate of single enqueues (items/s).
    limit_items: int = 0


@dataclass
class EnqueueResult:
    items: int = 0
    calls: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    finished_at: float = 0.0
    cpu: float = 0.0


async def _run_enqueue(spec: EnqueueSpec) -> EnqueueResult:
    result = EnqueueResult()
    cpu0 = _cpu_self()
    single = spec.batch == 1
    path = f"/v1/tenants/{spec.tenant}/queues/{spec.queue}/items" + ("" if single else ":batch")
    body: dict[str, Any] = (
        {"payload": {"n": 1}}
        if single
        else {"items": [{"payload": {"n": i}} for i in range(spec.batch)]}
    )

    async def producer() -> None:
        conn = HttpConnection(spec.host, spec.port, spec.key)
        keys = KeyMaker()
        try:
            while time.time() < spec.end_at:
                if spec.limit_items and result.items >= spec.limit_items:
                    break
                status, content = await conn.request("POST", path, body, idempotency_key=keys())
                result.calls += 1
                if status != 201:
                    result.errors += 1
                    if len(result.error_samples) < 5:
                        result.error_samples.append(f"{status}: {content[:200]!r}")
                    await asyncio.sleep(0.01)
                    continue
                result.items += spec.batch
        finally:
            await conn.close()

    await _sleep_until(spec.start_at)
    await asyncio.gather(*(producer() for _ in range(spec.producers)))
    result.finished_at = time.time()
    result.cpu = _cpu_self() - cpu0
    return result


def run_enqueue(spec: EnqueueSpec) -> EnqueueResult:
    return uvloop.run(_run_enqueue(spec))


@dataclass(frozen=True)
class WakeSpec:
    host: str
    port: int
    key: str
    tenant: str
    queue: str
    rate: float
    start_at: float
    end_at: float


@dataclass
class WakeResult:
    latencies: list[float] = field(default_factory=list)
    enqueued: int = 0
    leased: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    cpu: float = 0.0


async def _run_wake(spec: WakeSpec) -> WakeResult:
    """One worker long-polls (wait=30) an empty queue; a producer enqueues at a steady rate.

    Latency per item: from the moment its enqueue request is sent to the moment
    the acquire response carrying its lease is read (same process clock).
    """
    result = WakeResult()
    cpu0 = _cpu_self()
    items_path = f"/v1/tenants/{spec.tenant}/queues/{spec.queue}/items"
    lease_path = f"/v1/tenants/{spec.tenant}/queues/{spec.queue}/leases"
    done = asyncio.Event()
    to_complete: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def error(what: str) -> None:
        result.errors += 1
        if len(result.error_samples) < 5:
            result.error_samples.append(what[:300])

    async def producer() -> None:
        conn = HttpConnection(spec.host, spec.port, spec.key)
        keys = KeyMaker()
        interval = 1.0 / spec.rate
        n = 0
        try:
            while True:
                due = spec.start_at + n * interval
                if due >= spec.end_at:
                    break
                await _sleep_until(due)
                body = {"payload": {"sent": time.perf_counter()}}
                status, content = await conn.request(
                    "POST", items_path, body, idempotency_key=keys()
                )
                if status != 201:
                    error(f"enqueue {status}: {content[:200]!r}")
                else:
                    result.enqueued += 1
                n += 1
            # The sentinel ends the worker's long poll.
            status, content = await conn.request(
                "POST", items_path, {"payload": {"stop": True}}, idempotency_key=keys()
            )
            if status != 201:
                error(f"sentinel {status}: {content[:200]!r}")
        finally:
            await conn.close()

    async def worker() -> None:
        conn = HttpConnection(spec.host, spec.port, spec.key)
        body = {"worker": "waker", "lease_ttl": 30, "max_items": 100, "wait": 30}
        try:
            while not done.is_set():
                status, content = await conn.request("POST", lease_path, body)
                now = time.perf_counter()
                if status != 200:
                    error(f"acquire {status}: {content[:200]!r}")
                    await asyncio.sleep(0.01)
                    continue
                for lease in orjson.loads(content)["leases"]:
                    payload = lease["payload"]
                    if payload.get("stop"):
                        done.set()
                        continue
                    result.latencies.append(now - payload["sent"])
                    result.leased += 1
                    to_complete.put_nowait(lease)
        finally:
            await conn.close()

    async def completer() -> None:
        conn = HttpConnection(spec.host, spec.port, spec.key)
        keys = KeyMaker()
        try:
            while not (done.is_set() and to_complete.empty()):
                try:
                    lease = await asyncio.wait_for(to_complete.get(), 0.2)
                except TimeoutError:
                    continue
                status, content = await conn.request(
                    "POST",
                    f"/v1/tenants/{spec.tenant}/items/{lease['item_id']}/complete",
                    {"worker": "waker", "fence": lease["fence"], "result": None},
                    idempotency_key=keys(),
                )
                if status != 200:
                    error(f"complete {status}: {content[:200]!r}")
        finally:
            await conn.close()

    # The worker is polling before the first item is sent.
    worker_task = asyncio.create_task(worker())
    await asyncio.sleep(max(0.0, spec.start_at - time.time() - 0.5))
    try:
        await asyncio.wait_for(
            asyncio.gather(producer(), worker_task, completer()),
            timeout=spec.end_at - time.time() + 20,
        )
    except TimeoutError:
        error("the wake-up phase did not finish in time")
    result.cpu = _cpu_self() - cpu0
    return result


def run_wake(spec: WakeSpec) -> WakeResult:
    return uvloop.run(_run_wake(spec))
