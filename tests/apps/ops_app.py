"""Test app for beat, Flower, the ``celery lease`` command, signals and metrics.

Configured from environment variables (set by the tests):

- ``TEST_BROKER_URL`` / ``TEST_RESULT_BACKEND`` / ``TEST_QUEUE``: as in ``smoke_app``.
- ``LEASE_BACKEND``: lease store URL (default: the broker URL); ``LEASE_BACKEND_OPTIONS``:
  ``lease_backend_options`` as JSON (``{"master_name": ...}`` for a Sentinel URL).
- ``LEASE_TTL`` (float seconds, default 2.0), ``LEASE_ON_CONFLICT`` (default ``skip``).
- ``BEAT_PERIOD`` (float seconds): adds a beat entry sending ``ops.slow`` (``SLOW_SECONDS``)
  or ``ops.tick`` (``BEAT_TASK=tick``) every period.
- ``BEAT_TTL`` (float seconds): ``lease_beat_ttl``.
- ``BEAT_MAX_INTERVAL`` (float seconds, default 1): ``beat_max_loop_interval``.
- ``BEAT_INNER=redbeat``: ``LeasedScheduler`` wraps RedBeat's scheduler (its own lock off).
- ``RECORD_SIGNALS=1``: every celery-lease signal is recorded in the ``signals`` list.
- ``METRICS_PORT``: serve the lease metrics on that port.
- ``VISIBILITY_TIMEOUT`` (float seconds): the broker's ``visibility_timeout``.

Runs are recorded in Redis lists (``runs:<tag>``) as JSON so tests can check overlaps.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from celery_lease import LeasedTask
from celery_lease.base import signals
from tests.support.workers import BROKER_URL_ENV, QUEUE_ENV, RESULT_BACKEND_ENV

BROKER = os.environ.get(BROKER_URL_ENV, "redis://127.0.0.1:1/0")
QUEUE = os.environ.get(QUEUE_ENV, "celery")

app = Celery("ops_app", broker=BROKER, backend=os.environ.get(RESULT_BACKEND_ENV) or BROKER)
app.conf.update(
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    result_expires=300,
    lease_backend=os.environ.get("LEASE_BACKEND") or BROKER,
    lease_ttl=float(os.environ.get("LEASE_TTL", "2.0")),
    lease_on_conflict=os.environ.get("LEASE_ON_CONFLICT", "skip"),
    beat_max_loop_interval=float(os.environ.get("BEAT_MAX_INTERVAL", "1")),
)
if os.environ.get("LEASE_BACKEND_OPTIONS"):
    app.conf.lease_backend_options = json.loads(os.environ["LEASE_BACKEND_OPTIONS"])
if os.environ.get("VISIBILITY_TIMEOUT"):
    app.conf.broker_transport_options = {
        "visibility_timeout": float(os.environ["VISIBILITY_TIMEOUT"])
    }
if os.environ.get("ACKS_LATE") == "1":
    app.conf.task_acks_late = True
if os.environ.get("CONSUMER_TIMEOUT"):  # RabbitMQ's, as the user states it: float seconds
    app.conf.lease_rabbitmq_consumer_timeout = float(os.environ["CONSUMER_TIMEOUT"])
if os.environ.get("QUEUE_CONSUMER_TIMEOUT"):  # the queue's own, integer milliseconds
    from kombu import Queue

    app.conf.task_queues = [
        Queue(
            QUEUE, queue_arguments={"x-consumer-timeout": int(os.environ["QUEUE_CONSUMER_TIMEOUT"])}
        )
    ]
if os.environ.get("BEAT_TTL"):
    app.conf.lease_beat_ttl = float(os.environ["BEAT_TTL"])
if os.environ.get("BEAT_INNER") == "redbeat":
    app.conf.update(
        lease_beat_scheduler="redbeat.RedBeatScheduler",
        redbeat_redis_url=BROKER,
        redbeat_lock_key=None,
        redbeat_key_prefix=f"redbeat-{QUEUE}",
    )
if os.environ.get("BEAT_PERIOD"):
    task = "ops.tick" if os.environ.get("BEAT_TASK") == "tick" else "ops.slow"
    app.conf.beat_schedule = {
        "periodic": {
            "task": task,
            "schedule": float(os.environ["BEAT_PERIOD"]),
            "kwargs": (
                {"tag": "beat"}
                if task == "ops.tick"
                else {"seconds": float(os.environ.get("SLOW_SECONDS", "1.5")), "tag": "beat"}
            ),
        },
    }

_client: redis.Redis | None = None


def client() -> redis.Redis:
    """A Redis client on the broker (for test bookkeeping only)."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(BROKER, socket_timeout=5)
    return _client


def _record(_list: str, **fields: Any) -> None:
    client().rpush(_list, json.dumps(fields, default=str))


def _interruptible_sleep(seconds: float) -> None:
    # Small steps so LeaseLost lands promptly in every pool (threads: between bytecodes).
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.02)


@app.task(shared=False, base=LeasedTask, bind=True, name="ops.slow", lease_key=("tag",))
def slow(self: Any, seconds: float, tag: str = "x") -> str:
    """Record its start and end in ``runs:<tag>``; takes ``seconds`` (float)."""
    start = time.time()
    _interruptible_sleep(seconds)
    _record(f"runs:{tag}", id=self.request.id, start=start, end=time.time(), pid=os.getpid())
    return tag


@app.task(shared=False, base=LeasedTask, bind=True, name="ops.hold")
def hold(self: Any, name: str, seconds: float) -> str:
    """Hold the lease of ``name`` for ``seconds`` (float)."""
    _record("started", id=self.request.id, name=name, pid=os.getpid())
    _interruptible_sleep(seconds)
    return name


@app.task(
    shared=False,
    base=LeasedTask,
    bind=True,
    name="ops.hold_coalesce",  # type: ignore[untyped-decorator]
    lease_key=("name",),
    lease_on_conflict="coalesce",
)
def hold_coalesce(self: Any, name: str, seconds: float) -> str:
    """:func:`hold`, its duplicates coalesced into the key's pending run."""
    return hold.run(name, seconds)  # type: ignore[no-any-return]


@app.task(
    shared=False,
    base=LeasedTask,
    bind=True,
    name="ops.hold_queue",  # type: ignore[untyped-decorator]
    lease_key=("name",),
    lease_on_conflict="queue",
)
def hold_queue(self: Any, name: str, seconds: float) -> str:
    """:func:`hold`, its duplicates waiting in the key's line."""
    return hold.run(name, seconds)  # type: ignore[no-any-return]


@app.task(shared=False, bind=True, name="ops.tick")
def tick(self: Any, tag: str = "x") -> None:
    """A plain task beat sends: records which beat process sent it (``origin``)."""
    _record(f"ticks:{tag}", origin=self.request.origin, at=time.time())


if os.environ.get("RECORD_SIGNALS") == "1":

    def _recorder(name: str) -> Any:
        def receive(sender: Any = None, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            fields = {
                k: (repr(v) if isinstance(v, BaseException) else v) for k, v in kwargs.items()
            }
            _record("signals", signal=name, sender=str(getattr(sender, "name", sender)), **fields)

        return receive

    for _name in (
        "lease_acquired",
        "lease_conflict",
        "lease_renewal_failed",
        "lease_lost",
        "lease_released",
        "lease_renewed",
        "lease_coalesced",
        "lease_queued",
    ):
        getattr(signals, _name).connect(_recorder(_name), weak=False)

if os.environ.get("METRICS_PORT"):
    from celery_lease.ops import metrics

    metrics.install(app, port=int(os.environ["METRICS_PORT"]), addr="127.0.0.1")
