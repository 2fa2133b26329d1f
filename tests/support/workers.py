"""Real ``celery worker`` subprocesses for integration tests."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from itertools import chain
from pathlib import Path
from types import TracebackType

from tests.support.waiting import wait_for

#: Root of the repository: always on the worker's PYTHONPATH, so both
#: ``tests.apps.*`` modules and the library itself import.
REPO_ROOT = Path(__file__).resolve().parents[2]

#: Environment variables the test apps read (set by the ``worker_factory`` fixture).
BROKER_URL_ENV = "TEST_BROKER_URL"
RESULT_BACKEND_ENV = "TEST_RESULT_BACKEND"
QUEUE_ENV = "TEST_QUEUE"

_live: set[CeleryWorker] = set()


class CeleryWorker:
    """One ``celery -A <app_module> worker`` process in its own session.

    Call :meth:`start` then :meth:`wait_ready` (or use it as a context manager).
    Output (stdout and stderr) goes to ``log_path``; the node name is
    ``<name>@%h`` with a random ``name``.
    """

    def __init__(
        self,
        app_module: str,
        pool: str = "solo",
        concurrency: int = 1,
        queue: str = "celery",
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        log_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """Describe the worker; ``env`` is merged over ``os.environ``."""
        self.app_module = app_module
        self.pool = pool
        self.concurrency = concurrency
        self.queue = queue
        self.env = dict(env or {})
        self.extra_args = list(extra_args)
        self.name = uuid.uuid4().hex[:12]
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="celery-worker-")
            log_dir = self._tmp.name
        self.log_path = Path(log_dir) / f"worker-{pool}-{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None

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
            "-l": "info",
        }
        return [
            *(sys.executable, "-m", "celery", "-A", self.app_module, "worker"),
            *chain.from_iterable(options.items()),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            *self.extra_args,
        ]

    def _environ(self) -> dict[str, str]:
        environ = {**os.environ, **self.env}
        paths = [str(REPO_ROOT), *environ.get("PYTHONPATH", "").split(os.pathsep)]
        environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        environ["PYTHONUNBUFFERED"] = "1"
        return environ

    def start(self) -> CeleryWorker:
        """Spawn the worker (does not wait; see :meth:`wait_ready`)."""
        if self.process is not None:
            raise RuntimeError("worker already started")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._environ(),
                cwd=self.log_path.parent,
                start_new_session=True,
            )
        _live.add(self)
        return self

    @property
    def pid(self) -> int:
        """Pid of the main worker process."""
        if self.process is None:
            raise RuntimeError("worker not started")
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """Exit code once the main process ended, else ``None``."""
        return None if self.process is None else self.process.poll()

    def is_running(self) -> bool:
        """Whether the main worker process is still alive."""
        return self.process is not None and self.process.poll() is None

    def log_text(self) -> str:
        """Everything the worker wrote so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def is_ready(self) -> bool:
        """Whether the worker logged ``<name>@<host> ready.``."""
        return any(
            line.startswith(self.name + "@") and line.endswith(" ready.")
            for line in _log_messages(self.log_text())
        )

    def wait_ready(self, timeout: float = 30.0) -> CeleryWorker:
        """Wait until the worker logged ``ready.``; raise with the log tail if it died."""

        def ready() -> bool:
            if self.is_ready():
                return True
            if not self.is_running():
                raise RuntimeError(
                    f"celery worker exited with {self.returncode} before ready:\n{self.log_tail()}"
                )
            return False

        wait_for(
            ready,
            timeout,
            interval=0.05,
            message=lambda: f"celery worker not ready:\n{self.log_tail()}",
        )
        return self

    def child_pids(self) -> list[int]:
        """Pids of the direct children of the main worker process."""
        if not self.is_running():
            return []
        return _children(self.pid)

    def send_signal(self, sig: int, group: bool = False) -> None:
        """Send ``sig`` to the main process (or its whole process group)."""
        if self.process is None or (not group and self.process.poll() is not None):
            return  # never signal a pid that may have been reused
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for the main process to exit."""
        if self.process is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(timeout)
        return None

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
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGQUIT, 2.0)):
            if self.process.poll() is not None:
                break
            self.send_signal(sig, group=group)
            self.wait(wait)
        return self.kill()

    def kill(self) -> int | None:
        """SIGKILL the whole process group at once (a crash) and reap it."""
        if self.process is None:
            return None
        self.send_signal(signal.SIGKILL, group=True)
        code = self.process.wait()
        _live.discard(self)
        return code

    def __enter__(self) -> CeleryWorker:
        """Start the worker and wait until it is ready."""
        return self.start().wait_ready()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the worker."""
        self.stop()

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
    """Safety net: SIGKILL the groups of workers a test forgot to stop."""
    for worker in list(_live):
        worker.send_signal(signal.SIGKILL, group=True)
