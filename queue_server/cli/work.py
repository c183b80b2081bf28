"""`queue-server work QUEUE -- COMMAND [ARGS...]`: a real worker around any command."""

from __future__ import annotations

import contextlib
import json as jsonlib
import os
import select
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from queue_server.cli.common import (
    EXIT_FAILURES,
    DataDir,
    Key,
    PolicyFile,
    Tenant,
    Url,
    err_console,
    fail,
    process_policy,
    tenant_session,
)
from queue_server.client import Job, Outcome, Requeue, Result, TransientError, Worker
from queue_server.client.tracing import current_context
from queue_server.client.worker import default_worker_name
from queue_server.infra import tracing
from queue_server.policy import at_most

EXIT_TEMPFAIL = 75  # sysexits.h EX_TEMPFAIL: the failure is transient
KILL_AFTER = 3.0  # seconds between SIGTERM and SIGKILL when a command must stop
STDERR_TAIL = 2000
STDERR_TRACEBACK = 4096
# Seconds an outcome waits for those of other running commands to go in the same request.
# A command takes a millisecond or more to start and end: at the SDK's 2 ms nearly every
# outcome went alone, two requests an item that the server and PostgreSQL paid for on the
# cores the commands need.
OUTCOME_LINGER = 0.02


class CommandFailedError(Exception):
    """The command exited non-zero (other than 75)."""

    def __init__(self, message: str, traceback_text: str = "") -> None:
        super().__init__(message)
        # The failure's traceback: the command's last stderr, not this process's stack.
        self.traceback_text = traceback_text


class CommandTransientError(TransientError):
    """The command exited 75 (EX_TEMPFAIL)."""

    def __init__(self, message: str, *, delay: float | None, traceback_text: str = "") -> None:
        super().__init__(message, delay=delay)
        self.traceback_text = traceback_text


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(work)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the command's process group, SIGKILL if it is still there shortly after."""
    for signum, patience in ((signal.SIGTERM, KILL_AFTER), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            return
        try:
            proc.wait(patience)
            return
        except subprocess.TimeoutExpired:
            continue


_CHECK_EVERY = 0.1  # seconds: how often a running command's worker is asked whether to stop


def _converse(
    proc: subprocess.Popen[bytes], data: bytes, should_stop: Callable[[], bool]
) -> tuple[bytes, bytes] | None:
    """Hand the command `data` on stdin, read its stdout and stderr, and wait for it to
    exit, asking `should_stop` every 0.1 s; None (the command still running) when it
    says so.

    The exit is watched on a pidfd in the same select as the pipes: `communicate` with a
    timeout polls for it instead, sleeping 0.5 ms, then 1 ms, ... (about 1 ms a command,
    and CPU). Without pidfds (not Linux 5.3+) this is that poll.
    """
    stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr
    assert stdin is not None
    assert stdout is not None
    assert stderr is not None
    try:
        exited = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return _converse_polling(proc, data, should_stop)
    out, err = bytearray(), bytearray()
    view, sent = memoryview(data), 0
    # poll(2), not epoll: nothing to create, register and close again for each command.
    with os.fdopen(exited, "rb", buffering=0) as pidfd, selectors.PollSelector() as sel:
        if data:
            sel.register(stdin, selectors.EVENT_WRITE)
        else:
            stdin.close()
        sel.register(stdout, selectors.EVENT_READ, (stdout, out))
        sel.register(stderr, selectors.EVENT_READ, (stderr, err))
        sel.register(pidfd, selectors.EVENT_READ)
        # Until it has exited and both pipes are at their end (what it left in them read).
        while sel.get_map():
            for key, _ in sel.select(_CHECK_EVERY):
                if key.fileobj is pidfd:
                    sel.unregister(pidfd)
                    if not stdin.closed:  # it exited before reading all of its stdin
                        sel.unregister(stdin)
                        stdin.close()
                elif key.fileobj is stdin:
                    try:
                        sent += os.write(key.fd, view[sent : sent + select.PIPE_BUF])
                    except BrokenPipeError:
                        sent = len(data)  # the command does not read its stdin
                    if sent >= len(data):
                        sel.unregister(stdin)
                        stdin.close()
                else:
                    pipe, buffer = key.data
                    chunk = os.read(key.fd, 32768)
                    if chunk:
                        buffer.extend(chunk)
                    else:
                        sel.unregister(pipe)
                        pipe.close()
            # A process it left behind may hold a pipe open after it exited: still asked.
            if sel.get_map() and should_stop():
                return None
    proc.wait()  # it has exited: reaped at once
    return bytes(out), bytes(err)


def _converse_polling(
    proc: subprocess.Popen[bytes], data: bytes, should_stop: Callable[[], bool]
) -> tuple[bytes, bytes] | None:
    given: bytes | None = data
    while True:
        try:
            return proc.communicate(given, timeout=_CHECK_EVERY)
        except subprocess.TimeoutExpired:
            given = None  # already handed over; communicate() keeps feeding it
            if should_stop():
                return None


class CommandHandler:
    """Runs the command once per item: payload on stdin, lease facts in the environment."""

    def __init__(
        self, command: list[str], *, tenant: str, queue: str, retry_delay: float | None = None
    ) -> None:
        self.command = command
        self.tenant = tenant
        self.queue = queue
        self.retry_delay = retry_delay
        # The handler's span (else the item's enqueue context) continues in the command:
        # TRACEPARENT and TRACESTATE, as OpenTelemetry's environment carriers name them.
        # This process's environment, read once: reading os.environ decodes every entry,
        # a twentieth of the worker's CPU per command.
        inherited = ("TRACEPARENT", "TRACESTATE")
        self.environment = {k: v for k, v in os.environ.items() if k not in inherited}

    def __call__(self, job: Job) -> Any:
        env = {
            **self.environment,
            **{k.upper(): v for k, v in current_context().items()},
            "QS_ITEM_ID": job.item_id,
            "QS_FENCE": str(job.fence),
            "QS_ACQUISITION_COUNT": str(job.acquisition_count),
            "QS_QUEUE": self.queue,
            "QS_TENANT": self.tenant,
            "QS_WORKER": job.worker,
        }
        stdin = jsonlib.dumps(job.payload).encode()
        # Its own session: a Ctrl-C at the terminal reaches the worker, which decides
        # when the command stops (after the grace period), not the command directly.
        proc = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        talked = _converse(proc, stdin, job.should_stop)
        if talked is None:
            _stop(proc)
            proc.wait()
            raise Requeue("the worker stopped the command")
        stdout, stderr = talked
        if stderr:
            sys.stderr.write(stderr.decode("utf-8", errors="replace"))
            sys.stderr.flush()
        code = proc.returncode
        if code == 0:
            return parse_output(stdout)
        tail = stderr.decode("utf-8", errors="replace")[-STDERR_TAIL:].strip()
        message = f"exit {code}" + (f": {tail}" if tail else "")
        # Its last 4 KiB, whole characters only: what the item page shows.
        last = stderr[-STDERR_TRACEBACK:].decode("utf-8", errors="ignore")
        if code == EXIT_TEMPFAIL:
            raise CommandTransientError(message, delay=self.retry_delay, traceback_text=last)
        raise CommandFailedError(message, traceback_text=last)


def parse_output(stdout: bytes) -> Any:
    """The command's result: its stdout as JSON when it parses, else as text."""
    text = stdout.decode("utf-8", errors="replace")
    if not text.strip():
        return None
    try:
        return jsonlib.loads(text)
    except ValueError:
        return text[:-1] if text.endswith("\n") else text


def work(
    queue: Annotated[str, typer.Argument(help="Queue to work on.")],
    command: Annotated[list[str], typer.Argument(help="The command to run per item, after --.")],
    concurrency: Annotated[
        int, typer.Option(min=1, help="Items at once; never above the queue's limit.")
    ] = 1,
    lease_ttl: Annotated[
        float | None,
        typer.Option(
            min=1,
            help="Lease TTL (s); heartbeats every third. Default and ceiling: the policy's"
            " durable-leased-work attempt timeout (30 s in v2).",
            show_default=False,
        ),
    ] = None,
    grace: Annotated[
        float, typer.Option(min=0, help="On SIGTERM/Ctrl-C: seconds a running command gets.")
    ] = 30.0,
    name: Annotated[str | None, typer.Option(help="Worker name (default: hostname-pid).")] = None,
    wait: Annotated[float, typer.Option(min=0, max=30, help="Long-poll seconds.")] = 5.0,
    drain: Annotated[bool, typer.Option(help="Exit once nothing is due.")] = False,
    max_items: Annotated[
        int | None, typer.Option(min=1, help="Exit after handling this many items.")
    ] = None,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Annotated[bool, typer.Option("--json", help="One JSON line per item.")] = False,
    retry_delay: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="After exit 75 (transient), the item is due again after this many seconds"
            " (at most the policy's durable-leased-work backoff cap, 300 s in v2). Default:"
            " the queue's backoff, as for every other failure (1 s, 2 s, 4 s ... capped;"
            " `queue-server queues settings` shows it).",
            show_default=False,
        ),
    ] = None,
    policy_file: PolicyFile = None,
) -> None:
    """Run COMMAND for every item of QUEUE, with leases, heartbeats and fences.

    The payload is the command's stdin (JSON); QS_ITEM_ID, QS_FENCE and
    QS_ACQUISITION_COUNT (also QS_QUEUE, QS_TENANT, QS_WORKER) are in its
    environment, and TRACEPARENT (W3C): the span of this run of the command when
    OTEL_EXPORTER_OTLP_ENDPOINT is set, else the item's enqueue context if it
    has one. Exit 0 completes the item with stdout (JSON if it parses, else
    text). Exit 75 is a transient failure; any other exit is a failure: both
    requeue the item while its acquisition budget lasts, due again after the
    queue's backoff (1 s, 2 s, 4 s ... up to its cap), and the server
    quarantines it after that. If the lease is lost the command is stopped and
    nothing is submitted. SIGTERM or Ctrl-C: take no more work, give running
    commands --grace seconds, then stop them and requeue their items; a second
    signal stops them at once.

    With --drain or --max-items the exit status is 1 when any item failed (its
    command failed, or its lease was lost), 0 when every one completed.

    Example: [bold]queue-server work emails --concurrency 4 -- ./send-email.sh[/bold]
    """
    program = command[0]
    if shutil.which(program) is None:
        fail("Command not found", f"{program!r} is not an executable file or on PATH")
    policy = process_policy(policy_file)
    leased = policy.leased_work
    at_most(
        retry_delay or 0.0,
        leased.backoff_cap,
        setting="--retry-delay",
        cell=leased.cell("backoff_cap"),
    )
    err_console.print(f"policy {policy.describe()}", highlight=False)
    # With OTEL_EXPORTER_OTLP_ENDPOINT set, each command's span is exported from here.
    tracing.configure("queue-server-work", database=False)
    with tenant_session(url, key, data_dir, tenant, policy) as qs:
        progress = Progress()
        worker = Worker(
            qs,
            queue,
            CommandHandler(command, tenant=qs.tenant or "", queue=queue, retry_delay=retry_delay),
            name=name or default_worker_name(),
            lease_ttl=lease_ttl,
            wait=wait,
            concurrency=concurrency,
            policy=policy,
            linger=OUTCOME_LINGER,
        )
        live = err_console.is_terminal and not json
        if json:
            printer = progress.json_line
        elif live:
            printer = progress.above_status  # the status line stands for completed items
        else:
            printer = progress.log_line

        def report(result: Result) -> None:
            progress.add(result)
            printer(result)

        worker.on_result = report
        limit = worker.limit()
        if concurrency > limit:
            err_console.print(
                f"queue {queue} allows {limit} lease(s) at once: running {limit}"
                " (`queue-server spend approve` raises the limit)"
            )
        signals = [0]

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            signals[0] += 1
            if signals[0] == 1:
                progress.note(
                    f"stopping: no new work; {len(worker.running())} running item(s)"
                    f" get up to {grace:g}s"
                )
                worker.stop()
            else:
                progress.note("stopping now: running commands are stopped and requeued")
                worker.abort()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            with progress.live(worker.in_flight) if live else contextlib.nullcontext():
                worker.run(max_items=max_items, drain=drain, grace=grace, handle_signals=False)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if not json:
            err_console.print(progress.summary(worker.name), highlight=False)
        if (drain or max_items) and progress.failed:
            raise typer.Exit(code=EXIT_FAILURES)


STYLES = {
    Outcome.COMPLETED: "green",
    Outcome.LOST: "red",
    Outcome.QUARANTINED: "red",
    Outcome.UNSUBMITTED: "red",
}
FAILED = frozenset({Outcome.TRIAGED, Outcome.QUARANTINED, Outcome.LOST, Outcome.UNSUBMITTED})
RATE_WINDOW = 5.0  # seconds of history behind the status line's items/s


class Progress:
    """Counts outcomes; prints them as lines, as JSON, or above one live status line."""

    def __init__(self) -> None:
        self.counts: Counter[Outcome] = Counter()
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.samples: deque[tuple[float, int]] = deque([(self.started, 0)])
        self._live: Live | None = None

    def add(self, result: Result) -> None:
        with self.lock:
            self.counts[result.outcome] += 1

    @property
    def handled(self) -> int:
        return sum(self.counts.values())

    @property
    def failed(self) -> int:
        return sum(n for outcome, n in self.counts.items() if outcome in FAILED)

    def json_line(self, result: Result) -> None:
        line = {
            "item_id": result.item_id,
            "fence": result.fence,
            "outcome": result.outcome.value,
            "detail": result.detail,
        }
        with self.lock:
            sys.stdout.write(jsonlib.dumps(line) + "\n")
            sys.stdout.flush()

    @staticmethod
    def _line(result: Result) -> str:
        style = STYLES.get(result.outcome, "yellow")
        detail = f"  {escape(result.detail)}" if result.detail else ""
        return (
            f"[{style}]{result.outcome.value:<11}[/] {result.item_id} fence {result.fence}{detail}"
        )

    def log_line(self, result: Result) -> None:
        err_console.print(self._line(result), markup=True, highlight=False)

    def above_status(self, result: Result) -> None:
        """On a terminal, only what needs a look gets a line of its own."""
        if result.outcome is not Outcome.COMPLETED:
            err_console.print(self._line(result), markup=True, highlight=False)

    def note(self, text: str) -> None:
        err_console.print(text, highlight=False)

    def rate(self) -> float:
        """Items per second over the last few seconds."""
        now = time.monotonic()
        self.samples.append((now, self.handled))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW:
            self.samples.popleft()
        then, count = self.samples[0]
        return (self.handled - count) / (now - then) if now > then else 0.0

    def status(self, in_flight: int) -> Text:
        done = self.counts[Outcome.COMPLETED]
        failed = self.failed
        line = Text()
        line.append(f"done {done:,}", style="green")
        line.append(" · ")
        line.append(f"failed {failed:,}", style="red" if failed else "")
        line.append(f" · in flight {in_flight:,} · {self.rate():,.0f} items/s")
        return line

    @contextlib.contextmanager
    def live(self, in_flight: Callable[[], int]) -> Iterator[None]:
        with Live(
            get_renderable=lambda: self.status(in_flight()),
            console=err_console,
            refresh_per_second=4,
            transient=True,
        ):
            yield

    def summary(self, worker: str) -> str:
        elapsed = time.monotonic() - self.started
        parts = ", ".join(
            f"{n:,} {outcome.value}" for outcome, n in sorted(self.counts.items()) if n
        )
        rate = self.handled / elapsed if elapsed > 0 else 0.0
        return (
            f"worker {worker}: {parts or 'nothing handled'} in {elapsed:.1f}s ({rate:,.0f} items/s)"
        )
