"""The HA deployment files, checked offline: the compose file's references resolve, every
QUEUE_SERVER_* variable is a real setting, and the settings that decide a failover are
there (in deploy/docker/ and in what deploy/local-ha/ha.py writes). `make ha-check`
adds docker-compose's own validation and `haproxy -c`."""

from __future__ import annotations

import configparser
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from queue_server.settings import Settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = DEPLOY / "docker-compose.ha.yml"


def _ha() -> ModuleType:
    spec = importlib.util.spec_from_file_location("local_ha", DEPLOY / "local-ha" / "ha.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["local_ha"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    text = re.sub(r"\$\{([A-Z_]+):\?[^}]*\}", r"secret-\1", COMPOSE.read_text())
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, Any]:
    ha = _ha()
    state = ha.State(tmp_path_factory.mktemp("ha"))
    state.data = {"passwords": dict.fromkeys(("postgres", "replicator", "app"), "pw")}
    ha.write_configs(state, 2)
    return ha, state


def _settings_from(env: dict[str, str]) -> Settings:
    fields = {name.removeprefix("QUEUE_SERVER_").lower(): value for name, value in env.items()}
    unknown = sorted(set(fields) - set(Settings.model_fields))
    assert not unknown, f"not settings: {unknown}"
    return Settings.model_validate(fields)


def test_compose_references_resolve(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        depends = service.get("depends_on", [])
        for other in depends if isinstance(depends, list) else depends.keys():
            assert other in services, f"{name} depends on unknown {other}"
        build = service.get("build")
        if build is not None:
            context = DEPLOY / build["context"]
            assert (context / build.get("dockerfile", "Dockerfile")).exists(), name
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in compose["volumes"], f"{name} uses undeclared volume {source}"


def test_compose_api_reaches_pgbouncer_and_listens_on_the_leader(
    compose: dict[str, Any],
) -> None:
    for name in ("api", "deliver"):
        settings = _settings_from(compose["services"][name]["environment"])
        assert settings.database_pooler == "transaction"
        assert "@pgbouncer:6432/" in settings.database_url
        assert "@pg-router:5000/" in settings.listen_database_url
        assert not settings.uses_prepared_statements
    migrate = compose["services"]["migrate"]["environment"]["QUEUE_SERVER_DATABASE_URL"]
    assert "@pg-router:5000/" in migrate


def test_local_api_processes_reach_pgbouncer_and_listen_through_haproxy(
    local: tuple[ModuleType, Any],
) -> None:
    ha, state = local
    for name, spec in state.services.items():
        if name.startswith("api") or name == "deliver":
            settings = _settings_from(spec["env"])
            assert f":{ha.PGBOUNCER}/" in settings.database_url
            assert f":{ha.HAPROXY_PRIMARY}/" in settings.listen_database_url
            assert settings.database_pooler == "transaction"


def _pgbouncer(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(inline_comment_prefixes=(";",))
    parser.read_string(text)
    return parser


@pytest.mark.parametrize("where", ["docker", "local"])
def test_pgbouncer_pools_transactions_and_retries_logins_fast(
    where: str, local: tuple[ModuleType, Any]
) -> None:
    path = (
        DEPLOY / "docker" / "pgbouncer.ini"
        if where == "docker"
        else local[1].root / "pgbouncer" / "pgbouncer.ini"
    )
    conf = _pgbouncer(path.read_text())["pgbouncer"]
    assert conf["pool_mode"] == "transaction"
    assert conf["server_login_retry"] == "1"
    assert conf["auth_type"] == "scram-sha-256"


@pytest.mark.parametrize("where", ["docker", "local"])
def test_patroni_runs_strict_synchronous_mode_and_fails_over_a_crash(
    where: str, local: tuple[ModuleType, Any]
) -> None:
    path = (
        DEPLOY / "docker" / "patroni.yml"
        if where == "docker"
        else local[1].root / "pg1" / "patroni.yml"
    )
    config = yaml.safe_load(path.read_text())
    dcs = config["bootstrap"]["dcs"]
    assert dcs["synchronous_mode"] is True
    assert dcs["synchronous_mode_strict"] is True
    assert dcs["primary_start_timeout"] == 0
    assert dcs["postgresql"]["parameters"]["wal_retrieve_retry_interval"] == "1s"
    assert dcs["postgresql"]["use_pg_rewind"] is True


def test_the_local_patroni_config_is_the_yaml_of_what_ha_py_meant(
    local: tuple[ModuleType, Any],
) -> None:
    ha, state = local
    written = yaml.safe_load((state.root / "pg2" / "patroni.yml").read_text())
    assert written == ha.patroni_config(state, "pg2")


@pytest.mark.parametrize(
    "path", [DEPLOY / "haproxy" / "postgres-router.cfg", Path("local-ha/haproxy.cfg")]
)
def test_haproxy_sends_writes_to_the_leader_and_cuts_a_demoted_ones_sessions(
    path: Path, local: tuple[ModuleType, Any]
) -> None:
    text = (
        (local[1].root / "haproxy.cfg").read_text() if not path.is_absolute() else path.read_text()
    )
    primary = text.split("listen postgres_primary", 1)[1].split("\nlisten ", 1)[0]
    assert "option httpchk GET /primary" in primary
    assert "http-check expect status 200" in primary
    assert "on-marked-down shutdown-sessions" in primary


def test_with_no_api_ready_the_load_balancer_answers_a_503_problem() -> None:
    for status in (502, 503, 504):
        head, _, body = (
            (DEPLOY / "haproxy" / f"api-{status}.http").read_bytes().decode().partition("\r\n\r\n")
        )
        assert head.startswith(f"HTTP/1.1 {status} ")
        assert "Content-Type: application/problem+json" in head
        problem = yaml.safe_load(body)
        assert problem["status"] == status
        assert problem["code"] == "service-unavailable"
    config = (DEPLOY / "haproxy" / "api-lb.cfg").read_text()
    assert "errorfile 503 /usr/local/etc/haproxy/api-503.http" in config
    assert "option httpchk GET /readyz" in config


def test_every_deployment_connects_as_a_role_that_is_not_the_superuser(
    compose: dict[str, Any], local: tuple[ModuleType, Any]
) -> None:
    single = yaml.safe_load((DEPLOY.parent / "docker-compose.yml").read_text())
    urls = [
        env[name]
        for topology in (single, compose)
        for service in topology["services"].values()
        if isinstance(env := service.get("environment"), dict)
        for name in ("QUEUE_SERVER_DATABASE_URL", "QUEUE_SERVER_LISTEN_DATABASE_URL")
        if name in env
    ]
    ha, _ = local
    assert ha.APP_USER == "queue_server"
    assert len(urls) >= 5
    assert all(url.startswith("postgresql://queue_server:") for url in urls), urls
    # The single-node compose makes that role on a new volume, without privileges.
    init = (DEPLOY / "docker" / "single-init.sh").read_text()
    assert "CREATE ROLE queue_server LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE" in init
    assert "CREATE DATABASE queue_server OWNER queue_server" in init
    volumes = single["services"]["db"]["volumes"]
    assert any(
        v.startswith("./deploy/docker/single-init.sh:/docker-entrypoint-initdb.d/") for v in volumes
    )


def test_the_local_cluster_archives_to_pgbackrest_and_backs_up_from_a_standby(
    local: tuple[ModuleType, Any],
) -> None:
    ha, state = local
    config = yaml.safe_load((state.root / "pg1" / "patroni.yml").read_text())
    parameters = config["bootstrap"]["dcs"]["postgresql"]["parameters"]
    assert parameters["archive_mode"] == "on"
    assert parameters["archive_command"] == (
        f"pgbackrest --config={state.root / 'pgbackrest.conf'} --stanza=queue-server-ha"
        " archive-push %p"
    )
    conf = configparser.ConfigParser()
    conf.read_string((state.root / "pgbackrest.conf").read_text())
    assert conf["global"]["backup-standby"] == "y"
    assert conf["global"]["repo1-path"] == str(state.root / "backup")
    stanza = conf["queue-server-ha"]
    assert [stanza[f"pg{i}-port"] for i in (1, 2, 3)] == [
        str(port) for port in ha.PG_PORTS.values()
    ]
    assert [stanza[f"pg{i}-path"] for i in (1, 2, 3)] == [
        str(state.root / node / "data") for node in ha.NODES
    ]
    assert "pgbackrest" in ha.PACKAGES
    makefile = (DEPLOY.parent / "Makefile").read_text()
    assert "ha-backup:" in makefile
    assert "ha.py backup" in makefile


def test_the_local_restore_gives_pgbackrest_a_utc_time_to_the_millisecond(
    local: tuple[ModuleType, Any],
) -> None:
    ha, _ = local
    assert ha._pgbackrest_time("2026-12-03T09:30:00.123456Z") == "2026-12-03 09:30:00.123+00"
    assert ha._pgbackrest_time("2026-12-03 10:30:00+01:00") == "2026-12-03 09:30:00.000+00"
    assert ha._pgbackrest_time("2026-12-03 09:30:00") == "2026-12-03 09:30:00.000+00"
    with pytest.raises(ha.HAError, match="neither `latest` nor a time"):
        ha._pgbackrest_time("yesterday")
