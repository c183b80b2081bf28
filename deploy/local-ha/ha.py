#!/usr/bin/env python3
"""A local high-availability topology for queue-server, on loopback, from Debian packages.

    etcd (1) <- Patroni (3 nodes, PostgreSQL 15, synchronous_mode strict)
    HAProxy  :25000 -> the leader (Patroni REST GET /primary), :25001 -> replicas
    PgBouncer :25400 (transaction mode) -> HAProxy :25000
    queue-server serve x N (through PgBouncer; the listener through HAProxy)
    HAProxy  :25080 -> the API processes (GET /readyz); queue-server deliver x 1

pgBackRest (Debian's, which knows PostgreSQL 15) keeps a repository under the state
directory: every node archives its WAL there when it leads (archive_command), and
`backup` takes a base backup from a standby; `restore --to TIME --data-dir NEW` restores
it into a new, standalone cluster beside the live one (docs/backup.md).

Commands: up, down, status, start NAME, stop NAME, restart-api, env, backup, backups,
restore. Everything lives in
one state directory (default /var/tmp/queue-server-ha; --dir or QS_HA_DIR) that `down`
removes. Daemons run as the `postgres` user when started as root (PostgreSQL and
PgBouncer refuse root); `up` installs missing Debian packages with apt-get first.
No failover logic lives here: Patroni elects, HAProxy follows Patroni's health checks.
This file is the process control (packages, start, stop, wait, back up, restore); what
each daemon is configured with is `topology.py` beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# The topology's configuration (`topology.py`, beside this file): this file runs it.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from topology import (
    API_BASE_PORT,
    APP_USER,
    DATABASE,
    ENSURE,
    ETCD_CLIENT,
    ETCD_PEER,
    HAPROXY_API,
    HAPROXY_ERRORS,
    HAPROXY_PRIMARY,
    HAPROXY_REPLICAS,
    HAPROXY_STATS,
    HOST,
    MIN_VERSIONS,
    NODES,
    PACKAGES,
    PG_BIN,
    PG_PORTS,
    PGBOUNCER,
    REPO,
    REST_PORTS,
    SCOPE,
    STANZA,
    HAError,
    Service,
    State,
    _alive,
    _yaml,
    api_env,
    etcd_argv,
    haproxy_config,
    patroni_config,
    pgbackrest_command,
    pgbackrest_config,
    pgbouncer_config,
)


def say(message: str) -> None:
    print(f"[local-ha {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _daemon_user() -> pwd.struct_passwd | None:
    """The `postgres` user when we are root (the daemons refuse root), else None (us)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError as exc:
        raise HAError("no `postgres` user: is postgresql-15 installed?") from exc


def _chown(path: Path) -> None:
    user = _daemon_user()
    if user is not None:
        os.chown(path, user.pw_uid, user.pw_gid)


def start_service(state: State, name: str) -> int:
    """Start one service from state.json in its own session; returns its pid."""
    spec = state.services.get(name)
    if spec is None:
        raise HAError(f"unknown service {name!r}; known: {', '.join(state.services)}")
    running = state.pid(name)
    if running is not None:
        return running
    user = _daemon_user() if spec["as_postgres"] else None
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", **spec["env"]}
    if user is not None:
        env["HOME"] = str(state.root)
        env["USER"] = env["LOGNAME"] = "postgres"
    log = state.log(name)
    with log.open("ab") as out:
        if user is not None:
            _chown(log)
        proc = subprocess.Popen(
            spec["argv"],
            env=env,
            cwd=state.root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
        )
    state.pidfile(name).write_text(f"{proc.pid}\n")
    time.sleep(0.2)
    if proc.poll() is not None:
        raise HAError(f"{name} exited at once:\n{_tail(log)}")
    return proc.pid


def stop_service(
    state: State, name: str, *, sig: signal.Signals = signal.SIGTERM, timeout: float = 30.0
) -> float:
    """Signal the service's process group and wait for it to end; returns the seconds."""
    pid = state.pid(name)
    began = time.monotonic()
    if pid is None:
        return 0.0
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
    deadline = began + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            time.sleep(0.2)
            break
        time.sleep(0.05)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return time.monotonic() - began


def _tail(path: Path, lines: int = 25) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


# ------------------------------------------------------------------------ checks


def ensure_packages() -> None:
    done = subprocess.run([str(ENSURE), *PACKAGES], check=False)
    if done.returncode != 0:
        raise HAError("the Debian packages the topology needs are missing (see above)")


def _version(argv: list[str]) -> tuple[str, tuple[int, ...]]:
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    text = (out.stdout + out.stderr).strip().splitlines()[0] if (out.stdout + out.stderr) else ""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        raise HAError(f"could not read a version from {' '.join(argv)}: {text!r}")
    return text, tuple(int(g) for g in match.groups() if g is not None)


def check_versions() -> dict[str, str]:
    found: dict[str, str] = {}
    commands = {
        "patroni": ["patroni", "--version"],
        "etcd": ["etcd", "--version"],
        "haproxy": ["haproxy", "-v"],
        "pgbouncer": ["pgbouncer", "--version"],
        "postgres": [str(PG_BIN / "postgres"), "--version"],
    }
    for name, argv in commands.items():
        _text, version = _version(argv)
        if version[:2] < MIN_VERSIONS[name]:
            wanted = ".".join(map(str, MIN_VERSIONS[name]))
            raise HAError(f"{name} {'.'.join(map(str, version))} is older than {wanted}")
        found[name] = ".".join(map(str, version))
    if found["postgres"].split(".")[0] != "15":
        raise HAError(f"PostgreSQL under {PG_BIN} is {found['postgres']}, not 15")
    return found


def stop_distribution_services() -> None:
    """On a systemd host the packages start their own etcd, HAProxy, PgBouncer and a
    15/main cluster; stop them (this topology brings its own)."""
    try:
        init = Path("/proc/1/comm").read_text().strip()
    except OSError:
        return
    if init != "systemd" or shutil.which("systemctl") is None:
        return
    for unit in ("patroni", "etcd", "haproxy", "pgbouncer", "postgresql"):
        active = subprocess.run(["systemctl", "is-active", "--quiet", unit], check=False)
        if active.returncode == 0:
            say(f"stopping the distribution's {unit} service (systemctl stop {unit})")
            subprocess.run(["systemctl", "stop", unit], check=False)


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def wait_for(what: str, check: Any, timeout: float, state: State | None = None) -> Any:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except (OSError, ValueError, urllib.error.URLError, subprocess.SubprocessError) as exc:
            result, last = None, exc
        if result:
            return result
        time.sleep(0.25)
    raise HAError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last})")


def http_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def http_status(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def cluster_members() -> list[dict[str, Any]]:
    """Patroni's view of the cluster (from any node that answers)."""
    for node in NODES:
        with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
            members: list[dict[str, Any]] = http_json(
                f"http://{HOST}:{REST_PORTS[node]}/cluster", 1.0
            )["members"]
            return members
    return []


def cluster_ready(expect: int = len(NODES)) -> bool:
    """A running leader, a sync standby and the rest as replicas, all streaming."""
    members = cluster_members()
    roles = sorted(m.get("role", "") for m in members if m.get("state") in ("running", "streaming"))
    wanted = sorted(["leader", "sync_standby"] + ["replica"] * (expect - 2))
    return roles == wanted and all(m.get("lag", 0) in (0, "0", None) for m in members)


def psql(state: State, port: int, sql: str, *, user: str = "postgres", db: str = "postgres") -> str:
    password = state.data["passwords"]["postgres" if user == "postgres" else "app"]
    done = subprocess.run(
        [str(PG_BIN / "psql"), "-h", HOST, "-p", str(port), "-U", user, "-d", db, "-XAtq"],
        input=sql,
        capture_output=True,
        text=True,
        env={**os.environ, "PGPASSWORD": password, "PGCONNECT_TIMEOUT": "3"},
        check=False,
    )
    if done.returncode != 0:
        raise subprocess.SubprocessError(done.stderr.strip())
    return done.stdout.strip()


def pgbackrest(state: State, *args: str, timeout: float = 600.0) -> str:
    """Run pgBackRest as the daemons' user; HAError with its output when it fails."""
    user = _daemon_user()
    argv = [*pgbackrest_command(state).split(), *args]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        cwd=state.root,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(state.root)},
        user=user.pw_uid if user else None,
        group=user.pw_gid if user else None,
        extra_groups=[] if user else None,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise HAError(f"pgbackrest {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def queue_server_bin() -> str:
    for candidate in (
        Path(sys.executable).parent / "queue-server",
        REPO / ".venv/bin/queue-server",
    ):
        if candidate.exists():
            return str(candidate)
    raise HAError("queue-server is not installed: run `make install` first")


def write_configs(state: State, n_api: int) -> None:
    root = state.root
    for sub in ("run", "log", "pgbouncer", "haproxy", "api", "backup", *NODES):
        (root / sub).mkdir(parents=True, exist_ok=True)
        _chown(root / sub)
    (root / "etcd").mkdir(mode=0o700, exist_ok=True)
    _chown(root / "etcd")
    _chown(root)
    pw = state.data["passwords"]
    for node in NODES:
        path = root / node / "patroni.yml"
        path.write_text(_yaml(patroni_config(state, node)) + "\n", encoding="utf-8")
        path.chmod(0o600)
        _chown(path)
    # patronictl only needs the scope and the DCS.
    ctl = root / "patronictl.yml"
    ctl.write_text(
        _yaml(
            {
                "scope": SCOPE,
                "namespace": "/service/",
                "etcd3": {"hosts": [f"{HOST}:{ETCD_CLIENT}"]},
            }
        )
        + "\n",
        encoding="utf-8",
    )
    api_ports = [API_BASE_PORT + i for i in range(n_api)]
    for status in (502, 503, 504):  # the same problem documents as in production
        shutil.copy(HAPROXY_ERRORS / f"api-{status}.http", root / "haproxy")
    (root / "haproxy.cfg").write_text(haproxy_config(state, api_ports), encoding="utf-8")
    (root / "pgbouncer" / "pgbouncer.ini").write_text(pgbouncer_config(state), encoding="utf-8")
    userlist = root / "pgbouncer" / "userlist.txt"
    userlist.write_text(
        f'"{APP_USER}" "{pw["app"]}"\n"postgres" "{pw["postgres"]}"\n', encoding="utf-8"
    )
    userlist.chmod(0o600)
    (root / "pgbackrest.conf").write_text(pgbackrest_config(state), encoding="utf-8")
    for path in (
        root / "haproxy.cfg",
        root / "pgbouncer" / "pgbouncer.ini",
        userlist,
        root / "pgbackrest.conf",
    ):
        _chown(path)

    services: dict[str, Service] = {
        "etcd": Service("etcd", etcd_argv(state), {"ETCD_UNSUPPORTED_ARCH": ""}, True),
        "haproxy": Service(
            "haproxy", ["haproxy", "-db", "-f", str(root / "haproxy.cfg")], {}, True
        ),
        "pgbouncer": Service(
            "pgbouncer", ["pgbouncer", str(root / "pgbouncer" / "pgbouncer.ini")], {}, True
        ),
    }
    for node in NODES:
        services[node] = Service(node, ["patroni", str(root / node / "patroni.yml")], {}, True)
    qs = queue_server_bin()
    for i, port in enumerate(api_ports):
        argv = [qs, "serve", "--host", HOST, "--port", str(port), "--log-level", "warning"]
        services[f"api{i + 1}"] = Service(f"api{i + 1}", argv, api_env(state), False)
    services["deliver"] = Service("deliver", [qs, "deliver"], api_env(state), False)
    state.data["services"] = {name: s.to_json() for name, s in services.items()}
    pw = state.data["passwords"]["app"]
    state.data["urls"] = {
        "api": f"http://{HOST}:{HAPROXY_API}",
        "pooled": f"postgresql://{APP_USER}:{pw}@{HOST}:{PGBOUNCER}/{DATABASE}",
        "leader": f"postgresql://{APP_USER}:{pw}@{HOST}:{HAPROXY_PRIMARY}/{DATABASE}",
        "replicas": f"postgresql://{APP_USER}:{pw}@{HOST}:{HAPROXY_REPLICAS}/{DATABASE}",
        "patronictl_config": str(root / "patronictl.yml"),
        "admin_key_file": str(root / "api" / "admin.key"),
    }
    state.data["api"] = {f"api{i + 1}": port for i, port in enumerate(api_ports)}
    state.data["nodes"] = {
        node: {
            "pg_port": PG_PORTS[node],
            "rest_port": REST_PORTS[node],
            "data_dir": str(root / node / "data"),
            "config": str(root / node / "patroni.yml"),
        }
        for node in NODES
    }
    state.save()


# ------------------------------------------------------------------------ commands


def _running(state: State) -> list[str]:
    return [name for name in state.services if state.pid(name) is not None]


def up(state: State, n_api: int, via: str = "pgbouncer") -> None:
    if state.data and _running(state):
        say(f"already up ({', '.join(_running(state))} running); `down` first to start afresh")
        status(state)
        return
    began = time.monotonic()
    ensure_packages()
    versions = check_versions()
    say("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    stop_distribution_services()
    ports = [ETCD_CLIENT, ETCD_PEER, HAPROXY_PRIMARY, HAPROXY_REPLICAS, HAPROXY_STATS]
    ports += [HAPROXY_API, PGBOUNCER, *PG_PORTS.values(), *REST_PORTS.values()]
    ports += [API_BASE_PORT + i for i in range(n_api)]
    busy = [p for p in ports if not port_free(p)]
    if busy:
        raise HAError(f"ports already in use on {HOST}: {busy}")
    if state.root.exists():
        shutil.rmtree(state.root)
    state.root.mkdir(parents=True)
    state.data = {
        "passwords": {k: secrets.token_urlsafe(18) for k in ("postgres", "replicator", "app")},
        "versions": versions,
        "via": via,
    }
    write_configs(state, n_api)

    start_service(state, "etcd")
    wait_for(
        "etcd",
        lambda: http_json(f"http://{HOST}:{ETCD_CLIENT}/health").get("health") == "true",
        30,
    )
    for node in NODES:
        start_service(state, node)
    say("etcd is up; three Patroni nodes bootstrapping (one initdb, two base backups)")
    wait_for("a leader, a sync standby and a replica", cluster_ready, 120)
    # The repository's stanza, then a check that the leader's WAL reaches it.
    pgbackrest(state, "stanza-create")
    pgbackrest(state, "check")
    say(f"pgBackRest stanza {STANZA}: WAL archived from the leader to {state.root / 'backup'}")
    start_service(state, "haproxy")
    # HAProxy starts with every server up until its first checks fail: wait for one.
    leader = next(m["name"] for m in cluster_members() if m.get("role") == "leader")
    wait_for(
        "HAProxy to route writes to the leader only",
        lambda: haproxy_up(state, "postgres_primary") == [leader],
        30,
    )
    wait_for(
        "the leader through HAProxy",
        lambda: psql(state, HAPROXY_PRIMARY, "SELECT NOT pg_is_in_recovery()") == "t",
        30,
    )
    app_pw = state.data["passwords"]["app"].replace("'", "''")
    psql(
        state,
        HAPROXY_PRIMARY,
        f"CREATE ROLE {APP_USER} LOGIN PASSWORD '{app_pw}';\n"
        # The role applications' roles are made members of to enqueue in their own
        # transactions: a cluster role the server's own (no CREATEROLE) may not create.
        "CREATE ROLE queue_server_enqueuer NOLOGIN;\n"
        f"CREATE DATABASE {DATABASE} OWNER {APP_USER};",
    )
    start_service(state, "pgbouncer")
    wait_for(
        "SELECT 1 through PgBouncer",
        lambda: psql(state, PGBOUNCER, "SELECT 1", user=APP_USER, db=DATABASE),
        30,
    )
    # Migrations take session-level locks: straight to the leader, not through the pooler.
    env = {
        **os.environ,
        "QUEUE_SERVER_DATABASE_URL": state.data["urls"]["leader"],
        # The API's statement timeout becomes its role's default; a migration may run longer.
        "PGOPTIONS": "-c statement_timeout=0",
    }
    subprocess.run([queue_server_bin(), "db", "upgrade"], env=env, check=True)
    names = sorted(state.data["api"])
    for name in names:
        start_service(state, name)
        # The first one creates the admin key; the others find it.
        wait_api(state, name, 60)
    start_service(state, "deliver")
    wait_for(
        "the API through HAProxy",
        lambda: http_status(f"http://{HOST}:{HAPROXY_API}/readyz") == 200,
        30,
    )
    state.data["up_seconds"] = round(time.monotonic() - began, 1)
    state.save()
    say(f"up in {state.data['up_seconds']} s")
    status(state)


def backup(state: State, kind: str) -> None:
    """A base backup of the cluster into pgBackRest's repository, copied from a standby."""
    if not state.data or not _running(state):
        raise HAError("the topology is not up: `make ha-up` first")
    began = time.monotonic()
    pgbackrest(state, "backup", f"--type={kind}", timeout=3600)
    say(f"{kind} backup taken from a standby in {time.monotonic() - began:.1f} s")
    print(pgbackrest(state, "info"), end="")


def restore(state: State, to: str, data_dir: Path, port: int | None) -> None:
    """Restore the cluster as it was at `to` (a time, or `latest`) into `data_dir`, a new
    standalone cluster on its own port beside the live one (which is never touched)."""
    if not state.data:
        raise HAError(f"no topology state in {state.root}: nothing to restore from")
    target = None if to == "latest" else _pgbackrest_time(to)
    data_dir = data_dir.resolve()
    if data_dir.exists() and any(data_dir.iterdir()):
        raise HAError(f"{data_dir} exists and is not empty: restore into a new directory")
    if state.root.resolve() in data_dir.parents:
        raise HAError(f"{data_dir} is inside the topology's state directory: choose another")
    began = time.monotonic()
    if _running(state):
        # The moment may be in the segment the leader is writing: `check` switches it and
        # waits until it is in the archive.
        pgbackrest(state, "check")
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    _chown(data_dir)
    try:
        _restore_into(state, target, data_dir, port, began, to)
    except BaseException:
        # Nothing half-restored left behind: the same command can run again.
        for child in data_dir.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
        raise


def _restore_into(
    state: State, target: str | None, data_dir: Path, port: int | None, began: float, to: str
) -> None:
    args = ["restore", f"--pg1-path={data_dir}", "--archive-mode=off"]
    if target is not None:
        args += ["--type=time", f"--target={target}", "--target-action=promote"]
    pgbackrest(state, *args, timeout=3600)
    port = port or free_port()
    user = _daemon_user()
    options = " ".join(
        [
            f"-p {port}",
            f"-c listen_addresses={HOST}",
            f"-c unix_socket_directories={data_dir}",
            f"-c hba_file={data_dir / 'pg_hba.conf'}",
            f"-c ident_file={data_dir / 'pg_ident.conf'}",
            # A cluster of its own: no standby to wait for, no archive of the live one's.
            "-c synchronous_standby_names=",
            "-c archive_mode=off",
            "-c cluster_name=queue-server-restored",
        ]
    )
    started = subprocess.run(
        [
            *(str(PG_BIN / "pg_ctl"), "-D", str(data_dir), "-l", str(data_dir / "restore.log")),
            *("-o", options, "-w", "-t", "300", "start"),
        ],
        capture_output=True,
        text=True,
        cwd="/",
        user=user.pw_uid if user else None,
        group=user.pw_gid if user else None,
        extra_groups=[] if user else None,
        check=False,
    )
    if started.returncode != 0:
        log = _tail(data_dir / "restore.log")
        if "recovery ended before configured recovery target was reached" in log:
            raise HAError(
                f"the archive ends before {to} (nothing was committed between its last WAL"
                " and then): restore --to latest for everything it holds"
            )
        raise HAError(f"the restored cluster did not start:\n{log}")
    wait_for(
        "the restored cluster's recovery to end",
        lambda: psql(state, port, "SELECT NOT pg_is_in_recovery()") == "t",
        300,
    )
    seconds = time.monotonic() - began
    app_pw = state.data["passwords"]["app"]
    say(f"restored to {to} in {seconds:.1f} s: a new cluster on {HOST}:{port}, data {data_dir}")
    print(f"  database: postgresql://{APP_USER}:{app_pw}@{HOST}:{port}/{DATABASE}")
    print(
        f"  serve it: QUEUE_SERVER_DATABASE_URL=postgresql://{APP_USER}:{app_pw}@{HOST}:{port}"
        f"/{DATABASE} queue-server serve --port 8090"
    )
    print(f"  stop it:  {PG_BIN / 'pg_ctl'} -D {data_dir} stop   (as the postgres user)")


def _pgbackrest_time(text: str) -> str:
    """An ISO 8601 / RFC 3339 time (UTC without a zone) as pgBackRest takes it: UTC, to the
    millisecond."""
    try:
        moment = datetime.fromisoformat(text.strip().replace(" ", "T", 1))
    except ValueError:
        raise HAError(
            f"--to {text!r} is neither `latest` nor a time (2026-12-03T09:30:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}+00"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_api(state: State, name: str, timeout: float = 60.0) -> float:
    port = state.data["api"][name]
    began = time.monotonic()

    def ready() -> bool:
        if state.pid(name) is None:
            raise HAError(f"{name} exited:\n{_tail(state.log(name))}")
        return http_status(f"http://{HOST}:{port}/readyz", 1.0) == 200

    wait_for(f"{name} /readyz", ready, timeout)
    return time.monotonic() - began


def down(state: State) -> None:
    if not state.root.exists():
        say(f"nothing to stop ({state.root} does not exist)")
        return
    began = time.monotonic()
    apps = [n for n in state.services if n.startswith("api") or n == "deliver"]
    for name in apps:
        stop_service(state, name, timeout=15)
    # Every Patroni at once: stopping replicas first makes each wait for the others.
    for node in NODES:
        pid = state.pid(node)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
    for node in NODES:
        stop_service(state, node, timeout=40)
    # A SIGKILLed Patroni leaves its postmaster behind: it is not Patroni's child.
    for node in NODES:
        pidfile = state.root / node / "data" / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError, ProcessLookupError):
            pid = int(pidfile.read_text().split()[0])
            if _alive(pid):
                say(f"{node}: PostgreSQL outlived Patroni; stopping it")
                os.kill(pid, signal.SIGQUIT)
                deadline = time.monotonic() + 10
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
    for name in ("pgbouncer", "haproxy", "etcd"):
        stop_service(state, name, timeout=15)
    shutil.rmtree(state.root, ignore_errors=True)
    say(f"down in {time.monotonic() - began:.1f} s; removed {state.root}")


def status(state: State) -> None:
    if not state.data:
        print(f"not up ({state.root} has no state.json)")
        return
    rows: list[tuple[str, str, str]] = []

    def row(name: str, where: str, what: str) -> None:
        pid = state.pid(name) if name in state.services else None
        mark = f"pid {pid}" if pid else "DOWN"
        rows.append((f"{name} ({mark})", where, what))

    row("etcd", f"http://{HOST}:{ETCD_CLIENT}", "DCS (v3 API)")
    members = {m["name"]: m for m in cluster_members()}
    for node in NODES:
        m = members.get(node, {})
        role = f"{m.get('role', '?')}/{m.get('state', '?')}"
        row(
            node,
            f"{HOST}:{PG_PORTS[node]}",
            f"PostgreSQL 15 {role}; Patroni REST :{REST_PORTS[node]}",
        )
    row("haproxy", f"{HOST}:{HAPROXY_PRIMARY}", "writes -> the leader")
    rows.append(("", f"{HOST}:{HAPROXY_REPLICAS}", "reads -> replicas"))
    rows.append(("", f"http://{HOST}:{HAPROXY_API}", "the API (load-balanced)"))
    rows.append(("", f"http://{HOST}:{HAPROXY_STATS}/", "HAProxy stats"))
    row("pgbouncer", f"{HOST}:{PGBOUNCER}", "transaction pooling -> HAProxy writes")
    for name, port in sorted(state.data.get("api", {}).items()):
        row(name, f"http://{HOST}:{port}", "queue-server serve")
    row("deliver", "-", "queue-server deliver")
    width = max(len(r[0]) for r in rows)
    where = max(len(r[1]) for r in rows)
    for name, place, what in rows:
        print(f"  {name:<{width}}  {place:<{where}}  {what}")
    key = state.root / "api" / "admin.key"
    print()
    print(f"  memory (RSS):         {topology_rss(state) / 2**20:,.0f} MiB in all")
    print(f"  state, logs, configs: {state.root}")
    print(f"  admin key:            {key}")
    urls = state.data["urls"]
    print(f"  database (pooled):    {urls['pooled']}")
    print(f"  database (leader):    {urls['leader']}")
    print(f"  patronictl:           patronictl -c {state.root / 'patronictl.yml'} list")


def topology_rss(state: State) -> int:
    """Resident memory of every process of the topology: the services and their
    descendants, and the PostgreSQL servers (which are not Patroni's children)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(stat[1])
            rss[int(entry.name)] = int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
    roots = {pid for name in state.services if (pid := state.pid(name)) is not None}
    for node in NODES:
        with contextlib.suppress(OSError, ValueError, IndexError):
            roots.add(int((state.root / node / "data" / "postmaster.pid").read_text().split()[0]))
    total, seen = 0, set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += rss.get(pid, 0)
        todo += [child for child, parent in parents.items() if parent == pid]
    return total


def restart_api(state: State) -> dict[str, float]:
    """A rolling restart: drain each API process in HAProxy, stop it (SIGTERM: in-flight
    requests finish), start it, wait for /readyz, put it back; one at a time."""
    took: dict[str, float] = {}
    for name in sorted(state.data["api"]):
        began = time.monotonic()
        haproxy_command(state, f"set server queue_server_api/{name} state drain")
        wait_for(f"{name} drained", lambda n=name: haproxy_sessions(state, n) == 0, 35)
        stop_service(state, name, timeout=40)
        start_service(state, name)
        wait_api(state, name, 60)
        haproxy_command(state, f"set server queue_server_api/{name} state ready")
        wait_for(
            f"{name} back in HAProxy",
            lambda n=name: haproxy_server_status(state, n) == "UP",
            10,
        )
        took[name] = round(time.monotonic() - began, 2)
        say(f"{name} restarted in {took[name]} s")
    return took


def haproxy_command(state: State, command: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(state.root / "run" / "haproxy.sock"))
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def _haproxy_stats(state: State) -> list[dict[str, str]]:
    lines = haproxy_command(state, "show stat").splitlines()
    header = lines[0].lstrip("# ").split(",")
    return [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]


def haproxy_up(state: State, proxy: str) -> list[str]:
    """The servers of ``proxy`` that HAProxy may route to: every one not firmly DOWN
    (a server on its way down shows "UP 1/2" and still takes connections)."""
    return sorted(
        f["svname"]
        for f in _haproxy_stats(state)
        if f.get("pxname") == proxy
        and f.get("svname") not in ("FRONTEND", "BACKEND")
        and f.get("status") not in ("DOWN", "MAINT", "DRAIN")
    )


def _haproxy_stat(state: State, server: str) -> dict[str, str]:
    for fields in _haproxy_stats(state):
        if fields.get("pxname") == "queue_server_api" and fields.get("svname") == server:
            return fields
    raise HAError(f"HAProxy has no server {server}")


def haproxy_sessions(state: State, server: str) -> int:
    return int(_haproxy_stat(state, server).get("scur") or 0)


def haproxy_server_status(state: State, server: str) -> str:
    return _haproxy_stat(state, server).get("status", "")


def check(n_api: int = 2) -> None:
    """Render every config into a scratch directory and have HAProxy check its own."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="qs-ha-check-") as scratch:
        state = State(Path(scratch))
        state.data = {
            "passwords": {k: "check" for k in ("postgres", "replicator", "app")},
            "via": "pgbouncer",
        }
        write_configs(state, n_api)
        done = subprocess.run(
            ["haproxy", "-c", "-q", "-f", str(state.root / "haproxy.cfg")],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise HAError(f"haproxy -c rejected the local config:\n{done.stderr}")
        for node in NODES:
            text = (state.root / node / "patroni.yml").read_text()
            for needed in ("synchronous_mode_strict: true", "primary_start_timeout: 0"):
                if needed not in text:
                    raise HAError(f"{node}/patroni.yml lacks {needed!r}")
    say("the local topology's configs are valid")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="deploy/local-ha/ha.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("QS_HA_DIR", "/var/tmp/queue-server-ha")),
        help="state directory (default: $QS_HA_DIR or /var/tmp/queue-server-ha)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser(
        "up", help="install what is missing, start everything, print where it listens"
    )
    p_up.add_argument("--api", type=int, default=2, help="API processes (default 2)")
    p_up.add_argument(
        "--via",
        choices=("pgbouncer", "haproxy"),
        default="pgbouncer",
        help="how the API reaches the leader (default: PgBouncer in transaction mode)",
    )
    sub.add_parser("down", help="stop everything and remove the state directory")
    sub.add_parser("status", help="what runs, where it listens, each node's role")
    p_start = sub.add_parser("start", help="start one service (etcd, pg1..3, haproxy, ...)")
    p_start.add_argument("name")
    p_stop = sub.add_parser("stop", help="stop one service (SIGTERM, or --kill)")
    p_stop.add_argument("name")
    p_stop.add_argument("--kill", action="store_true", help="SIGKILL instead of SIGTERM")
    sub.add_parser("restart-api", help="rolling restart of the API processes through HAProxy")
    sub.add_parser("env", help="print state.json (URLs, ports, passwords) as JSON")
    sub.add_parser("check", help="render the configs into a scratch directory and check them")
    p_backup = sub.add_parser(
        "backup", help="a base backup into pgBackRest's repository, taken from a standby"
    )
    p_backup.add_argument(
        "--type",
        choices=("full", "diff", "incr"),
        default="full",
        help="full (default), differential or incremental",
    )
    sub.add_parser("backups", help="pgBackRest's backups and WAL archive (pgbackrest info)")
    p_restore = sub.add_parser(
        "restore", help="restore to a moment into a new standalone cluster beside the live one"
    )
    p_restore.add_argument(
        "--to", required=True, help="a time (e.g. '2026-12-03 09:30:00+00') or latest"
    )
    p_restore.add_argument(
        "--data-dir", required=True, type=Path, help="the new cluster's (empty) data directory"
    )
    p_restore.add_argument("--port", type=int, help="its port (default: a free one)")
    args = parser.parse_args(argv)
    state = State(args.dir)
    try:
        if args.command == "up":
            if not 1 <= args.api <= 8:
                parser.error("--api must be between 1 and 8")
            up(state, args.api, args.via)
        elif args.command == "down":
            down(state)
        elif args.command == "status":
            status(state)
        elif args.command == "start":
            print(start_service(state, args.name))
        elif args.command == "stop":
            sig = signal.SIGKILL if args.kill else signal.SIGTERM
            print(f"{stop_service(state, args.name, sig=sig):.2f}")
        elif args.command == "restart-api":
            print(json.dumps(restart_api(state)))
        elif args.command == "check":
            check()
        elif args.command == "env":
            print(json.dumps(state.data, indent=2, sort_keys=True))
        elif args.command == "backup":
            backup(state, args.type)
        elif args.command == "backups":
            print(pgbackrest(state, "info"), end="")
        elif args.command == "restore":
            restore(state, args.to, args.data_dir, args.port)
    except HAError as exc:
        say(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
