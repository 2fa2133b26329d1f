"""Processes and numbers the benchmarks share: a private redis-server, celery workers, stats.

A ``redis-server`` on a free loopback port with no persistence, ``celery worker`` subprocesses
in their own process groups, and order statistics. Polling, free ports and finding the
``redis-server`` binary come from the test suite's helpers (``tests/support``), which the
benchmarks share since both run from the repository checkout.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.redis_server import free_port, redis_server_binary
from tests.support.waiting import wait_for

HOST = "127.0.0.1"
#: The repository checkout the benchmarks run from (put on the workers' PYTHONPATH).
REPO_ROOT = Path(__file__).resolve().parents[1]

# --- statistics ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linearly interpolated."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Iterable[float]) -> dict[str, float]:
    """``n``, ``median``, ``p99``, ``min`` and ``max`` of ``values`` (all floats)."""
    data = [float(v) for v in values]
    return {
        "n": float(len(data)),
        "median": percentile(data, 50),
        "p99": percentile(data, 99),
        "min": min(data),
        "max": max(data),
    }


def spread(values: Iterable[float]) -> dict[str, float]:
    """``median``, ``min`` and ``max`` of a handful of per-round figures (e.g. ratios)."""
    data = [float(v) for v in values]
    return {"median": percentile(data, 50), "min": min(data), "max": max(data), "n": len(data)}


# --- redis-server -------------------------------------------------------------------------------


def client_kwargs() -> dict[str, Any]:
    """redis-py options for the benchmark's own clients: no retries, a 5 s timeout."""
    return {"socket_timeout": 5.0, "socket_connect_timeout": 5.0, "retry": Retry(NoBackoff(), 0)}


class RedisProcess:
    """A private ``redis-server`` on a free loopback port: no persistence, ``noeviction``.

    Never the shared server on 6379: the port is always picked free. :meth:`pause` freezes it
    (SIGSTOP) so that connections stay open and nothing answers, as a hung store does.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="bench-redis-")
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://{HOST}:{self.port}/0"

    def version(self) -> str:
        """The server's version string."""
        return str(self.client().info("server").get("redis_version", "?"))

    def client(self) -> redis.Redis:
        """A new client of this server (no retries, 5 s timeouts)."""
        return redis.Redis(host=HOST, port=self.port, **client_kwargs())

    def start(self) -> RedisProcess:
        """Start the server and wait until it answers ``PING``."""
        for _attempt in range(3):
            args = [
                redis_server_binary(), "--bind", HOST, "--port", str(self.port), "--save", "",
                "--appendonly", "no", "--dir", self._dir.name, "--maxmemory-policy", "noeviction",
                "--logfile", str(Path(self._dir.name) / "redis.log"),
            ]
            self.process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                wait_for(self._answers, 10.0, 0.02, f"redis-server on port {self.port}")
                return self
            except AssertionError:  # wait_for's timeout
                self.stop()
                self.port = free_port()  # the port was taken meanwhile: try another
        raise RuntimeError("could not start a private redis-server")

    def _answers(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"redis-server exited early on port {self.port}")
        try:
            client = redis.Redis(host=HOST, port=self.port, socket_timeout=0.5,
                                 socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
            try:
                return bool(client.ping())
            finally:
                client.close()
        except redis.RedisError:
            return False

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open and nothing answers."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """Unfreeze a paused server (SIGCONT)."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        """Stop the server (it is ours: SIGCONT, SIGTERM, then SIGKILL if it lingers)."""
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
            process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> RedisProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- celery workers -----------------------------------------------------------------------------

#: The Celery app module the workers run.
APP_MODULE = "benchmarks.app"


class Worker:
    """One ``celery -A benchmarks.app worker`` subprocess in its own process group.

    The app reads its configuration from the ``BENCH_*`` variables in ``env`` (see
    :mod:`benchmarks.app`) and marks itself ready in the record store when the worker is ready.
    """

    def __init__(
        self,
        pool: str,
        concurrency: int,
        queues: Sequence[str],
        env: Mapping[str, str],
        log_dir: Path,
        loglevel: str = "warning",
    ) -> None:
        self.pool = pool
        self.concurrency = concurrency
        self.queues = list(queues)
        self.env = dict(env)
        self.name = f"bench-{pool}-{uuid.uuid4().hex[:8]}"
        self.log_path = log_dir / f"{self.name}.log"
        self.loglevel = loglevel
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def hostname(self) -> str:
        """The node name, ``<name>@<host>``."""
        return f"{self.name}@{socket.gethostname()}"

    def start(self) -> Worker:
        """Spawn the worker (see :meth:`wait_ready`)."""
        command = [
            sys.executable, "-m", "celery", "-A", APP_MODULE, "worker", "-P", self.pool,
            "-c", str(self.concurrency), "-Q", ",".join(self.queues), "-n", f"{self.name}@%h",
            "-l", self.loglevel, "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]
        environ = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        paths = [str(REPO_ROOT), *environ.get("PYTHONPATH", "").split(os.pathsep)]
        environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=environ, cwd=str(REPO_ROOT), start_new_session=True)
        return self

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the worker's output."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, records: redis.Redis, timeout: float = 60.0) -> Worker:
        """Wait until the worker marked itself ready in ``records``."""

        def ready() -> bool:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.log_tail()}")
            return bool(records.exists(f"bench:ready:{self.hostname}"))

        wait_for(ready, timeout, 0.05, lambda: f"worker {self.name} ready:\n{self.log_tail()}")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Warm shutdown (SIGTERM to the group), then SIGKILL to the group if it lingers."""
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # leftover pool children of this group
        process.wait()


def section_timer() -> Callable[[], float]:
    """A stopwatch: returns a function giving float seconds since it was made."""
    started = time.perf_counter()
    return lambda: time.perf_counter() - started
