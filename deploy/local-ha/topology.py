"""The local HA topology's configuration: its loopback ports and packages, the state
directory, and the configuration each daemon reads (Patroni, pgBackRest, HAProxy,
PgBouncer, etcd) and the API processes' environment, rendered from the state. Nothing
here starts, stops or waits for anything: that is `ha.py`, which writes these files.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ENSURE = REPO / "deploy" / "ensure-debian-packages.sh"
HAPROXY_ERRORS = REPO / "deploy" / "haproxy"
PACKAGES = (
    "patroni",
    "etcd-server",
    "etcd-client",
    "haproxy",
    "pgbouncer",
    "postgresql-15",
    "pgbackrest",
)
PG_BIN = Path("/usr/lib/postgresql/15/bin")
HOST = "127.0.0.1"
DATABASE = "queue_server"
APP_USER = "queue_server"
SCOPE = "queue-server-ha"
# pgBackRest's stanza: WAL archived from the leader, backups taken from a standby.
STANZA = "queue-server-ha"
NODES = ("pg1", "pg2", "pg3")

# Loopback ports (fixed, so the printed URLs stay true between runs).
ETCD_CLIENT, ETCD_PEER = 25379, 25380
HAPROXY_PRIMARY, HAPROXY_REPLICAS, HAPROXY_STATS, HAPROXY_API = 25000, 25001, 25002, 25080
PGBOUNCER = 25400
PG_PORTS = {"pg1": 25431, "pg2": 25432, "pg3": 25433}
REST_PORTS = {"pg1": 25008, "pg2": 25009, "pg3": 25010}
API_BASE_PORT = 25081

#: Minimum versions this topology was built and measured with.
MIN_VERSIONS = {
    "patroni": (3, 0),
    "etcd": (3, 4),
    "haproxy": (2, 6),
    "pgbouncer": (1, 18),
    "postgres": (15, 0),
}


class HAError(RuntimeError):
    """The topology could not be brought to the state asked for."""


# --------------------------------------------------------------------------- state


@dataclass
class Service:
    name: str
    argv: list[str]
    env: dict[str, str]
    as_postgres: bool

    def to_json(self) -> dict[str, Any]:
        return {"argv": self.argv, "env": self.env, "as_postgres": self.as_postgres}


class State:
    """The state directory: configs, data, logs, pid files and state.json."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.file = root / "state.json"
        self.data: dict[str, Any] = {}
        if self.file.exists():
            self.data = json.loads(self.file.read_text(encoding="utf-8"))

    def save(self) -> None:
        self.file.write_text(json.dumps(self.data, indent=2, sort_keys=True), encoding="utf-8")
        self.file.chmod(0o600)

    @property
    def services(self) -> dict[str, dict[str, Any]]:
        services: dict[str, dict[str, Any]] = self.data.setdefault("services", {})
        return services

    def pidfile(self, name: str) -> Path:
        return self.root / "run" / f"{name}.pid"

    def log(self, name: str) -> Path:
        return self.root / "log" / f"{name}.log"

    def pid(self, name: str) -> int | None:
        """The service's pid if it is alive."""
        try:
            pid = int(self.pidfile(name).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


# ---------------------------------------------------------------------- configs


def _yaml(value: Any, indent: int = 0) -> str:
    """A small YAML writer (JSON scalars are valid YAML): enough for Patroni's config."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{key}:")
                lines.append(_yaml(item, indent + 1))
            else:
                lines.append(f"{pad}{key}: {json.dumps(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict | list) and item:
                nested = _yaml(item, indent + 1).lstrip()
                lines.append(f"{pad}- {nested}")
            else:
                lines.append(f"{pad}- {json.dumps(item)}")
    return "\n".join(lines)


def patroni_config(state: State, node: str) -> dict[str, Any]:
    pw = state.data["passwords"]
    base = state.root / node
    return {
        "scope": SCOPE,
        "namespace": "/service/",
        "name": node,
        "log": {"level": "INFO"},
        "restapi": {
            "listen": f"{HOST}:{REST_PORTS[node]}",
            "connect_address": f"{HOST}:{REST_PORTS[node]}",
        },
        # etcd's v3 API (etcd 3.4 serves no v2 unless asked to).
        "etcd3": {"hosts": [f"{HOST}:{ETCD_CLIENT}"]},
        "bootstrap": {
            "dcs": {
                "ttl": 20,
                "loop_wait": 5,
                "retry_timeout": 5,
                "maximum_lag_on_failover": 1048576,
                # A commit returns only once a standby has it; with `strict`, writes
                # stop rather than go on unreplicated when no standby is left.
                "synchronous_mode": True,
                "synchronous_mode_strict": True,
                # 0: a crashed leader is failed over at once instead of being restarted
                # in place for up to 300 s while /primary keeps answering 200.
                "primary_start_timeout": 0,
                "postgresql": {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    "parameters": {
                        "max_connections": 100,
                        "shared_buffers": "32MB",
                        "work_mem": "4MB",
                        "maintenance_work_mem": "32MB",
                        "effective_cache_size": "256MB",
                        "wal_level": "replica",
                        "hot_standby": "on",
                        "wal_log_hints": "on",
                        "max_wal_senders": 10,
                        "max_replication_slots": 10,
                        "wal_keep_size": "128MB",
                        "max_wal_size": "256MB",
                        # The default 5 s adds 4-5 s to each failover in strict mode.
                        "wal_retrieve_retry_interval": "1s",
                        "password_encryption": "scram-sha-256",
                        # Every segment to pgBackRest's repository, by whichever node leads.
                        "archive_mode": "on",
                        "archive_command": f"{pgbackrest_command(state)} archive-push %p",
                        "archive_timeout": "60s",
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}, "data-checksums"],
        },
        "postgresql": {
            "listen": f"{HOST}:{PG_PORTS[node]}",
            "connect_address": f"{HOST}:{PG_PORTS[node]}",
            "data_dir": str(base / "data"),
            "bin_dir": str(PG_BIN),
            "pgpass": str(base / "pgpass"),
            "authentication": {
                "superuser": {"username": "postgres", "password": pw["postgres"]},
                "replication": {"username": "replicator", "password": pw["replicator"]},
                "rewind": {"username": "postgres", "password": pw["postgres"]},
            },
            "parameters": {"unix_socket_directories": str(base)},
            "pg_hba": [
                "local all all peer",
                "host replication replicator 127.0.0.1/32 scram-sha-256",
                "host all all 127.0.0.1/32 scram-sha-256",
            ],
        },
        "tags": {
            "nofailover": False,
            "noloadbalance": False,
            "clonefrom": False,
            "nosync": False,
        },
    }


def pgbackrest_config(state: State) -> str:
    """pgBackRest for the three nodes on this host: the repository under the state
    directory, backups from a standby (the leader only gives the start and stop)."""
    root = state.root
    lines = [
        "[global]",
        f"repo1-path={root / 'backup'}",
        "repo1-retention-full=2",
        "start-fast=y",
        "backup-standby=y",
        f"log-path={root / 'log'}",
        f"lock-path={root / 'run'}",
        f"spool-path={root / 'run'}",
        "log-level-console=warn",
        "log-level-file=info",
        "",
        f"[{STANZA}]",
    ]
    for i, node in enumerate(NODES, start=1):
        lines += [
            f"pg{i}-path={root / node / 'data'}",
            f"pg{i}-port={PG_PORTS[node]}",
            f"pg{i}-socket-path={root / node}",
        ]
    return "\n".join(lines) + "\n"


def pgbackrest_command(state: State) -> str:
    return f"pgbackrest --config={state.root / 'pgbackrest.conf'} --stanza={STANZA}"


def haproxy_config(state: State, api_ports: list[int]) -> str:
    def pg_servers() -> str:
        return "\n".join(
            f"    server {n} {HOST}:{PG_PORTS[n]} check port {REST_PORTS[n]}" for n in NODES
        )

    api = "\n".join(
        f"    server api{i + 1} {HOST}:{port} check" for i, port in enumerate(api_ports)
    )
    return f"""# Written by deploy/local-ha/ha.py.
global
    maxconn 2000
    stats socket {state.root}/run/haproxy.sock mode 600 level admin

defaults
    mode tcp
    log global
    retries 2
    timeout connect 3s
    timeout check 2s
    # Long: a LISTEN session may stay idle for a long time.
    timeout client 1h
    timeout server 1h

# Writes: the node whose Patroni answers 200 on /primary. A node marked down has its
# sessions cut at once, so no client keeps talking to a demoted leader.
listen postgres_primary
    bind {HOST}:{HAPROXY_PRIMARY}
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 1s fastinter 500ms downinter 1s fall 2 rise 1 on-marked-down shutdown-sessions
{pg_servers()}

# Reads that tolerate lag: any streaming replica.
listen postgres_replicas
    bind {HOST}:{HAPROXY_REPLICAS}
    balance roundrobin
    option httpchk GET /replica
    http-check expect status 200
    default-server inter 1s fastinter 500ms downinter 1s fall 2 rise 1 on-marked-down shutdown-sessions
{pg_servers()}

# The API processes: ready ones only; a refused connection is retried on another.
listen queue_server_api
    bind {HOST}:{HAPROXY_API}
    mode http
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    option redispatch
    retry-on conn-failure
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 10s
    # With no API process ready, clients get a problem document they know to retry.
    errorfile 502 {state.root}/haproxy/api-502.http
    errorfile 503 {state.root}/haproxy/api-503.http
    errorfile 504 {state.root}/haproxy/api-504.http
    default-server inter 1s fastinter 500ms downinter 1s fall 2 rise 1
{api}

listen stats
    bind {HOST}:{HAPROXY_STATS}
    mode http
    timeout client 30s
    timeout server 30s
    stats enable
    stats uri /
    stats refresh 2s
"""


def pgbouncer_config(state: State) -> str:
    root = state.root / "pgbouncer"
    return f"""; Written by deploy/local-ha/ha.py.
[databases]
{DATABASE} = host={HOST} port={HAPROXY_PRIMARY} dbname={DATABASE}
; For `make bench-sync` (pgbench through the pooler).
pgbench = host={HOST} port={HAPROXY_PRIMARY} dbname=pgbench

[pgbouncer]
listen_addr = {HOST}
listen_port = {PGBOUNCER}
unix_socket_dir = {root}
auth_type = scram-sha-256
auth_file = {root}/userlist.txt
admin_users = postgres
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 40
reserve_pool_size = 5
; The default 15 s turned a 3 s switchover into a 15 s outage.
server_login_retry = 1
server_connect_timeout = 3
query_wait_timeout = 30
server_lifetime = 600
server_idle_timeout = 60
logfile = {state.log("pgbouncer-own")}
"""


def etcd_argv(state: State) -> list[str]:
    client = f"http://{HOST}:{ETCD_CLIENT}"
    peer = f"http://{HOST}:{ETCD_PEER}"
    return [
        "etcd",
        "--name",
        "etcd1",
        "--data-dir",
        str(state.root / "etcd"),
        "--listen-client-urls",
        client,
        "--advertise-client-urls",
        client,
        "--listen-peer-urls",
        peer,
        "--initial-advertise-peer-urls",
        peer,
        "--initial-cluster",
        f"etcd1={peer}",
        "--initial-cluster-state",
        "new",
        "--quota-backend-bytes",
        str(256 * 1024 * 1024),
    ]


def api_env(state: State) -> dict[str, str]:
    pw = state.data["passwords"]["app"]
    leader = f"postgresql://{APP_USER}:{pw}@{HOST}:{HAPROXY_PRIMARY}/{DATABASE}?connect_timeout=5"
    if state.data.get("via") == "haproxy":
        # Without the pooler: every API connection is a session on the leader.
        return {
            "QUEUE_SERVER_DATABASE_URL": leader,
            "QUEUE_SERVER_DATA_DIR": str(state.root / "api"),
            "QUEUE_SERVER_POOL_MAX_SIZE": "10",
        }
    return {
        # Every statement through PgBouncer (transaction mode)...
        "QUEUE_SERVER_DATABASE_URL": (
            f"postgresql://{APP_USER}:{pw}@{HOST}:{PGBOUNCER}/{DATABASE}?connect_timeout=5"
        ),
        "QUEUE_SERVER_DATABASE_POOLER": "transaction",
        # ... except LISTEN, which needs a session: straight to the leader through HAProxy.
        "QUEUE_SERVER_LISTEN_DATABASE_URL": leader,
        "QUEUE_SERVER_DATA_DIR": str(state.root / "api"),
        "QUEUE_SERVER_POOL_MAX_SIZE": "10",
    }
