"""The key cache trusts the notification listener only while it shows signs of life: with the
listener's session gone half-open (the reliability suite's proxy swallows every byte, as a
network that lost the peer without a FIN), a key revoked in another API process is refused
here within the trust window, not after the 30 s the cache would otherwise keep it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg.conninfo
import pytest
from pydantic import ValidationError

from queue_server.infra import keycache
from queue_server.infra.embedded import EmbeddedPostgres
from queue_server.infra.keycache import KeyCache
from queue_server.settings import Settings
from reliability.proxy import ProxyMode, TcpProxy
from tests.helpers.api import client_for, setup_tenant
from tests.helpers.server import LiveServer, make_admin_key

TRUST = 1.0


@pytest.fixture
def proxy(pg: EmbeddedPostgres) -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", pg.port, lifetime=120) as running:
        yield running


def _until(check: object, seconds: float) -> float | None:
    """Seconds until `check()` holds, or None if it did not within `seconds`."""
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        if check():  # type: ignore[operator]
            return time.monotonic() - began
        time.sleep(0.02)
    return None


def test_a_half_open_listener_stops_vouching_for_cached_keys_within_the_trust_window(
    pg: EmbeddedPostgres, database_url: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
    through_proxy = pg.tcp_url(str(dbname)).replace(f":{pg.port}/", f":{proxy.port}/")
    watched = LiveServer(
        Settings(data_dir=tmp_path, listen_database_url=through_proxy, key_cache_trust=TRUST),
        database_url,
    )
    other = LiveServer(Settings(data_dir=tmp_path), database_url)
    watched.start()
    other.start()
    try:
        admin_key = make_admin_key(watched.settings, database_url)
        with client_for(other.url, admin_key) as admin:
            api = setup_tenant(other.url, admin, "acme")
            worker = client_for(watched.url, api.keys["worker"])
            operator = client_for(watched.url, api.keys["operator"])
            cache = watched.app.state.services.keys.cache
            assert _until(lambda: cache.trusted, 5) is not None, "the listener never connected"
            assert worker.get("/v1/tenants/acme/queues/q/concurrency").status_code == 200
            # Healthy, the listener keeps vouching (probes), and the key is served cached.
            time.sleep(3 * TRUST)
            assert cache.trusted
            assert cache.get(api.keys["worker"].split("_")[1]) is not None

            proxy.set_mode(ProxyMode.BLACKHOLE)  # the session stays open; nothing gets through
            key_id = api.keys["worker"].split("_")[1]
            assert admin.delete(f"/v1/tenants/acme/keys/{key_id}").status_code == 204

            def refused() -> bool:
                answer = worker.get("/v1/tenants/acme/queues/q/concurrency")
                return answer.status_code == 401

            took = _until(refused, 10)
            assert took is not None, "the revoked key was still accepted after 10 s"
            # The window plus slack for a loaded machine; without it, about 25 s.
            assert took <= TRUST + 3.0, took
            # Other keys still work meanwhile: read from the database, not the cache.
            assert operator.get("/v1/tenants/acme").status_code == 200
            assert not cache.trusted
            # The unanswered probe closed the session; once the network is back, it
            # reconnects and vouches for the cache again.
            notifier = watched.app.state.notifier
            assert _until(lambda: not notifier.listening, 5 * TRUST) is not None
            proxy.set_mode(ProxyMode.PASS)
            assert _until(lambda: cache.trusted, 20) is not None
            assert operator.get("/v1/tenants/acme").status_code == 200
            worker.close()
            operator.close()
    finally:
        proxy.set_mode(ProxyMode.PASS)
        watched.stop()
        other.stop()


def test_the_cache_serves_nothing_once_the_listener_is_silent_past_the_trust_window() -> None:
    cache = KeyCache(trust_window=0.2)
    cache.enabled = True
    cache.alive()
    cache.put("k1", {"key_id": "k1"}, cache.generation)
    assert cache.get("k1") == {"key_id": "k1"}
    time.sleep(0.3)  # no notification, no answered probe: the listener vouches no more
    assert cache.get("k1") is None
    cache.alive()
    assert cache.get("k1") == {"key_id": "k1"}


def test_the_trust_window_is_at_most_the_30_seconds_the_cache_keeps_a_key() -> None:
    assert Settings(key_cache_trust=30).key_cache_trust == 30
    with pytest.raises(ValidationError, match="key_cache_trust"):
        Settings(key_cache_trust=31)


def test_a_key_read_before_a_revocation_cleared_the_cache_is_not_kept_after_it() -> None:
    cache = KeyCache()
    cache.enabled = True
    cache.alive()
    # A request reads the key (still live) from the database...
    generation = cache.generation
    # ...a revocation commits and clears the cache before that request stores what it read.
    cache.clear()
    cache.put("k1", {"key_id": "k1", "revoked_at": None}, generation)
    assert cache.get("k1") is None  # the next request reads the key, revoked, again
    cache.put("k1", {"key_id": "k1", "revoked_at": None}, cache.generation)
    assert cache.get("k1") == {"key_id": "k1", "revoked_at": None}


def test_a_cached_key_is_read_again_after_its_age_even_with_the_listener_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The bound on staleness should a notification ever be missed: a key kept longer than
    # MAX_AGE is not served, however healthy the listener looks.
    monkeypatch.setattr(keycache, "MAX_AGE", 0.2)
    cache = KeyCache()
    cache.enabled = True
    cache.alive()
    cache.put("k1", {"key_id": "k1", "revoked_at": None}, cache.generation)
    assert cache.get("k1") == {"key_id": "k1", "revoked_at": None}
    time.sleep(0.3)
    cache.alive()
    assert cache.trusted
    assert cache.get("k1") is None
