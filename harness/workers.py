"""``celery`` subprocesses (workers, and any other command) in their own process groups.

Each process is started in its own session (``start_new_session=True``), so its whole process
group (a prefork worker and its pool children) can be paused, resumed or killed with one
``killpg``, and a Ctrl-C in a terminal reaches only the caller. Output goes to a log file.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from harness import REPO_ROOT
from harness.waiting import wait_for

_live: set[CeleryProcess] = set()
_serial = itertools.count(1)  # keeps log files apart when a name is reused (restarts)


class CeleryProcess:
    """One ``python -m celery -A <app_module> <command...>`` process in its own session.

    Args:
        app_module: the ``-A`` argument.
        command: the sub-command and its options, e.g. ``["beat", "-l", "info"]``.
        env: variables merged over ``os.environ``; the repository root is prepended to
            ``PYTHONPATH`` so that the library and the apps import.
        log_dir: where the log file goes (default: a temporary directory).
        name: a short name for the log file and messages (default: random).
        cwd: the working directory (default: ``log_dir``).

    Call :meth:`start`; :meth:`stop` or :meth:`kill` end the whole process group. Subclasses
    define :meth:`is_ready` for :meth:`wait_ready`.
    """

    kind = "celery"

    def __init__(
        self,
        app_module: str,
        command: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        name: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        """Describe the process (nothing starts yet)."""
        self.app_module = app_module
        self.extra_command = list(command)
        self.env = dict(env or {})
        self.name = name or uuid.uuid4().hex[:12]
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"celery-{self.kind}-")
            log_dir = self._tmp.name
        self.log_path = Path(log_dir) / f"{self.kind}-{self.name}-{next(_serial)}.log"
        self.cwd = Path(cwd) if cwd is not None else self.log_path.parent
        self.process: subprocess.Popen[bytes] | None = None
        self._paused = False

    def command(self) -> list[str]:
        """Return the command line that :meth:`start` runs."""
        return [sys.executable, "-m", "celery", "-A", self.app_module, *self.extra_command]

    def environ(self) -> dict[str, str]:
        """The full environment of the process."""
        environ = {**os.environ, **self.env}
        paths = [str(REPO_ROOT), *environ.get("PYTHONPATH", "").split(os.pathsep)]
        environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        environ["PYTHONUNBUFFERED"] = "1"
        return environ

    def start(self) -> CeleryProcess:
        """Spawn the process (does not wait; see :meth:`wait_ready`).

        Raises:
            RuntimeError: it was started already (make a new object to start again).
        """
        if self.process is not None:
            raise RuntimeError(f"{self!r} already started")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environ(),
                cwd=self.cwd,
                start_new_session=True,
            )
        _live.add(self)
        return self

    @property
    def pid(self) -> int:
        """Pid of the main process (also its process group id)."""
        if self.process is None:
            raise RuntimeError(f"{self!r} not started")
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """Exit code once the main process ended, else ``None``."""
        return None if self.process is None else self.process.poll()

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` was called without a later :meth:`resume`."""
        return self._paused

    def is_running(self) -> bool:
        """Whether the main process is still alive (it may be paused)."""
        return self.process is not None and self.process.poll() is None

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` is the main process or one of its group (e.g. a prefork child)."""
        if self.process is None:
            return False
        if pid == self.pid:
            return True
        try:
            return os.getpgid(pid) == self.pid
        except (ProcessLookupError, PermissionError):
            return False

    def log_text(self) -> str:
        """Everything the process wrote so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def is_ready(self) -> bool:
        """Whether the process is ready for work (subclasses say how; here: it runs)."""
        return self.is_running()

    def wait_ready(self, timeout: float = 30.0) -> CeleryProcess:
        """Wait up to ``timeout`` float seconds for :meth:`is_ready`.

        Raises:
            RuntimeError: the process exited first (with the log tail).
            AssertionError: the timeout passed (with the log tail).
        """

        def ready() -> bool:
            if self.is_ready():
                return True
            if not self.is_running():
                raise RuntimeError(
                    f"{self!r} exited with {self.returncode} before ready:\n{self.log_tail()}"
                )
            return False

        wait_for(
            ready, timeout, interval=0.05, message=lambda: f"{self!r} not ready:\n{self.log_tail()}"
        )
        return self

    def child_pids(self) -> list[int]:
        """Pids of the direct children of the main process."""
        if not self.is_running():
            return []
        return _children(self.pid)

    def send_signal(self, sig: int, group: bool = False) -> None:
        """Send ``sig`` to the main process (or its whole process group)."""
        if self.process is None or (not group and self.process.poll() is not None):
            return  # never signal a pid that may have been reused
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)

    def pause(self) -> None:
        """SIGSTOP the whole group: every process and thread freezes, sockets stay open."""
        self.send_signal(signal.SIGSTOP, group=True)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT the whole group (harmless if not paused)."""
        self.send_signal(signal.SIGCONT, group=True)
        self._paused = False

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for the main process to exit."""
        if self.process is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(timeout)
        return None

    def terminate(self, group: bool = True) -> None:
        """Resume if paused (a stopped process cannot act on it), then SIGTERM; no waiting."""
        if self._paused:
            self.resume()
        self.send_signal(signal.SIGTERM, group=group)

    def stop(self, timeout: float = 10.0, group: bool = True) -> int | None:
        """SIGTERM (warm shutdown), wait ``timeout``; then SIGQUIT; then SIGKILL.

        TERM and QUIT go to the whole process group, or with ``group=False`` to
        the main process only (a prefork pool child that gets SIGTERM itself
        dies at once, so only ``group=False`` lets running tasks finish).
        Leftover group members are always SIGKILLed at the end. Returns the
        main process' exit code.
        """
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.terminate(group=group)
            if self.wait(timeout) is None:
                self.send_signal(signal.SIGQUIT, group=group)
                self.wait(2.0)
        return self.kill()

    def kill(self) -> int | None:
        """SIGKILL the whole process group at once (a crash: no clean-up runs) and reap it."""
        if self.process is None:
            return None
        self.send_signal(signal.SIGKILL, group=True)
        code = self.process.wait()
        self._paused = False
        _live.discard(self)
        return code

    def __enter__(self) -> CeleryProcess:
        """Start the process and wait until it is ready."""
        return self.start().wait_ready()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the process."""
        self.stop()

    def __repr__(self) -> str:
        """Show kind, name and pid."""
        pid = self.process.pid if self.process else None
        return f"<{type(self).__name__} {self.name} pid={pid}>"


class CeleryWorker(CeleryProcess):
    """One ``celery -A <app_module> worker`` process in its own session.

    Call :meth:`start` then :meth:`wait_ready` (or use it as a context manager).
    Output (stdout and stderr) goes to ``log_path``; the node name is
    ``<name>@%h``, with a random ``name`` unless given.

    Args:
        app_module: the ``-A`` argument.
        pool: ``-P`` (prefork, solo, threads, gevent, eventlet).
        concurrency: ``-c``.
        queue: ``-Q``: one queue, a comma-separated list, or a sequence of names.
        env, log_dir, name, cwd: as for :class:`CeleryProcess`.
        extra_args: more worker options, appended last.
        loglevel: ``-l``; readiness is read from the ``ready.`` line logged at ``info``, so
            with a higher level override :meth:`is_ready`.
    """

    kind = "worker"

    def __init__(  # noqa: PLR0913 - one argument per worker option (-P, -c, -Q, -l, ...)
        self,
        app_module: str,
        pool: str = "solo",
        concurrency: int = 1,
        queue: str | Sequence[str] = "celery",
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        log_dir: str | os.PathLike[str] | None = None,
        *,
        name: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
        loglevel: str = "info",
    ) -> None:
        """Describe the worker; ``env`` is merged over ``os.environ``."""
        self.pool = pool
        self.concurrency = concurrency
        self.queue = queue if isinstance(queue, str) else ",".join(queue)
        self.extra_args = list(extra_args)
        self.loglevel = loglevel
        super().__init__(
            app_module,
            env=env,
            log_dir=log_dir,
            name=name or f"{pool}-{uuid.uuid4().hex[:8]}",
            cwd=cwd,
        )

    @property
    def hostname(self) -> str:
        """Full node name (``<name>@<host>``), e.g. for ``app.control`` destinations."""
        return f"{self.name}@{socket.gethostname()}"

    def command(self) -> list[str]:
        """Return the command line that :meth:`start` runs."""
        options = {
            "-P": self.pool,
            "-c": str(self.concurrency),
            "-Q": self.queue,
            "-n": f"{self.name}@%h",
            "-l": self.loglevel,
        }
        return [
            *super().command(),
            "worker",
            *itertools.chain.from_iterable(options.items()),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            *self.extra_args,
        ]

    def is_ready(self) -> bool:
        """Whether the worker logged ``<name>@<host> ready.``."""
        return any(
            line.startswith(self.name + "@") and line.endswith(" ready.")
            for line in _log_messages(self.log_text())
        )

    def wait_ready(self, timeout: float = 30.0) -> CeleryWorker:
        """Wait until the worker logged ``ready.``; raise with the log tail if it died."""
        super().wait_ready(timeout)
        return self

    def start(self) -> CeleryWorker:
        """Spawn the worker (does not wait; see :meth:`wait_ready`)."""
        super().start()
        return self

    def __enter__(self) -> CeleryWorker:
        """Start the worker and wait until it is ready."""
        return self.start().wait_ready()

    def __repr__(self) -> str:
        """Show node name, pool and pid."""
        pid = self.process.pid if self.process else None
        return f"<CeleryWorker {self.name} pool={self.pool} pid={pid}>"


def _log_messages(text: str) -> list[str]:
    """Strip celery's ``[time: LEVEL/Process] `` prefix from each log line."""
    return [line.split("] ", 1)[-1].strip() for line in text.splitlines()]


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` from /proc (task children files, else a scan)."""
    task_dir = Path(f"/proc/{pid}/task")
    found: set[int] = set()
    try:
        for children in task_dir.glob("*/children"):
            found.update(int(p) for p in children.read_text().split())
        if found or any(task_dir.glob("*/children")):
            return sorted(found)
    except OSError:
        pass
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # the command may contain spaces and parens: ppid follows the last ")"
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return sorted(found)


@atexit.register
def _kill_leftovers() -> None:
    """Safety net: SIGKILL the groups of processes their starter forgot to stop."""
    for process in list(_live):
        process.send_signal(signal.SIGKILL, group=True)
