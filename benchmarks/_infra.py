"""What the benchmarks add to the shared process harness: their worker, and statistics.

Private ``redis-server`` processes, ``celery worker`` subprocesses, polling and free ports come
from the repository's ``harness`` package (shared with the test suite and the demo); this
module adds the benchmark worker (``benchmarks.app``, ready once it marked itself in the
record store) and order statistics.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import redis

from harness import REPO_ROOT
from harness.redis_server import no_retry
from harness.workers import CeleryWorker

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


# --- redis and workers --------------------------------------------------------------------------


def client_kwargs() -> dict[str, Any]:
    """redis-py options for the benchmark's own clients: no retries, a 5 s timeout."""
    return {"socket_timeout": 5.0, "socket_connect_timeout": 5.0, "retry": no_retry()}


#: The Celery app module the workers run.
APP_MODULE = "benchmarks.app"


class Worker(CeleryWorker):
    """One ``celery -A benchmarks.app worker`` subprocess in its own process group.

    The app reads its configuration from the ``BENCH_*`` variables in ``env`` (see
    :mod:`benchmarks.app`) and marks itself ready in the record store ``records`` when the
    worker is ready (it logs at ``warning``, so there is no ``ready.`` line to read).
    """

    def __init__(
        self,
        pool: str,
        concurrency: int,
        queues: Sequence[str],
        env: Mapping[str, str],
        log_dir: Path,
        records: redis.Redis,
        loglevel: str = "warning",
    ) -> None:
        """Describe the worker (see :meth:`start`)."""
        super().__init__(
            APP_MODULE,
            pool=pool,
            concurrency=concurrency,
            queue=queues,
            env=env,
            log_dir=log_dir,
            name=f"bench-{pool}-{uuid.uuid4().hex[:8]}",
            cwd=REPO_ROOT,
            loglevel=loglevel,
        )
        self.queues = list(queues)
        self.records = records

    def is_ready(self) -> bool:
        """Whether the worker marked itself ready in the record store."""
        return bool(self.records.exists(f"bench:ready:{self.hostname}"))

    def wait_ready(self, timeout: float = 60.0) -> Worker:
        """Wait until the worker marked itself ready; raise with its log tail if it exited."""
        super().wait_ready(timeout)
        return self


def process_cpu(pid: int | None, children: bool = True) -> float:
    """Float CPU seconds (user + system) used so far by process ``pid`` and, with
    ``children``, its descendants (a worker's pool processes); 0.0 for a process that is gone."""
    import psutil

    if pid is None:
        return 0.0
    try:
        main = psutil.Process(pid)
        procs = [main, *(main.children(recursive=True) if children else ())]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def context_switches(pid: int | None) -> tuple[int, int]:
    """``(voluntary, involuntary)`` context switches so far of every thread of process
    ``pid`` (int counts; the heartbeat thread's included); ``(0, 0)`` when it is gone. A
    voluntary one is a wait (a reply not there yet), an involuntary one a preemption (on a
    small machine, often by the redis-server a write just woke)."""
    import psutil

    if pid is None:
        return 0, 0
    voluntary = involuntary = 0
    try:
        threads = psutil.Process(pid).threads()
    except psutil.NoSuchProcess:
        return 0, 0
    for thread in threads:
        try:
            counts = psutil.Process(thread.id).num_ctx_switches()  # /proc/<tid>: that thread
        except psutil.NoSuchProcess:
            continue
        voluntary += counts.voluntary
        involuntary += counts.involuntary
    return voluntary, involuntary


def section_timer() -> Callable[[], float]:
    """A stopwatch: returns a function giving float seconds since it was made."""
    started = time.perf_counter()
    return lambda: time.perf_counter() - started
