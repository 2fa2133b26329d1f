"""Pytest fixtures for private Redis servers, TCP proxies, Celery workers and PostgreSQL
databases.

Load with ``pytest_plugins = ["tests.support.fixtures"]`` in ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_lease import store
from harness.proxy import TcpProxy
from harness.redis_server import RedisServer
from harness.workers import CeleryWorker
from tests.support import rabbitmq
from tests.support.postgres import PrivateDatabase, private_database
from tests.support.workers import BROKER_URL_ENV, QUEUE_ENV, RESULT_BACKEND_ENV

DEFAULT_APP = "tests.apps.smoke_app"
#: The brokers a test may run its workers on: ``@pytest.mark.parametrize("broker_url",
#: BROKERS, indirect=True)`` (the ``broker_url`` fixture; results and leases stay in Redis).
BROKERS = ["redis", "rabbitmq"]


@pytest.fixture(autouse=True)
def _no_client_from_an_earlier_test() -> None:
    """Forget the store clients this process cached in earlier tests.

    A test's private server may listen on a port that a server stopped by an earlier test
    used; a client cached for that URL would keep connections to the dead server, and the
    first command on one fails (the library's own recovery from a restart, which some tests
    check on purpose, is one failed command per client).
    """
    store.reset_clients()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One private redis-server for the whole session (never the shared one)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def postgres_db() -> Iterator[PrivateDatabase]:
    """A private database on the machine's PostgreSQL (localhost:5432), dropped afterwards."""
    with private_database("celery_lease_test") as db:
        yield db


@pytest.fixture(scope="module")
def broker() -> Iterator[RedisServer]:
    """A private server per test module for broker, results and journal of the fault rigs."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of db 0 on the session server, flushed (and unpaused) before the test."""
    if not redis_server.running:
        redis_server.start()
    redis_server.resume()
    client = redis_server.client(socket_timeout=5)
    try:
        client.flushall()
    finally:
        client.close()
    return redis_server.url(0)


@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    """A private vhost on the shared RabbitMQ (:mod:`tests.support.rabbitmq`) for the session:
    one per xdist worker (each ``rabbitmqctl`` call takes seconds); the tests' queue names are
    their own (the ``worker_factory``'s and each rig's)."""
    with rabbitmq.private_vhost() as url:
        yield url


@pytest.fixture
def broker_url(request: pytest.FixtureRequest, redis_url: str) -> str:
    """The Celery broker of the test's workers: ``redis_url`` unless parametrized
    (``indirect``) with ``"rabbitmq"``, a private vhost (see :data:`BROKERS`)."""
    kind = getattr(request, "param", "redis")
    if kind == "rabbitmq":
        return str(request.getfixturevalue("rabbitmq_url"))
    assert kind == "redis", f"broker_url: unknown broker {kind!r}, one of {BROKERS}"
    return redis_url


class _Factory:
    """Base for factories whose products are all cleaned up by :meth:`close`."""

    def __init__(self) -> None:
        """Start with nothing to clean up."""
        self._cleanup = contextlib.ExitStack()

    def close(self) -> None:
        """Clean up everything made, newest first, even if one step fails."""
        self._cleanup.close()


class RedisFactory(_Factory):
    """Callable that starts throwaway servers; all are closed at teardown."""

    def __call__(
        self,
        config: Mapping[str, str | Sequence[str]] | None = None,
        port: int | None = None,
        **options: Any,
    ) -> RedisServer:
        """Start and return a new server with extra ``config``.

        ``options`` go to :class:`~harness.redis_server.RedisServer` (``binary``,
        ``config_file``, ``args``).
        """
        server = RedisServer(port=port, config=config, **options)
        self._cleanup.callback(server.close)
        return server.start()


@pytest.fixture
def throwaway_redis() -> Iterator[RedisFactory]:
    """Factory for private servers a test may kill, pause or restart freely."""
    factory = RedisFactory()
    yield factory
    factory.close()


class ProxyFactory(_Factory):
    """Callable that opens TCP proxies; all are closed at teardown."""

    def __call__(self, target_port: int, target_host: str = "127.0.0.1") -> TcpProxy:
        """Open a proxy in front of ``target_host:target_port``."""
        proxy = TcpProxy(target_port, target_host)
        self._cleanup.callback(proxy.close)
        return proxy


@pytest.fixture
def tcp_proxy() -> Iterator[ProxyFactory]:
    """Factory for :class:`TcpProxy` instances, closed at teardown."""
    factory = ProxyFactory()
    yield factory
    factory.close()


class WorkerFactory(_Factory):
    """Callable that starts Celery workers on this test's own queue.

    The worker's environment gets ``TEST_BROKER_URL`` (the ``broker_url`` fixture),
    ``TEST_RESULT_BACKEND`` (the test's ``redis_url``, which holds the leases too) and
    ``TEST_QUEUE`` (``self.queue``); ``env`` overrides them.
    """

    def __init__(self, broker_url: str, log_dir: Path, result_backend: str | None = None) -> None:
        """Remember the defaults; ``queue`` is unique to this factory."""
        super().__init__()
        self.broker_url = broker_url
        self.result_backend = result_backend or broker_url
        self.queue = f"test-{uuid.uuid4().hex[:10]}"
        self.log_dir = log_dir
        self.workers: list[CeleryWorker] = []

    def __call__(
        self,
        app_module: str = DEFAULT_APP,
        pool: str = "solo",
        concurrency: int = 1,
        queue: str | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        ready_timeout: float | None = 30.0,
    ) -> CeleryWorker:
        """Start a worker and (unless ``ready_timeout`` is None) wait until ready."""
        queue = queue or self.queue
        full_env = {
            BROKER_URL_ENV: self.broker_url,
            RESULT_BACKEND_ENV: self.result_backend,
            QUEUE_ENV: queue,
            **(env or {}),
        }
        worker = CeleryWorker(
            app_module,
            pool=pool,
            concurrency=concurrency,
            queue=queue,
            env=full_env,
            extra_args=extra_args,
            log_dir=self.log_dir,
        )
        self.workers.append(worker)
        self._cleanup.callback(worker.stop)
        worker.start()
        if ready_timeout is not None:
            worker.wait_ready(ready_timeout)
        return worker


@pytest.fixture
def worker_factory(redis_url: str, broker_url: str, tmp_path: Path) -> Iterator[WorkerFactory]:
    """Factory for real ``celery worker`` subprocesses, stopped at teardown."""
    factory = WorkerFactory(broker_url, tmp_path, result_backend=redis_url)
    yield factory
    factory.close()


@pytest.fixture
def lifecycle_app(redis_url: str) -> Iterator[Celery]:
    """An app whose leases live on the session server (TTL 6 s) for tests of
    :mod:`celery_lease.core.lifecycle`; no lease a test took outlives it in the heartbeat."""
    from celery_lease.core.heartbeat import heartbeat

    app = Celery("lifecycle", broker="memory://", set_as_current=False)
    app.conf.update(lease_backend=redis_url, lease_ttl=6.0)
    yield app
    for lease in heartbeat().held():
        heartbeat().remove(lease)
