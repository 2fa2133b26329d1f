"""Instructions per execution of a whole solo worker under callgrind, publisher left out.

:mod:`benchmarks.instructions` counts Celery's tracer alone, with the request a worker passes:
it leaves out what the worker does around it (the broker's consumer, the request, the pool's
accept, where :mod:`celery_lease.execution.accepted` writes the acquire, the acknowledgement). Here
a real ``celery worker --pool solo`` of :mod:`benchmarks.app` runs under ``valgrind
--tool=callgrind``, consuming the end-to-end benchmark's queue (:mod:`benchmarks.e2e`); the
benchmark process publishes one batch of distinct keys per variant, and ``callgrind_control``
zeroes the worker's counters before the batch and dumps them after it. Every thread of the
worker is counted (the heartbeat's too); the kernel's side of its system calls is not (that
is what the end-to-end run's CPU and context switches show). Counts repeat within 0.5%
between runs.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.redis_server import RedisServer

from . import e2e
from ._infra import Worker, client_kwargs

#: The variants counted, each a batch of distinct keys on the same worker.
VARIANTS = ("plain", "leased", "singleton", "once")
DEFAULT_CALLS = 300


class _CallgrindWorker(Worker):
    """The benchmark's solo worker, run under callgrind, its counts dumped on request."""

    out_dir: Path

    def command(self) -> list[str]:
        return [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={self.out_dir}/cg.%p",
            "--dump-instr=no",
            *super().command(),
        ]


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=120)


def _dump_cost(out_dir: Path, number: int) -> int:
    """The instruction count of callgrind's dump ``number`` (the worker's files are
    ``cg.<pid>.<number>``), waiting for it to be written."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for path in out_dir.glob(f"cg.*.{number}"):
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("summary:"):
                    return int(line.split()[1])
        time.sleep(0.2)
    raise RuntimeError(f"no callgrind dump {number} in {out_dir}")


def measure(calls: int = DEFAULT_CALLS) -> dict[str, Any]:
    """Instructions per execution of the solo worker, per variant, and what each variant adds
    to plain ``Task``'s.

    Raises:
        RuntimeError: valgrind is not installed, or no dump was written.
    """
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise RuntimeError("valgrind is not installed (apt-get install valgrind)")
    from .app import make_app

    out_dir = Path(tempfile.mkdtemp(prefix="celery-lease-cgw-"))
    log_dir = Path(tempfile.mkdtemp(prefix="celery-lease-cgw-log-"))
    per_call: dict[str, int] = {}
    try:
        with RedisServer() as broker:
            records = broker.client(**client_kwargs())
            worker = _CallgrindWorker(
                "solo", 1, [e2e.QUEUE], {"BENCH_BROKER": broker.url()}, log_dir, records
            )
            worker.out_dir = out_dir
            worker.start()
            try:
                worker.wait_ready(300)  # about 50 times slower under valgrind
                app = make_app(broker.url())
                pid = str(worker.pid)
                for variant in VARIANTS:  # imports, script loads, connections
                    e2e.run_batch(
                        app,
                        records,
                        worker,
                        broker.pid,
                        variant,
                        {"keys": 100, "copies": 1, "sleep_ms": 0.0},
                    )
                for number, variant in enumerate(VARIANTS, start=1):
                    _control("-z", pid)
                    e2e.run_batch(
                        app,
                        records,
                        worker,
                        broker.pid,
                        variant,
                        {"keys": calls, "copies": 1, "sleep_ms": 0.0},
                    )
                    _control("-d", variant, pid)
                    per_call[variant] = round(_dump_cost(out_dir, number) / calls)
            finally:
                worker.stop()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
        shutil.rmtree(log_dir, ignore_errors=True)
    return {
        "calls": calls,
        "per_execution": per_call,
        "added": {v: per_call[v] - per_call["plain"] for v in VARIANTS},
    }
