"""Leased tasks with ``lease_dedupe``, run by a real worker (``tests/test_dedupe.py``).

Configured from ``TEST_BROKER_URL`` / ``TEST_RESULT_BACKEND`` / ``TEST_QUEUE`` for a worker;
the test's own process calls :func:`configure` for its client-side twin. Each run records
``start`` and ``end`` with its task id in the Redis list ``runs:<tag>``, and waits for the key
``gate:<tag>`` before it ends (so a test decides when a run is over).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from celery_lease import LeasedTask
from tests.support.workers import QUEUE_ENV, app_urls, point_app

BROKER, RESULTS, LEASES = app_urls()

app = Celery(
    "dedupe_app",
    broker=BROKER,
    backend=RESULTS,
    set_as_current=False,
)
app.conf.update(
    task_default_queue=os.environ.get(QUEUE_ENV, "celery"),
    lease_backend=LEASES,
    lease_ttl=5.0,
    lease_dedupe=True,
    broker_connection_retry_on_startup=True,
    result_expires=300,
    worker_prefetch_multiplier=1,
)


#: What a test may change besides the URLs, put back at every :func:`configure`: the app is
#: shared by the test modules of one pytest process (a Sentinel test's options must not reach
#: the next module's plain Redis).
DEFAULTS: dict[str, Any] = {
    "lease_backend_options": None,
    "lease_min_replicas": 0,
    "lease_on_store_error": "retry",
}


def configure(url: str, queue: str, **conf: Any) -> None:
    """Point the client-side twin at ``url`` (broker, results, leases) and ``queue``, with
    :data:`DEFAULTS` unless ``conf`` says otherwise."""
    point_app(
        app,
        **{
            "broker_url": url,
            "result_backend": url,
            "lease_backend": url,
            "task_default_queue": queue,
            **DEFAULTS,
            **conf,
        },
    )
    for task in app.tasks.values():
        if isinstance(task, LeasedTask):
            task.forget_lease_settings()


def _client() -> redis.Redis:
    return redis.Redis.from_url(app.conf.lease_backend)


def _record(tag: str, what: str, task_id: str, **extra: Any) -> None:
    with _client() as client:
        client.rpush(f"runs:{tag}", json.dumps({"what": what, "id": task_id, **extra}))


def runs(tag: str) -> list[dict[str, Any]]:
    """What the runs of ``tag`` recorded, in order."""
    with _client() as client:
        return [json.loads(x) for x in client.lrange(f"runs:{tag}", 0, -1)]


def open_gate(tag: str) -> None:
    """Let the runs of ``tag`` end."""
    with _client() as client:
        client.set(f"gate:{tag}", 1, ex=60)


def _wait_gate(tag: str) -> None:
    deadline = time.monotonic() + 30.0
    with _client() as client:
        while not client.exists(f"gate:{tag}") and time.monotonic() < deadline:
            time.sleep(0.02)


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="dedupe.sync",
    lease_key=("tag",),
    lease_on_conflict="retry",
)
def sync(self: Any, tag: str, n: int = 0) -> str:
    """Waits for ``gate:<tag>``, then answers which run served the call."""
    _record(tag, "start", self.request.id, n=n)
    _wait_gate(tag)
    _record(tag, "end", self.request.id)
    return f"run {self.request.id} (n={n})"


@app.task(shared=False, bind=True, base=LeasedTask, name="dedupe.skipping", lease_key=("tag",))
def skipping(self: Any, tag: str, n: int = 0) -> str:
    """As :func:`sync`, with the default ``lease_on_conflict="skip"``."""
    return sync.run(tag, n)  # type: ignore[no-any-return]


@app.task(shared=False, bind=True, base=LeasedTask, name="dedupe.requeue", lease_key=("tag",))
def requeue(self: Any, tag: str, step: int) -> int:
    """Step 0 publishes step 1 for its own key (a self-requeue), then waits for the gate."""
    _record(tag, "start", self.request.id, step=step)
    if step == 0:
        successor = self.delay(tag, 1)
        _record(tag, "requeued", successor.id, disposition=successor.lease_disposition)
        _wait_gate(tag)
    _record(tag, "end", self.request.id, step=step)
    return step
