"""The comparison's Celery app: one job, guarded three ways (celery-lease, celery-once,
celery-singleton), each with a short lifetime (``CMP_LOCK`` float seconds) and with the
library's defaults.

Every job appends ``start``/``step``/``end``/``lost`` events to ``<CMP_PREFIX>events``.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

import redis
from celery import Celery, Task
from celery_once import QueueOnce
from celery_singleton import Singleton

from celery_lease import LeasedTask, LeaseLost

URL = os.environ.get("REDIS_URL", "redis://localhost:6379")
PREFIX = os.environ.get("CMP_PREFIX", "lease-cmp:")
#: The short lifetime given to all three libraries, float seconds.
LOCK = float(os.environ.get("CMP_LOCK", "2"))
WORKER = os.environ.get("DEMO_WORKER", "?")
EVENTS_KEY = PREFIX + "events"
STEP = 0.1  # float seconds per step of the job

app = Celery("compare", broker=URL, backend=URL)
app.conf.update(
    broker_transport_options={"global_keyprefix": PREFIX},
    result_backend_transport_options={"global_keyprefix": PREFIX},
    worker_prefetch_multiplier=1,
    lease_backend=URL,
    lease_key_prefix=PREFIX + "lease",
    ONCE={
        "backend": "celery_once.backends.Redis",
        "settings": {"url": URL, "default_timeout": 60 * 60},
    },
    singleton_backend_url=URL,
    singleton_key_prefix=PREFIX + "singleton:",
)


@functools.lru_cache(maxsize=1)
def _client() -> redis.Redis:
    return redis.Redis.from_url(URL, socket_timeout=2.0)


def record(event: str, lib: str, job_id: str, **fields: Any) -> None:
    """Append one event for the orchestrator."""
    payload = {
        "t": time.time(),
        "w": WORKER,
        "pid": os.getpid(),
        "ev": event,
        "lib": lib,
        "job": job_id,
        **fields,
    }
    try:
        _client().rpush(EVENTS_KEY, json.dumps(payload))
    except redis.RedisError:
        pass


def work(lib: str, job_id: str, seconds: float) -> int:
    """Run ``seconds`` of steps of :data:`STEP`, reporting each; returns the steps done."""
    record("start", lib, job_id)
    done = 0
    try:
        for _ in range(max(1, round(seconds / STEP))):
            time.sleep(STEP)
            done += 1
            record("step", lib, job_id, step=done)
    except LeaseLost as exc:
        record("lost", lib, job_id, cause=exc.cause)
        raise
    record("end", lib, job_id, done=done)
    return done


def _task(lib: str, name: str, base: type[Task], **options: Any) -> Any:
    def job(job_id: str, seconds: float) -> int:
        return work(lib, job_id, seconds)

    job.__name__ = job.__qualname__ = name.replace(".", "_")
    return app.task(base=base, name=name, **options)(job)


#: ``(library, variant) -> task``; variant ``"short"`` uses :data:`LOCK`, ``"default"`` the
#: library's own defaults (celery-lease 30 s, celery-once 3600 s, celery-singleton none).
TASKS = {
    ("celery-lease", "short"): _task(
        "celery-lease", "cmp.lease", LeasedTask, lease_ttl=LOCK, lease_key=("job_id",)
    ),
    ("celery-lease", "default"): _task(
        "celery-lease", "cmp.lease_default", LeasedTask, lease_key=("job_id",)
    ),
    ("celery-once", "short"): _task(
        "celery-once",
        "cmp.once",
        QueueOnce,
        once={"graceful": True, "keys": ["job_id"], "timeout": LOCK},
    ),
    ("celery-once", "default"): _task(
        "celery-once", "cmp.once_default", QueueOnce, once={"graceful": True, "keys": ["job_id"]}
    ),
    ("celery-singleton", "short"): _task(
        "celery-singleton",
        "cmp.singleton",
        Singleton,
        unique_on=["job_id"],
        lock_expiry=max(1, round(LOCK)),
    ),
    ("celery-singleton", "default"): _task(
        "celery-singleton", "cmp.singleton_default", Singleton, unique_on=["job_id"]
    ),
}


def lock_key(lib: str, task: Any, job_id: str, seconds: float) -> str:
    """The Redis key each library keeps its lock in for this call."""
    args = (job_id, seconds)
    if lib == "celery-lease":
        return str(task.lease_key_for(args, {}))
    if lib == "celery-once":
        return str(task.get_key(args, {}))
    return str(task.generate_lock(task.name, args, {}))
