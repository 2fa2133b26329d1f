"""Leased tasks that hand their key over (``coalesce``, ``queue``), for real workers and eager
calls (``tests/test_handoff.py``).

Configured from ``TEST_BROKER_URL`` / ``TEST_QUEUE`` (broker, results and leases on one
server), ``LEASE_TTL``, ``LEASE_QUEUE_MAX`` and ``LEASE_QUEUE_TIMEOUT`` for a worker; an
in-process test calls :func:`configure`. Every run records ``start`` and ``end`` with its
argument ``n``, its task id and the store's clock (``TIME``, float seconds) in the Redis list
``runs:<tag>``; every duplicate the worker parks records ``accepted`` the same way (from the
``lease_coalesced`` and ``lease_queued`` signals). The lease key is the tag.
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
from tests.support.workers import QUEUE_ENV, app_urls, point_app

BROKER, RESULTS, LEASES = app_urls()
_timeout = os.environ.get("LEASE_QUEUE_TIMEOUT")

app = Celery("handoff_app", broker=BROKER, backend=RESULTS, set_as_current=False)
app.conf.update(
    task_default_queue=os.environ.get(QUEUE_ENV, "celery"),
    lease_backend=LEASES,
    lease_ttl=float(os.environ.get("LEASE_TTL", "3.0")),
    lease_queue_max=int(os.environ.get("LEASE_QUEUE_MAX", "100")),
    lease_queue_timeout=float(_timeout) if _timeout else None,
    broker_connection_retry_on_startup=True,
    result_expires=300,
    worker_prefetch_multiplier=1,
)


def configure(url: str, **conf: Any) -> None:
    """Point the app at ``url`` (broker, results, leases; ``conf`` overrides any of them)
    before its first leased call."""
    point_app(app, **{"broker_url": url, "result_backend": url, "lease_backend": url, **conf})
    for task in (coalesced, queued, retried, queued_retrying):
        task.forget_lease_settings()


def _client() -> redis.Redis:
    return redis.Redis.from_url(app.conf.lease_backend)


def record(tag: str, what: str, n: Any, task_id: str) -> None:
    """Append one entry to ``runs:<tag>``, stamped with the store's clock."""
    client = _client()
    try:
        seconds, micros = client.time()
        client.rpush(
            f"runs:{tag}",
            json.dumps({"what": what, "n": n, "id": task_id, "t": seconds + micros / 1e6}),
        )
    finally:
        client.close()


def runs(tag: str) -> list[dict[str, Any]]:
    """What ``tag``'s runs and parked duplicates recorded, in order."""
    client = _client()
    try:
        return [json.loads(x) for x in client.lrange(f"runs:{tag}", 0, -1)]
    finally:
        client.close()


def _body(task: Any, tag: str, n: int, seconds: float) -> int:
    record(tag, "start", n, task.request.id)
    time.sleep(seconds)
    record(tag, "end", n, task.request.id)
    return n


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="ho.coalesced",
    lease_key=("tag",),
    lease_on_conflict="coalesce",
)
def coalesced(self: Any, tag: str, n: int, seconds: float = 0.0) -> int:
    """Runs for ``seconds`` and returns ``n``; duplicates coalesce into one pending run."""
    return _body(self, tag, n, seconds)


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="ho.queued",
    lease_key=("tag",),
    lease_on_conflict="queue",
)
def queued(self: Any, tag: str, n: int, seconds: float = 0.0) -> int:
    """Runs for ``seconds`` and returns ``n``; duplicates wait in the key's line."""
    return _body(self, tag, n, seconds)


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="ho.retried",
    lease_key=("tag",),
    lease_on_conflict="retry",
    max_retries=0,
)
def retried(self: Any, tag: str, n: int, seconds: float = 0.0) -> int:
    """Runs for ``seconds`` and returns ``n``; a duplicate retries once the holder is done
    (``max_retries=0``: waiting for the holder must use up none)."""
    return _body(self, tag, n, seconds)


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="ho.queued_retrying",
    lease_key=("tag",),
    lease_on_conflict="queue",
    max_retries=1,
)
def queued_retrying(self: Any, tag: str, n: int, seconds: float = 0.0) -> int:
    """As :func:`queued`, but for ``n > 0`` the first attempt ends in ``self.retry()``
    (countdown 0.2 s)."""
    _body(self, tag, n, seconds)
    if n > 0 and self.request.retries == 0:
        raise self.retry(countdown=0.2)
    return n


@signals.lease_coalesced.connect
@signals.lease_queued.connect
def _accepted(sender: Any = None, task_id: str = "", **kw: Any) -> None:
    request = sender.request
    tag = (request.kwargs or {}).get("tag") or request.args[0]
    n = (request.kwargs or {}).get("n", request.args[1] if len(request.args) > 1 else None)
    record(tag, "accepted", n, task_id)
