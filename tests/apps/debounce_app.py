"""A leased task with ``lease_debounce``, for real workers and eager calls
(``tests/test_debounce.py``).

Configured from ``TEST_BROKER_URL`` / ``TEST_QUEUE`` (broker, results and leases on one
server; ``LEASE_BACKEND``: a lease store of its own), ``LEASE_TTL``, ``LEASE_DEBOUNCE`` and
``LEASE_DEBOUNCE_MAX`` for a worker; an
in-process test calls :func:`configure`. Every run records ``start`` and ``end`` with its
argument ``n``, its task id and the store's clock (``TIME``, float seconds) in the Redis list
``runs:<tag>``. The lease key is the tag.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from celery_lease import LeasedTask
from tests.support import runs as journal
from tests.support.workers import QUEUE_ENV, app_urls, point_app

BROKER, RESULTS, LEASES = app_urls()

app = Celery("debounce_app", broker=BROKER, backend=RESULTS, set_as_current=False)
app.conf.update(
    task_default_queue=os.environ.get(QUEUE_ENV, "celery"),
    lease_backend=LEASES,
    lease_ttl=float(os.environ.get("LEASE_TTL", "2.0")),
    lease_debounce=float(os.environ.get("LEASE_DEBOUNCE", "0.5")),
    lease_debounce_max=float(os.environ.get("LEASE_DEBOUNCE_MAX", "2.0")),
    broker_connection_retry_on_startup=True,
    result_expires=300,
    worker_prefetch_multiplier=1,
)


def configure(url: str, **conf: Any) -> None:
    """Point the app at ``url`` (broker, results, leases; ``conf`` overrides any of them)
    before its first leased call."""
    point_app(app, **{"broker_url": url, "result_backend": url, "lease_backend": url, **conf})
    refresh.forget_lease_settings()


def record(tag: str, what: str, n: Any, task_id: str) -> None:
    """Append one entry to ``runs:<tag>``, stamped with the store's clock."""
    url = app.conf.lease_backend
    shown = n if isinstance(n, (int, str)) else repr(n)  # a list of UUIDs and dates: its repr
    journal.record(url, tag, what=what, n=shown, id=task_id, t=journal.store_time(url))


def runs(tag: str) -> list[dict[str, Any]]:
    """What ``tag``'s runs recorded, in order."""
    return journal.read(app.conf.lease_backend, tag)


@app.task(shared=False, bind=True, base=LeasedTask, name="db.refresh", lease_key=("tag",))
def refresh(self: Any, tag: str, n: int, seconds: float = 0.0) -> int:
    """Runs for ``seconds`` and returns ``n``; publishes of one tag are debounced."""
    record(tag, "start", n, self.request.id)
    time.sleep(seconds)
    record(tag, "end", n, self.request.id)
    return n
