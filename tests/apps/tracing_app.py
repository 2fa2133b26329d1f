"""Leased tasks traced by OpenTelemetry in a real worker (``tests/test_tracing.py``).

At worker start (each prefork child, or the worker itself for the other pools) the SDK's tracer
provider is set up with its in-memory exporter and the Celery instrumentation. After each task
(``task_postrun``, after the instrumentation ended the run's span) every finished span not yet
reported is pushed as JSON to the Redis list ``spans`` on the broker's server, where the test
reads them.

Configured from ``TEST_BROKER_URL`` (broker, results, lease store, the ``spans`` list) and
``TEST_QUEUE``; ``PARKED_QUEUE`` is a queue no worker consumes, where the deduplicated task's
message waits.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import task_postrun, worker_init, worker_process_init
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_lease import LeasedTask, hold
from tests.support.workers import BROKER_URL_ENV, QUEUE_ENV

BROKER = os.environ.get(BROKER_URL_ENV, "redis://127.0.0.1:1/0")
QUEUE = os.environ.get(QUEUE_ENV, "celery")
PARKED_QUEUE = f"{QUEUE}-parked"
TTL = 1.5  # renewed every 0.5 s

app = Celery("tracing_app", broker=BROKER, backend=BROKER, set_as_current=False)
app.conf.update(
    task_default_queue=QUEUE,
    lease_backend=BROKER,
    lease_ttl=TTL,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    result_expires=300,
)

_exporter = InMemorySpanExporter()
_reported: set[int] = set()
_report_lock = threading.Lock()


def _trace(**kw: Any) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_exporter))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument(tracer_provider=provider)
    task_postrun.connect(_report, weak=False)  # after the instrumentation's: the span ended


@worker_process_init.connect
def _trace_prefork_child(**kw: Any) -> None:
    _trace()


@worker_init.connect
def _trace_other_pools(sender: Any = None, **kw: Any) -> None:
    if "prefork" not in getattr(sender.pool_cls, "__module__", str(sender.pool_cls)):
        _trace()


def _as_json(span: ReadableSpan) -> str:
    context, parent = span.get_span_context(), span.parent
    return json.dumps(
        {
            "name": span.name,
            "span_id": context.span_id if context else None,
            "trace_id": context.trace_id if context else None,
            "parent_id": parent.span_id if parent else None,
            "attributes": dict(span.attributes or {}),
            "events": [
                {"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events
            ],
            "status": span.status.status_code.name,
            "seconds": ((span.end_time or 0) - (span.start_time or 0)) / 1e9,
            "pid": os.getpid(),
        }
    )


def _report(**kw: Any) -> None:
    with _report_lock:
        new = [s for s in _exporter.get_finished_spans() if id(s) not in _reported]
        _reported.update(id(s) for s in new)
    if new:
        with redis.Redis.from_url(BROKER) as client:
            client.rpush("spans", *(_as_json(s) for s in new))


@app.task(shared=False, bind=True, base=LeasedTask, name="traced", lease_key=("tag",))
def traced(self: Any, tag: str, seconds: float = 0.0) -> int:
    """Hold the lease for ``seconds``; return the fencing token."""
    time.sleep(seconds)
    return int(self.lease.fencing_token)


@app.task(shared=False, bind=True, base=LeasedTask, name="lose", lease_key=("tag",))
def lose(self: Any, tag: str) -> None:
    """Delete this execution's key, as an eviction would: the next renewal is refused and
    ``LeaseLost`` is raised here (short sleeps: the threads pool delivers between them)."""
    with redis.Redis.from_url(BROKER) as client:
        client.delete(self.lease.key)
    _held_for(30.0)


def _held_for(seconds: float) -> None:
    """Sleep ``seconds`` in short steps (the threads pool delivers ``LeaseLost`` between)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)


def _holding(name: str, on_conflict: str) -> Any:
    """A task ``name`` that holds its lease ``seconds`` and returns its fencing token; a
    duplicate meets ``lease_on_conflict=on_conflict``."""

    def hold_for(self: Any, tag: str, seconds: float = 0.0) -> int:
        _held_for(seconds)
        return int(self.lease.fencing_token)

    return app.task(
        shared=False,
        bind=True,
        base=LeasedTask,
        name=name,
        lease_key=("tag",),
        lease_on_conflict=on_conflict,
    )(hold_for)


queued = _holding("queued", "queue")  # a duplicate waits in the key's line
coalesced = _holding("coalesced", "coalesce")  # duplicates become one pending run
preempting = _holding("preempting", "preempt")  # a newer run takes the key over


@app.task(
    shared=False, bind=True, base=LeasedTask, name="deduped", lease_key=("tag",), lease_dedupe=True
)
def deduped(self: Any, tag: str) -> str:
    """Published by :func:`publish_twice` (its message waits in ``PARKED_QUEUE``)."""
    return tag


@app.task(shared=False, name="publish_twice")
def publish_twice(tag: str) -> list[str]:
    """Publish :func:`deduped` twice: the first waits, the second is deduplicated."""
    return [deduped.apply_async((tag,), queue=PARKED_QUEUE).lease_disposition for _ in range(2)]


@app.task(shared=False, name="hold_after_wait")
def hold_after_wait(name: str, first_for: float) -> int:
    """Hold ``name`` once another thread, which took it first, has held it ``first_for``
    float seconds; return the fencing token this hold got."""
    taken = threading.Event()

    def first() -> None:
        with hold(name, app=app):
            taken.set()
            time.sleep(first_for)

    thread = threading.Thread(target=first)
    thread.start()
    taken.wait(30)
    with hold(name, app=app, timeout=30.0) as lease:
        fencing_token = lease.fencing_token
    thread.join()
    return fencing_token
