"""The demo's job, and the events the workers report to the orchestrator.

Each worker process appends JSON events to the Redis list ``<DEMO_PREFIX>events``: what the
job body does (``start``, ``write``, ``stopped``, ``end``) and what celery-lease reports
through its signals (``acquired``, ``conflict``, ``lost``, ``released``). Every event carries
the wall-clock time, the worker letter (``DEMO_WORKER``), the pid and the lease key.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

import redis

from celery_lease import LeasedTask, LeaseLost, LostCause
from celery_lease.base import signals
from example_project.celery_app import app, redis_url
from example_project.demo.worker_app import PREFIX
from example_project.fencing import RedisFencedStore

#: This worker's letter, ``"A"`` or ``"B"`` (``"?"`` in the orchestrator).
WORKER = os.environ.get("DEMO_WORKER", "?")
#: The Redis list the events go to.
EVENTS_KEY = PREFIX + "events"


@functools.lru_cache(maxsize=1)
def _client() -> redis.Redis:
    return redis.Redis.from_url(redis_url(), socket_timeout=2.0, socket_connect_timeout=2.0)


def output_store() -> RedisFencedStore:
    """The downstream store the job writes its progress to, guarded by fencing tokens."""
    return RedisFencedStore(_client(), prefix=PREFIX + "out")


def record(event: str, **fields: Any) -> None:
    """Append one event for the orchestrator; never raises (a lost event is not a failure)."""
    payload = {"t": time.time(), "w": WORKER, "pid": os.getpid(), "ev": event, **fields}
    try:
        _client().rpush(EVENTS_KEY, json.dumps(payload, default=str))
    except redis.RedisError:
        pass


def job_key(job_id: str, *args: Any, **kwargs: Any) -> str:
    """The lease key of a job: its id alone, whichever task runs it (a ``lease_key`` callable)."""
    return f"demo-job:{job_id}"


def _run(task: LeasedTask, job_id: str, steps: int, step_seconds: float) -> dict[str, Any]:
    lease = task.lease
    assert lease is not None  # always set inside a leased execution
    key, fence = lease.key, lease.fencing_token
    out = output_store()
    record("start", key=key, fence=fence, steps=steps, task_id=task.request.id)
    done = 0
    try:
        for step in range(1, steps + 1):
            time.sleep(step_seconds)  # the work of one step
            accepted = out.write(job_id, f"{WORKER}: step {step}", fence)
            record("write", key=key, fence=fence, step=step, accepted=accepted)
            if not accepted:  # a later holder has written: we are not the holder any more
                lease.check()
                raise LeaseLost(key, LostCause.REFUSED, fence, 0.0)
            done = step
    except LeaseLost as exc:
        saved = out.write(job_id, f"{WORKER}: checkpoint after step {done}", fence)
        record(
            "stopped",
            key=key,
            fence=fence,
            cause=exc.cause,
            late=exc.late,
            done=done,
            checkpoint_accepted=saved,
        )
        raise
    record("end", key=key, fence=fence, done=done)
    return {"worker": WORKER, "done": done, "fencing_token": fence}


@app.task(base=LeasedTask, bind=True, name="demo.job", lease_key=job_key)  # type: ignore[untyped-decorator]
def job(self: LeasedTask, job_id: str, steps: int, step_seconds: float) -> dict[str, Any]:
    """Run ``steps`` steps of ``step_seconds`` (float seconds), writing each through the guard.

    A duplicate that finds the lease held is skipped (the app's ``lease_on_conflict="skip"``).
    """
    return _run(self, job_id, steps, step_seconds)


@app.task(
    base=LeasedTask,
    bind=True,
    name="demo.job_retry",
    lease_key=job_key,  # type: ignore[untyped-decorator]
    lease_on_conflict="retry",
    max_retries=50,
)
def job_retry(self: LeasedTask, job_id: str, steps: int, step_seconds: float) -> dict[str, Any]:
    """The same job (same lease key), but a conflict retries when the holder's lease would end."""
    return _run(self, job_id, steps, step_seconds)


# -- what celery-lease reports through its signals ----------------------------------------------


@signals.lease_acquired.connect  # type: ignore[untyped-decorator]
def _on_acquired(sender: Any = None, **kw: Any) -> None:
    # Timed when the claim was sent, not when this line runs: the store granted it before any
    # duplicate could be refused, so the claim row sorts before the "skipped" rows.
    sent = time.time() - float(kw.get("latency") or 0.0)
    record(
        "acquired",
        key=kw.get("key"),
        fence=kw.get("fencing_token"),
        task_id=kw.get("task_id"),
        t=sent,
    )


@signals.lease_conflict.connect  # type: ignore[untyped-decorator]
def _on_conflict(sender: Any = None, **kw: Any) -> None:
    record(
        "conflict",
        key=kw.get("key"),
        policy=kw.get("policy"),
        holder=kw.get("holder"),
        remaining=kw.get("remaining"),
        holder_fence=kw.get("fencing_token"),
        task_id=kw.get("task_id"),
    )


@signals.lease_lost.connect  # type: ignore[untyped-decorator]
def _on_lost(sender: Any = None, **kw: Any) -> None:
    record(
        "lost",
        key=kw.get("key"),
        fence=kw.get("fencing_token"),
        cause=kw.get("cause"),
        late=kw.get("late"),
    )


@signals.lease_released.connect  # type: ignore[untyped-decorator]
def _on_released(sender: Any = None, **kw: Any) -> None:
    record(
        "released",
        key=kw.get("key"),
        fence=kw.get("fencing_token"),
        released=kw.get("released"),
        held=kw.get("held"),
        task_id=kw.get("task_id"),
    )
