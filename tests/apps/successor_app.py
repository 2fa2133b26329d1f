"""Leased tasks that publish their own successor (a self-requeue, a replacement, a retry),
run the same way by a real worker and in eager mode (``tests/test_eager.py``).

Configured from ``TEST_BROKER_URL`` / ``TEST_RESULT_BACKEND`` / ``TEST_QUEUE`` for a worker;
an in-process test calls :func:`configure` instead. Every run records ``start`` and ``end``
with its step and fencing token in the Redis list ``runs:<tag>``; the lease key is the tag,
so every step of one tag takes the same lease.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from celery_lease import LeasedTask, current_lease
from tests.support import runs as journal
from tests.support.workers import BROKER_URL_ENV, QUEUE_ENV, RESULT_BACKEND_ENV

BROKER = os.environ.get(BROKER_URL_ENV, "redis://127.0.0.1:1/0")

app = Celery(
    "successor_app",
    broker=BROKER,
    backend=os.environ.get(RESULT_BACKEND_ENV) or BROKER,
    set_as_current=False,
)
app.conf.update(
    task_default_queue=os.environ.get(QUEUE_ENV, "celery"),
    lease_backend=BROKER,
    lease_ttl=5.0,
    broker_connection_retry_on_startup=True,
    result_expires=300,
)


def configure(url: str, **conf: Any) -> None:
    """Point the app at ``url`` (broker, results, leases) before its first leased call."""
    app.conf.update(broker_url=url, result_backend=url, lease_backend=url, **conf)


def _record(tag: str, what: str, step: int) -> None:
    lease = current_lease()
    journal.record(
        app.conf.lease_backend,
        tag,
        what=what,
        step=step,
        fence=lease.fencing_token if lease else None,
    )


def runs(tag: str) -> list[dict[str, Any]]:
    """What the runs of ``tag`` recorded, in order."""
    return journal.read(app.conf.lease_backend, tag)


@app.task(shared=False, bind=True, base=LeasedTask, name="succ.requeue", lease_key=("tag",))
def requeue(self: Any, tag: str, step: int, last: int) -> int:
    """Runs ``step``, then publishes the next step (same key) until ``last``."""
    _record(tag, "start", step)
    if step < last:
        self.delay(tag, step + 1, last)
    _record(tag, "end", step)
    return step


@app.task(shared=False, bind=True, base=LeasedTask, name="succ.replace", lease_key=("tag",))
def replaced(self: Any, tag: str, step: int, last: int) -> str:
    """Replaces itself with the next step (same task, same key) until ``last``."""
    _record(tag, "start", step)
    _record(tag, "end", step)
    if step < last:
        return self.replace(replaced.s(tag, step + 1, last))  # type: ignore[no-any-return]
    return f"done at {step}"


@app.task(
    shared=False, bind=True, base=LeasedTask, name="succ.retry", lease_key=("tag",), max_retries=5
)
def retried(self: Any, tag: str, attempts: int) -> int:
    """Retries itself (same key) until it has run ``attempts`` times."""
    step = self.request.retries
    _record(tag, "start", step)
    _record(tag, "end", step)
    if step + 1 < attempts:
        raise self.retry(countdown=0)
    return int(step)


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="succ.wait",
    lease_key=("tag",),
    lease_on_conflict="retry",
    max_retries=3,
)
def waiting(self: Any, tag: str) -> int:
    """Retries while another execution holds the key (``lease_on_conflict="retry"``)."""
    step = self.request.retries
    _record(tag, "start", step)
    _record(tag, "end", step)
    return int(step)
