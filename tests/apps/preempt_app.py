"""Leased tasks with ``lease_on_conflict="preempt"``, for ``tests/test_preempt.py`` and the
preemption benchmark, run by real workers.

Configured from ``TEST_BROKER_URL`` / ``TEST_RESULT_BACKEND`` / ``TEST_QUEUE``; with
``BEAT_PERIOD`` (float seconds), beat sends ``pre.work`` for the tag ``BEAT_TAG`` every period,
each send a run of its own name, holding its key far longer than the period. Every body
records, in the Redis list ``runs:<tag>``, its start (``"start"``, its fencing token), the
moment it caught ``LeaseLost`` (``"lost"``, its cause) and its end (``"end"``), and its
worker the execution's start before the lease is asked for (``"prerun"``); the newcomer's
process records the take-over (``"took_over"``, from the ``lease_preempted`` signal). Times are
``time.time()`` float seconds: the workers and the test share one machine. Each body makes a
fenced write (``example_project.fencing.RedisFencedStore``) at its start, and the preempted one
one more after the newcomer's, recording whether it was accepted.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import redis
from celery import Celery
from celery.beat import BeatLazyFunc
from celery.signals import task_prerun

from celery_lease import LeasedTask, LeaseLost, current_lease
from celery_lease.base import signals as lease_signals
from example_project.fencing import RedisFencedStore
from tests.support import runs as journal
from tests.support.workers import QUEUE_ENV, app_urls

BROKER, RESULTS, LEASES = app_urls()
#: ``pre.graceful``'s ``lease_preempt_grace``, float seconds.
GRACE = 4.0
#: A TTL whose renewal interval (10 s) is far longer than a prompt notice takes.
TTL = 30.0

app = Celery(
    "preempt_app",
    broker=BROKER,
    backend=RESULTS,
    set_as_current=False,
)
app.conf.update(
    task_default_queue=os.environ.get(QUEUE_ENV, "celery"),
    lease_backend=LEASES,
    lease_ttl=TTL,
    broker_connection_retry_on_startup=True,
    result_expires=300,
    worker_prefetch_multiplier=1,
)


def beat_run_name() -> str:
    """A name of its own for each run beat sends (drawn at each send)."""
    return f"beat-{uuid.uuid4().hex[:8]}"


if os.environ.get("BEAT_PERIOD"):
    app.conf.update(
        beat_max_loop_interval=1.0,
        beat_schedule={
            "replace": {
                "task": "pre.work",
                "schedule": float(os.environ["BEAT_PERIOD"]),
                "kwargs": {
                    "tag": os.environ.get("BEAT_TAG", "beat"),
                    "run": BeatLazyFunc(beat_run_name),
                },
            }
        },
    )


def _note(tag: str, what: str, **fields: Any) -> None:
    journal.record(app.conf.lease_backend, tag, what=what, at=time.time(), **fields)


def runs(tag: str) -> list[dict[str, Any]]:
    """What the executions of ``tag`` recorded, in order."""
    return journal.read(app.conf.lease_backend, tag)


@lease_signals.lease_preempted.connect  # type: ignore[untyped-decorator]
def _on_preempted(
    sender: Any = None,
    key: str = "",
    fencing_token: int = 0,
    preempted_fencing_token: int = 0,
    **_: Any,
) -> None:
    if not getattr(sender, "name", "").startswith("pre."):
        return  # in_process()'s task: its test reads what it recorded itself
    journal.record(
        app.conf.lease_backend,
        f"took-over:{key}",
        at=time.time(),
        fence=fencing_token,
        old=preempted_fencing_token,
    )


def took_over(key: str) -> list[dict[str, Any]]:
    """The take-overs of lease ``key``, in order."""
    return journal.read(app.conf.lease_backend, f"took-over:{key}")


@task_prerun.connect  # type: ignore[untyped-decorator]
def _on_prerun(sender: Any = None, args: Any = (), **_: Any) -> None:
    """The execution's start, before its lease is asked for: ``"prerun"``."""
    if getattr(sender, "name", "").startswith("pre.") and len(args) >= 2:
        _note(args[0], "prerun", run=args[1])


def _fenced() -> RedisFencedStore:
    return RedisFencedStore(redis.Redis.from_url(app.conf.lease_backend))


def _body(tag: str, run: str, hold: float, checkpoint: float, wait_for_newcomer: bool) -> str:
    lease = current_lease()
    assert lease is not None
    _fenced().write(tag, run, lease.fencing_token)  # first: "start" says it is written
    _note(tag, "start", run=run, fence=lease.fencing_token)
    try:
        deadline = time.time() + hold
        while time.time() < deadline:
            time.sleep(0.01)
    except LeaseLost as exc:
        _note(tag, "lost", run=run, cause=exc.cause)
        time.sleep(checkpoint)  # the checkpoint a grace leaves time for

        def newer() -> list[dict[str, Any]]:  # a newcomer's start: it has written
            return [
                r for r in runs(tag) if r["what"] == "start" and r["fence"] > lease.fencing_token
            ]

        while wait_for_newcomer and not newer() and time.time() < deadline:
            time.sleep(0.02)  # the newcomer writes first, then this late write
        accepted = _fenced().write(tag, f"late {run}", lease.fencing_token)
        _note(tag, "end", run=run, late_write_accepted=accepted)
        raise
    _note(tag, "end", run=run)
    return run


@app.task(
    shared=False, base=LeasedTask, name="pre.work", lease_key=("tag",), lease_on_conflict="preempt"
)
def work(tag: str, run: str, hold: float = 30.0, checkpoint: float = 0.0) -> str:
    """Holds ``tag`` for ``hold`` seconds unless preempted: then checkpoints ``checkpoint``
    seconds and, once the newcomer has written, makes a late write with its own token."""
    return _body(tag, run, hold, checkpoint, wait_for_newcomer=True)


@app.task(
    shared=False,
    base=LeasedTask,
    name="pre.graceful",
    lease_key=("tag",),
    lease_on_conflict="preempt",
    lease_preempt_grace=GRACE,
)
def graceful(tag: str, run: str, hold: float = 30.0, checkpoint: float = 0.0) -> str:
    """As :func:`work`, with a grace of :data:`GRACE` seconds for a preempted holder, whose
    late write does not wait for the newcomer (which waits for it)."""
    return _body(tag, run, hold, checkpoint, wait_for_newcomer=False)


@app.task(
    shared=False,
    base=LeasedTask,
    name="pre.deduped",
    lease_key=("tag",),
    lease_on_conflict="preempt",
    lease_dedupe=True,
)
def deduped(tag: str, run: str, hold: float = 30.0, checkpoint: float = 0.0) -> str:
    """As :func:`work`, with ``lease_dedupe``: a publish while a copy waits to start
    publishes nothing."""
    return _body(tag, run, hold, checkpoint, wait_for_newcomer=True)


def in_process(
    url: str, prefix: str, ttl: float = 30.0, grace: float = 0.0, old_hold: float = 30.0
) -> tuple[Any, list[tuple[str, str, float]]]:
    """A new app on lease store ``url`` (keys under ``prefix``, ``lease_ttl=ttl``) with one
    preempt task ``job(tag, run)`` (``lease_preempt_grace=grace``), called in the test's own
    process with ``apply()``: its ``"old"`` run holds ``tag`` until preempted (``old_hold``
    seconds at most), any other returns at once. Returns the task and what the runs did:
    ``(run, what, time.monotonic())``, ``what`` being ``"start"``, ``"lost <cause>"`` or
    ``"end"`` (the old run's body returned)."""
    in_app = Celery(f"preempt-{prefix}", broker="memory://", set_as_current=False)
    in_app.conf.update(lease_backend=url, lease_key_prefix=prefix, lease_ttl=ttl)
    seen: list[tuple[str, str, float]] = []

    @in_app.task(
        base=LeasedTask,
        shared=False,
        name="inproc.preempt",
        lease_key=("tag",),
        lease_on_conflict="preempt",
        lease_preempt_grace=grace,
    )
    def job(tag: str, run: str) -> str:
        seen.append((run, "start", time.monotonic()))
        try:
            deadline = time.monotonic() + (old_hold if run == "old" else 0.0)
            while time.monotonic() < deadline:
                time.sleep(0.01)
        except LeaseLost as exc:
            seen.append((run, f"lost {exc.cause}", time.monotonic()))
            raise
        seen.append((run, "end", time.monotonic()))
        return run

    in_app.finalize()
    return job, seen
