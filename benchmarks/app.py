"""The Celery app the benchmark workers run, configured from environment variables.

- ``BENCH_BROKER``: Redis URL of the broker, which also holds the overhead benchmark's leases
  and locks (one broker and one Redis for every variant) and the records tasks write;
- ``BENCH_LEASE_STORE``: Redis URL of the lease store of the loss-detection task (a separate
  server, so that pausing it leaves the broker and the records answering);
- ``BENCH_DETECT_TTL``: the detection task's ``lease_ttl`` (float seconds);
- ``BENCH_STALL_TTLS``: comma-separated ``lease_ttl`` values, one stall task per value.

The benchmark process builds the same app with :func:`make_app` to publish: celery-singleton
and celery-once take their locks when a task is published, so the publisher must use the same
task classes as the worker.

Tasks record what the benchmark measures in the broker's Redis, never in the lease store:

- ``bench.plain`` / ``bench.leased`` / ``bench.singleton`` / ``bench.once`` ``(run, i, n)``:
  trivial bodies; task 0 records when it starts and task ``n - 1`` when it ends;
  ``bench.leased_sync`` waits for its release's reply before its result is stored (the
  release ``LeasedTask`` made before it wrote the release without waiting);
  ``bench.floor`` / ``bench.floor1`` are ``bench.plain`` plus two / one ``PING`` round trips in
  the body: the least an execution-time lease can add to a plain task with a synchronous
  release (two round trips) and with the release off the critical path (one);
- ``bench.e2e_<variant>(run, key, sleep_ms)`` (:data:`E2E_VARIANTS`): counts its body per key
  and sleeps ``sleep_ms``; ``bench.e2e_report(run)`` pushes the counts of a batch;
- ``bench.hold(trial, body, limit)``: holds a lease and sleeps or spins for at most ``limit``
  seconds, recording when :class:`~celery_lease.LeaseLost` arrived (wall clock, deadline clock
  and the lease's local deadline) or that it never did;
- ``bench.stall_<ms>(trial, role)``: the crash benchmark's holder (``role="holder"`` sleeps
  until it is killed) and its duplicate (retries on conflict until the lease expires).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import redis
from celery import Celery, Task
from celery.signals import worker_ready
from celery_once import QueueOnce
from celery_singleton import Singleton

from celery_lease import LeasedTask, LeaseLost
from celery_lease.base import clock

_records: dict[int, redis.Redis] = {}


def records() -> redis.Redis:
    """This process's client of the record store (the broker's Redis)."""
    pid = os.getpid()
    client = _records.get(pid)
    if client is None:
        client = redis.Redis.from_url(os.environ["BENCH_BROKER"], socket_timeout=5.0)
        _records[pid] = client
    return client


def _mark(run: str, what: str) -> None:
    records().set(f"tp:{run}:{what}", repr(time.time()))


def _round_trips(count: int) -> None:
    """``count`` ``PING`` round trips on a client made like celery-lease's own."""
    from celery_lease import store

    client = store.client_for(os.environ.get("BENCH_BROKER", ""), 2.0)
    for _ in range(count):
        client.execute_command("PING")


class SyncReleaseTask(LeasedTask):  # type: ignore[misc]
    """``LeasedTask`` that waits for its release's reply before the result is stored."""

    _lease_release_wait = True


def _trivial(run: str, i: int, n: int) -> int:
    if i == 0:
        _mark(run, "first")
    if i == n - 1:
        _mark(run, "last")
    return i


def _hold(task: Any, trial: str, body: str, limit: float) -> str:
    lease = task.lease
    rec = records()
    key = f"det:{trial}"
    rec.hset(
        key,
        mapping={
            "started": repr(time.time()),
            "lease_key": lease.key,
            "mechanism": lease.target.mechanism,
            "pid": os.getpid(),
        },
    )
    try:
        if body == "sleep":
            time.sleep(limit)
        else:
            end = time.monotonic() + limit
            while time.monotonic() < end:
                pass
    except LeaseLost as exc:
        at_clock, at_wall = clock.now(), time.time()
        rec.hset(
            key,
            mapping={
                "outcome": "raised",
                "cause": exc.cause,
                "at_wall": repr(at_wall),
                "at_clock": repr(at_clock),
                "deadline": repr(lease.deadline),
            },
        )
        return "raised"
    at_clock, at_wall = clock.now(), time.time()
    loss = lease.detect_loss()
    rec.hset(
        key,
        mapping={
            "outcome": "not-raised",
            "cause": loss.cause if loss else "",
            "at_wall": repr(at_wall),
            "at_clock": repr(at_clock),
            "deadline": repr(lease.deadline),
        },
    )
    return "not-raised"


def _stall(trial: str, role: str) -> None:
    records().rpush(
        f"stall:{trial}", json.dumps({"role": role, "at": time.time(), "pid": os.getpid()})
    )
    if role == "holder":
        time.sleep(30.0)  # killed long before; bounded all the same


#: The end-to-end benchmark's variants (benchmarks/e2e.py): name -> (base class, task
#: options). One entry per variant; a variant whose options the installed celery_lease does
#: not accept is left out of the app (:func:`e2e_rejected` says why) and skipped by the run.
E2E_VARIANTS: dict[str, tuple[type, dict[str, Any]]] = {
    "plain": (Task, {}),
    "leased": (LeasedTask, {}),
    "leased_sync": (SyncReleaseTask, {}),
    "singleton": (Singleton, {}),
    "once": (QueueOnce, {"once": {"graceful": True}}),
    "leased_dedupe": (LeasedTask, {"lease_dedupe": True}),
    "leased_coalesce": (LeasedTask, {"lease_on_conflict": "coalesce"}),
}
#: Bodies run per (run id, key) in this worker process: the end-to-end benchmark counts them.
_e2e_bodies: dict[str, dict[str, int]] = {}


def e2e_rejected(name: str) -> str | None:
    """Why the installed celery_lease refuses ``E2E_VARIANTS[name]`` (None: it accepts it)."""
    base, options = E2E_VARIANTS[name]
    probe = Celery("probe", broker="memory://", set_as_current=False)
    probe.conf.lease_backend = "redis://127.0.0.1:1/0"
    try:
        probe.task(name="probe", base=base, shared=False, **options)(_e2e_body)
        probe.finalize()
        probe.tasks["probe"]  # registration validates the options
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


_e2e_lock = threading.Lock()  # a threads-pool worker counts from several threads


def _e2e_body(run: str, key: str, sleep_ms: float) -> None:
    with _e2e_lock:
        counts = _e2e_bodies.setdefault(run, {})
        counts[key] = counts.get(key, 0) + 1
    if sleep_ms:
        time.sleep(sleep_ms / 1000)


def _e2e_settled(queue: str, task_id: str) -> bool:
    """A concurrent (threads) worker has nothing left of a batch: its queue is empty and it
    holds no message but the report's own, twice in a row 2 ms apart."""
    from celery.worker import state

    for _ in range(2):
        if records().llen(queue) or {r.id for r in state.reserved_requests} - {task_id}:
            return False
        time.sleep(0.002)
    return True


def _e2e_report(run: str, queue: str = "") -> None:
    """Sent after a batch: the worker (solo, in order) has run every body published before;
    with ``queue`` (a concurrent threads worker consuming it), once nothing is left of it."""
    if queue:
        from celery import current_task

        deadline = time.monotonic() + 120.0
        while not _e2e_settled(queue, current_task.request.id) and time.monotonic() < deadline:
            time.sleep(0.001)
    with _e2e_lock:
        counts = _e2e_bodies.pop(run, {})
    records().rpush(
        f"e2e:{run}:done",
        json.dumps(
            {
                "at": time.time(),
                "bodies": sum(counts.values()),
                "keys": len(counts),
                "max_per_key": max(counts.values(), default=0),
            }
        ),
    )


def make_app(
    broker: str,
    lease_store: str | None = None,
    detect_ttl: float = 1.0,
    stall_ttls: tuple[float, ...] = (1.0,),
) -> Celery:
    """Build the benchmark app (the worker's, or an identical one to publish with)."""
    app = Celery("bench", broker=broker)
    app.conf.update(
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=True,
        worker_redirect_stdouts=False,
        ONCE={
            "backend": "celery_once.backends.Redis",
            "settings": {"url": broker, "default_timeout": 3600},
        },
        singleton_backend_url=broker,
    )

    @app.task(name="bench.plain", shared=False)  # type: ignore[untyped-decorator]
    def plain(run: str, i: int, n: int) -> int:
        return _trivial(run, i, n)

    @app.task(name="bench.floor", shared=False)  # type: ignore[untyped-decorator]
    def floor(run: str, i: int, n: int) -> int:
        _round_trips(2)
        return _trivial(run, i, n)

    @app.task(name="bench.floor1", shared=False)  # type: ignore[untyped-decorator]
    def floor1(run: str, i: int, n: int) -> int:
        _round_trips(1)
        return _trivial(run, i, n)

    @app.task(name="bench.leased", base=LeasedTask, shared=False)  # type: ignore[untyped-decorator]
    def leased(run: str, i: int, n: int) -> int:
        return _trivial(run, i, n)

    @app.task(name="bench.leased_sync", base=SyncReleaseTask, shared=False)  # type: ignore[untyped-decorator]
    def leased_sync(run: str, i: int, n: int) -> int:
        return _trivial(run, i, n)

    @app.task(name="bench.singleton", base=Singleton, shared=False)  # type: ignore[untyped-decorator]
    def singleton(run: str, i: int, n: int) -> int:
        return _trivial(run, i, n)

    @app.task(name="bench.once", base=QueueOnce, once={"graceful": True}, shared=False)  # type: ignore[untyped-decorator]
    def once(run: str, i: int, n: int) -> int:
        return _trivial(run, i, n)

    @app.task(  # type: ignore[untyped-decorator]
        name="bench.hold",
        base=LeasedTask,
        bind=True,
        shared=False,
        lease_ttl=detect_ttl,
        lease_backend=lease_store or broker,
        lease_on_conflict="fail",
    )
    def hold(self: Task, trial: str, body: str, limit: float) -> str:
        return _hold(self, trial, body, limit)

    for ttl in stall_ttls:
        app.task(
            name=f"bench.stall_{round(ttl * 1000)}",
            base=LeasedTask,
            lease_ttl=ttl,
            shared=False,
            lease_key=("trial",),
            lease_on_conflict="retry",
            max_retries=None,
        )(_stall)

    for variant, (base, options) in E2E_VARIANTS.items():
        if base is not LeasedTask or not e2e_rejected(variant):
            app.task(name=f"bench.e2e_{variant}", base=base, shared=False, **options)(_e2e_body)
    app.task(name="bench.e2e_report", shared=False)(_e2e_report)

    del plain, floor, floor1, leased, leased_sync, singleton, once, hold
    return app


def _env_ttls() -> tuple[float, ...]:
    raw = os.environ.get("BENCH_STALL_TTLS", "1.0")
    return tuple(float(x) for x in raw.split(",") if x)


app = make_app(
    os.environ.get("BENCH_BROKER", "redis://127.0.0.1:1/0"),
    os.environ.get("BENCH_LEASE_STORE"),
    float(os.environ.get("BENCH_DETECT_TTL", "1.0")),
    _env_ttls(),
)


@worker_ready.connect
def _mark_ready(sender: Any = None, **_: Any) -> None:
    """Tell the benchmark this worker consumes now (its log level hides ``ready.``)."""
    hostname = getattr(sender, "hostname", None)
    if hostname and os.environ.get("BENCH_BROKER"):
        records().set(f"bench:ready:{hostname}", "1", ex=3600)
