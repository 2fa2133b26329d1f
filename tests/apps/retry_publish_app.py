"""A leased task with ``lease_dedupe`` whose body asks for a retry while the lease store does
not answer, run by a real worker (``tests/test_loss_in_publish.py``).

Configured from the environment: ``TEST_BROKER_URL`` (broker, result backend and the
``journal`` list, a server the test never pauses), ``TEST_QUEUE``, ``LEASE_BACKEND`` (the
lease store: a throwaway server the test pauses). The lease lives 3 s (renewed every second)
and every store call waits at most 0.9 s, so a call sent less than 0.9 s before the local
deadline is still waiting when the deadline passes.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from celery_lease import LeasedTask, LeaseLost
from celery_lease.base import signals

BROKER = os.environ.get("TEST_BROKER_URL", "redis://127.0.0.1:1/0")

app = Celery("retry_publish_app", broker=BROKER, backend=BROKER, set_as_current=False)
app.conf.update(
    task_default_queue=os.environ.get("TEST_QUEUE", "celery"),
    lease_backend=os.environ.get("LEASE_BACKEND", BROKER),
    lease_ttl=3.0,
    lease_store_timeout=0.9,
    lease_dedupe=True,
    lease_require_noeviction=False,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    result_expires=600,
)

_journal = redis.Redis.from_url(BROKER)


def record(event: str, **fields: Any) -> None:
    """Append one event to the journal."""
    _journal.rpush("journal", json.dumps({"event": event, "t": time.time(), **fields}))


def journal() -> list[dict[str, Any]]:
    """Every event recorded so far, in order."""
    return [json.loads(e) for e in _journal.lrange("journal", 0, -1)]


@signals.lease_lost.connect  # type: ignore[untyped-decorator]
def _on_lost(sender: Any = None, task_id: str = "", cause: str = "", **_: Any) -> None:
    record("lost", task_id=task_id, cause=cause)


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="retry_late",  # type: ignore[untyped-decorator]
    lease_key=("tag",),
    max_retries=3,
)
def retry_late(self: Any, tag: str) -> int:
    """First run: wait until the test paused the lease store (the ``paused:<tag>`` key on the
    journal's server), then until the lease has less than 0.4 s to live, then ask for a retry:
    the retry's publish (a ``lease_dedupe`` claim first) is still waiting for the store when
    the local deadline passes. A retry returns its retry count."""
    retries = self.request.retries
    record("start", tag=tag, task_id=self.request.id, retries=retries)
    if retries:
        return int(retries)
    lease = self.lease
    deadline = time.monotonic() + 30.0
    try:
        while not _journal.exists(f"paused:{tag}") and time.monotonic() < deadline:
            time.sleep(0.01)
        while lease.expires_in > 0.4:
            time.sleep(0.01)
        record("retrying", tag=tag, expires_in=lease.expires_in)
        raise self.retry(countdown=0.1)
    except LeaseLost as exc:
        record("raised", tag=tag, cause=exc.cause)
        raise


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="requeue_late",  # type: ignore[untyped-decorator]
    lease_key=("tag",),
)
def requeue_late(self: Any, tag: str, step: int = 0) -> int:
    """Step 0: as :func:`retry_late`, but publishes step 1 of its own key (a self-requeue)
    instead of a retry, and records whether that publish returned or raised."""
    record("start", tag=tag, task_id=self.request.id, step=step)
    if step:
        return step
    lease = self.lease
    deadline = time.monotonic() + 30.0
    while not _journal.exists(f"paused:{tag}") and time.monotonic() < deadline:
        time.sleep(0.01)
    while lease.expires_in > 0.4:
        time.sleep(0.01)
    record("requeueing", tag=tag, expires_in=lease.expires_in)
    try:
        successor = self.delay(tag, 1)
    except LeaseLost as exc:
        record("raised", tag=tag, cause=exc.cause)
        raise
    record("requeued", tag=tag, task_id=successor.id)
    return step
