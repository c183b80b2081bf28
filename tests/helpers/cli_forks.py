"""A process that has imported what `queue-server` imports and forks one child per command.

Each child is a process of its own that runs the console script's entry point with the
command's arguments, environment, directory and standard streams, as `subprocess.run` of
the script would; it skips the interpreter's start and the imports, about 0.3 s of CPU
per command, which the suite runs hundreds of. The CLI's own modules (`queue_server.cli`)
are imported afresh by each child, so what they build at import (the consoles, which read
COLUMNS and NO_COLOR) comes from the command's environment.

Started by tests/helpers/cli.py as `python cli_forks.py SOCKET BIN PID`; not imported. Each
connection (a SOCK_SEQPACKET socket) asks for one command: a JSON message with its argv,
env and cwd, and its stdin, stdout and stderr as descriptors. The answers: the child's
pid, then its exit status as `subprocess` reports it (-N for a signal). A connection
closed before that kills the child. The guides' shells reach it through
tests/helpers/cli_relay.py, their `queue-server`.
"""

import os
import sys

# The script's directory comes first on sys.path, as the console script's does (.venv/bin),
# never tests/helpers/ (whose module names could shadow a library's).
sys.path[0] = os.path.dirname(sys.argv[2])

import contextlib  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import selectors  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
from typing import Any, NoReturn  # noqa: E402

CLI_PACKAGE = "queue_server.cli"


def preload() -> None:
    """Import the libraries and the runtime the CLI imports, then forget the CLI's modules.

    What stays imported is frozen (`gc.freeze`), as the console script freezes its imports
    (queue_server/cli/entry.py): a child's collections then never walk it, and so never
    write to (and copy) every page it shares with this process: 0.21 s of CPU a command
    before, 0.12 s after. The SDK's TLS context is made here too, once."""
    import queue_server.cli.main  # noqa: F401
    from queue_server.client.connection import tls_context

    tls_context()  # the CA bundle, loaded once here: about 20 ms of CPU a command
    for name in [n for n in sys.modules if n == CLI_PACKAGE or n.startswith(CLI_PACKAGE + ".")]:
        del sys.modules[name]
    gc.collect()
    gc.freeze()


def child(request: dict[str, Any], fds: list[int]) -> NoReturn:
    """Become the command: its streams, environment, directory and argv; then the entry
    point, exactly as the console script calls it. Its exit ends this process as the
    script's would (atexit, threads joined, streams flushed)."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    env: dict[str, str] = request["env"]
    if not {"LC_ALL", "LC_CTYPE", "LANG"} & env.keys() and "LC_CTYPE" in os.environ:
        # An interpreter started in the C locale coerces it to UTF-8 into its environment
        # (PEP 538), which its subprocesses inherit: this one was, and so would the command.
        env = {**env, "LC_CTYPE": os.environ["LC_CTYPE"]}
    os.environ.clear()
    os.environ.update(env)
    if {"SSL_CERT_FILE", "SSL_CERT_DIR"} & env.keys():
        from queue_server.client.connection import tls_context

        tls_context.cache_clear()  # the command's own CA bundle, as a fresh process loads
    os.chdir(request["cwd"])
    sys.argv = list(request["argv"])
    from queue_server.cli.main import app

    sys.argv[0] = sys.argv[0].removesuffix(".exe")
    sys.exit(app())


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    parent = int(sys.argv[3])  # the test process, even if it is gone by now
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    # pidfd -> (pid, the connection that waits for its exit)
    waiting: dict[int, tuple[int, socket.socket]] = {}
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    while True:
        events = selector.select(timeout=1.0)
        if os.getppid() != parent:
            # The test process is gone (one that ends with os._exit runs no atexit hook):
            # its socket and directory go with this process.
            with contextlib.suppress(OSError):
                os.unlink(path)
                os.rmdir(os.path.dirname(path))
            return
        for key, _ in events:
            if key.fileobj is listener:
                conn, _ = listener.accept()
                head, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    conn.close()
                    for pidfd, (_, other) in waiting.items():
                        os.close(pidfd)
                        other.close()
                    child(json.loads(head), fds)
                for fd in fds:
                    os.close(fd)
                conn.sendall(f"{pid}".encode())
                pidfd = os.pidfd_open(pid)
                waiting[pidfd] = (pid, conn)
                selector.register(pidfd, selectors.EVENT_READ)
                # The requester sends nothing more: its connection reads only when it is gone.
                selector.register(conn, selectors.EVENT_READ, pid)
            elif key.data is not None:
                # The requester went before its command ended (a relay killed outright):
                # the command goes too, as the relay's process would have.
                try:
                    selector.unregister(key.fileobj)
                except (KeyError, ValueError):
                    continue  # its command's end, earlier in this round, answered it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(key.data, signal.SIGKILL)
            else:
                pidfd = int(key.fd)
                pid, conn = waiting.pop(pidfd)
                selector.unregister(pidfd)
                with contextlib.suppress(KeyError):
                    selector.unregister(conn)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):  # the test stopped waiting (its timeout)
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}".encode())
                conn.close()


if __name__ == "__main__":
    preload()
    serve(sys.argv[1])
