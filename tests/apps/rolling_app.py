"""Test app run by two versions of celery-lease at once (tests/test_rolling_upgrade.py).

It imports nothing from the repository but ``celery_lease`` itself, so the same file runs under
the previous landed version (a worker whose ``PYTHONPATH`` holds only this folder) and under
the current one. Configured from ``TEST_BROKER_URL`` (broker, results, lease store and
journal) and ``TEST_QUEUE``.

``rolling.step(tag)`` takes the lease of ``tag`` (``lease_on_conflict="skip"``) and records its
body in the ``journal`` list as JSON: token, key, fencing token, the times before the acquire
(``prerun``), at the body's start and at its end, the pid and node, the file ``celery_lease``
was imported from, and the lease value as stored while the body ran. Each conflict is
recorded in ``conflicts``: which version found it, and the holder it read.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import task_prerun

import celery_lease
from celery_lease import LeasedTask, signals  # documented paths: old versions have them too

BROKER = os.environ.get("TEST_BROKER_URL", "redis://127.0.0.1:1/0")

app = Celery("rolling_app", broker=BROKER, backend=BROKER)
app.conf.update(
    task_default_queue=os.environ.get("TEST_QUEUE", "celery"),
    broker_connection_retry_on_startup=True,
    result_expires=300,
    lease_backend=BROKER,
    lease_ttl=2.0,
)
_journal = redis.Redis.from_url(BROKER, socket_timeout=5)


@task_prerun.connect
def _before_acquire(task: Any = None, **_: Any) -> None:
    # Sent before the task is called, so before LeasedTask's acquire: a lower bound on the grant.
    task.request.rolling_prerun = time.time()


@signals.lease_conflict.connect
def _conflict(sender: Any = None, **found: Any) -> None:
    # Which version found whose lease: this one's file and the holder's task id, as parsed.
    _journal.rpush(
        "conflicts",
        json.dumps(
            {
                "library": celery_lease.__file__,
                "holder_task_id": found.get("holder_task_id"),
                "holder": found.get("holder"),
            }
        ),
    )


@app.task(shared=False, base=LeasedTask, bind=True, name="rolling.step", lease_key=("tag",))
def step(self: Any, tag: str) -> str:
    """Hold ``tag``'s lease for 20 to 80 ms and record the body in ``journal``."""
    start = time.time()
    stored = _journal.get(self.lease.key)
    time.sleep(random.uniform(0.02, 0.08))
    _journal.rpush(
        "journal",
        json.dumps(
            {
                "token": self.lease.token,
                "key": self.lease.key,
                "tag": tag,
                "fence": self.lease.fencing_token,
                "task_id": self.request.id,
                "prerun": getattr(self.request, "rolling_prerun", start),
                "start": start,
                "end": time.time(),
                "pid": os.getpid(),
                "node": self.request.hostname,
                "library": celery_lease.__file__,
                "value": stored.decode("utf-8", "replace") if stored else None,
            }
        ),
    )
    return tag
