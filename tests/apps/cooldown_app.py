"""Leased tasks with a cooldown (``lease_cooldown``), for ``tests/test_cooldown.py``, run by a
real worker and in process (``apply()``, eager mode).

Configured from ``TEST_BROKER_URL`` / ``TEST_RESULT_BACKEND`` / ``TEST_QUEUE`` for a worker; an
in-process test calls :func:`configure` instead. Every run that starts pushes the store's
clock (float seconds since the epoch) and its fencing token to the Redis list ``runs:<tag>``;
the lease key is the tag.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from celery_lease import LeasedTask, current_lease
from tests.support import runs as journal
from tests.support.workers import QUEUE_ENV, app_urls, point_app

BROKER, RESULTS, LEASES = app_urls()
#: The cooldown of ``cool.once`` and ``cool.any``: long, so that a copy surely meets it.
LONG = 60.0
#: The cooldown of ``cool.retried``: short, so that its retry runs soon after.
SHORT = 1.5

app = Celery(
    "cooldown_app",
    broker=BROKER,
    backend=RESULTS,
    set_as_current=False,
)
app.conf.update(
    task_default_queue=os.environ.get(QUEUE_ENV, "celery"),
    lease_backend=LEASES,
    lease_ttl=5.0,
    broker_connection_retry_on_startup=True,
    result_expires=300,
)


def configure(url: str, **conf: Any) -> None:
    """Point the app at ``url`` (broker, results, leases; ``conf`` overrides any of them)
    before its first leased call."""
    point_app(app, **{"broker_url": url, "result_backend": url, "lease_backend": url, **conf})


def _record(tag: str) -> None:
    lease = current_lease()
    url = app.conf.lease_backend
    journal.record(
        url, tag, at=journal.store_time(url), fence=lease.fencing_token if lease else None
    )


def runs(tag: str) -> list[dict[str, Any]]:
    """What the runs of ``tag`` recorded, in order."""
    return journal.read(app.conf.lease_backend, tag)


def _run(tag: str, fail: bool = False) -> str:
    _record(tag)
    if fail:
        raise RuntimeError("failed on purpose")
    return "ran"


#: Runs once per :data:`LONG` after a success; ``fail``: raises instead.
once = app.task(
    shared=False, base=LeasedTask, name="cool.once", lease_key=("tag",), lease_cooldown=LONG
)(_run)
#: As :data:`once`, with a cooldown after a failure too.
any_ending = app.task(
    shared=False,
    base=LeasedTask,
    name="cool.any",
    lease_key=("tag",),
    lease_cooldown=LONG,
    lease_cooldown_after="any",
)(_run)


@app.task(
    shared=False,
    base=LeasedTask,
    name="cool.retried",
    lease_key=("tag",),
    lease_cooldown=SHORT,
    lease_on_conflict="retry",
    max_retries=20,
)
def retried(tag: str) -> str:
    """Runs once per :data:`SHORT`; a copy in the window retries once it is over."""
    _record(tag)
    return "ran"


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="cool.requeue",
    lease_key=("tag",),
    lease_cooldown=LONG,
)
def requeue(self: Any, tag: str) -> str:
    """Runs, then publishes itself for the same key (its result kept in :data:`published`): a
    copy that lands in its own cooldown."""
    _record(tag)
    published[tag] = self.delay(tag)
    return "ran"


#: Tag -> the result of the message ``cool.requeue`` published (eager mode: in process).
published: dict[str, Any] = {}
