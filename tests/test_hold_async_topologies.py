"""A waiting ``hold_async`` blocks on a ``redis.asyncio`` client built like the sync one, on
every topology: a unix socket with a password, TLS with a client certificate, Sentinel reached
over TLS, and Redis Cluster; and the options redis.asyncio cannot take are named."""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio.cluster as async_cluster
from celery import Celery

from celery_lease import hold, hold_async
from celery_lease.store.async_wait import build_async_client
from celery_lease.store.url import StoreSpec
from harness.topologies import MASTER_NAME, cluster_setup
from tests.support.secure import (
    Certificates,
    SystemRedisServer,
    TlsRedisServer,
    TlsSentinelSetup,
    certificates,
)

certs = pytest.fixture(scope="module", name="certs")(certificates)


def _woken_by_release(
    conf: dict[str, Any], blocked: Callable[[], int], caplog: pytest.LogCaptureFixture
) -> float:
    """A thread holds ``"topo"`` (TTL 30 s); a ``hold_async`` waits for it in BLPOP on the
    server (``blocked()`` counts blocked clients); the holder releases. Returns the seconds
    from that release to the waiter's entry."""
    app = Celery("topo", set_as_current=False)
    app.conf.update(**conf)
    holding, release = threading.Event(), threading.Event()
    released_at = [0.0]

    def holder() -> None:
        with hold("topo", app=app, ttl=30.0):
            holding.set()
            release.wait(20)
            released_at[0] = time.perf_counter()

    async def waiter() -> float:
        async with hold_async("topo", app=app, timeout=20.0):
            return time.perf_counter() - released_at[0]

    async def main() -> float:
        task = asyncio.ensure_future(waiter())
        deadline = time.monotonic() + 10
        while blocked() < 1:
            assert time.monotonic() < deadline, "the waiter never blocked in BLPOP"
            await asyncio.sleep(0.02)
        release.set()
        return await task

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert holding.wait(10)
        with caplog.at_level(logging.WARNING, logger="celery_lease"):
            woken = asyncio.run(main())
    finally:
        release.set()
        t.join(10)
    assert "default executor" not in caplog.text  # redis.asyncio served it, no fallback
    return woken


def _blocked(*clients: redis.Redis) -> Callable[[], int]:
    return lambda: sum(int(c.info("clients")["blocked_clients"]) for c in clients)


@pytest.fixture(scope="module")
def unix_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    sock = str(tmp_path_factory.mktemp("sock") / "redis.sock")
    server = SystemRedisServer(
        config={"unixsocket": sock, "unixsocketperm": "700", "requirepass": "sockpw"}
    ).start()
    yield server, sock
    server.close()


def test_async_wait_over_a_unix_socket_with_a_password(
    unix_server: tuple[Any, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, sock = unix_server
    admin = redis.Redis(unix_socket_path=sock, password="sockpw")
    woken = _woken_by_release(
        {"lease_backend": f"unix://:sockpw@{sock}?db=0"}, _blocked(admin), caplog
    )
    assert woken < 1.0  # by the release, not at the holder's expiry 30 s away


def test_async_wait_over_mutual_tls(certs: Certificates, caplog: pytest.LogCaptureFixture) -> None:
    with TlsRedisServer(certs, mutual=True) as server:
        tls = {
            "ssl_ca_certs": certs.ca_file,
            "ssl_certfile": certs.client_cert,
            "ssl_keyfile": certs.client_key,
        }
        woken = _woken_by_release(
            {"lease_backend": server.url(0), "lease_backend_options": tls},
            _blocked(server.client()),
            caplog,
        )
    assert woken < 1.0


def test_async_wait_through_a_sentinel_reached_over_tls(
    certs: Certificates, caplog: pytest.LogCaptureFixture
) -> None:
    with TlsSentinelSetup(certs) as setup:
        setup.start()
        tls = {"ssl_ca_certs": certs.ca_file}
        with setup.admin() as admin:
            woken = _woken_by_release(
                {
                    "lease_backend": setup.sentinel_url,
                    "lease_backend_options": {
                        "master_name": MASTER_NAME,
                        **tls,
                        "sentinel_kwargs": tls,
                    },
                },
                _blocked(admin),
                caplog,
            )
    assert woken < 1.0


def test_async_wait_on_a_redis_cluster(caplog: pytest.LogCaptureFixture) -> None:
    with cluster_setup() as setup:
        nodes = setup.live()
        woken = _woken_by_release(
            {
                "lease_backend": f"redis://127.0.0.1:{nodes[0].port}/0",
                "lease_backend_options": {"cluster": True},
            },
            _blocked(*(n.client() for n in setup.primaries())),
            caplog,
        )
    assert woken < 1.0


def test_an_option_redis_asyncio_cannot_take_is_named_instead_of_a_client() -> None:
    spec = StoreSpec(
        "cluster",
        True,
        {
            "host": "127.0.0.1",
            "port": 7000,
            "ssl": True,
            "ssl_cert_reqs": ssl.CERT_REQUIRED,
            "ssl_ca_path": "/etc/ssl/certs",
            "ssl_password": "pw",
        },
    )
    params = inspect.signature(async_cluster.RedisCluster.__init__).parameters
    missing = [k for k in ("ssl_ca_path", "ssl_password") if k not in params]
    if not missing:
        pytest.skip("this redis-py's async RedisCluster takes every TLS option")
    why = build_async_client(spec, 1.0)
    assert why == (
        f"redis.asyncio's RedisCluster (redis-py {redis.__version__}) takes no {', '.join(missing)}"
    )
    assert "pw" not in why
