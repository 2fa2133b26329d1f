"""The Celery app the worker fault tests run: leased tasks that report what happens to them.

Configured from the environment: ``TEST_BROKER_URL`` (broker, result backend, and the
``journal`` list every task appends to), ``TEST_QUEUE``, ``LEASE_BACKEND`` (the lease store,
often a throwaway server the test pauses or restarts), ``LEASE_TTL`` and
``LEASE_STORE_OUTAGE_MAX`` (float seconds).

Every task appends JSON events to the Redis list ``journal`` on the broker's server (which
the tests never pause): ``start``, ``step``, ``lost`` (with the cause, the local deadline and
the clock at delivery), ``end``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import task_prerun

from celery_lease import LeasedTask, LeaseLost, current_lease
from celery_lease.base import clock, signals
from tests.support.workers import app_urls

BROKER, RESULTS, LEASES = app_urls()
TTL = float(os.environ.get("LEASE_TTL", "1.5"))

app = Celery("lease_app", broker=BROKER, backend=RESULTS)
app.conf.update(
    task_default_queue=os.environ.get("TEST_QUEUE", "celery"),
    lease_backend=LEASES,
    lease_backend_options=json.loads(os.environ.get("LEASE_BACKEND_OPTIONS", "null")),
    lease_ttl=TTL,
    lease_on_store_error=os.environ.get("LEASE_ON_STORE_ERROR", "retry"),
    lease_store_outage_max=float(os.environ.get("LEASE_STORE_OUTAGE_MAX", "300")),
    lease_require_noeviction=os.environ.get("LEASE_REQUIRE_NOEVICTION") == "1",
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    result_expires=600,
)

_journal = redis.Redis.from_url(RESULTS)
# A direct line to the lease store, when the worker reaches it through a proxy the test cuts:
# lets a task report what the server still holds at the moment it learns of a loss.
_direct = (
    redis.Redis.from_url(os.environ["LEASE_STORE_DIRECT"])
    if os.environ.get("LEASE_STORE_DIRECT")
    else None
)


def record(event: str, tag: str, **fields: Any) -> None:
    """Append one event to the journal (wall time, boot clock, pid, lease details)."""
    lease = current_lease()
    entry = {
        "event": event,
        "tag": tag,
        "t": time.time(),
        "clock": clock.now(),
        "pid": os.getpid(),
        **fields,
    }
    if lease is not None:
        entry.update(
            key=lease.key, fence=lease.fencing_token, token=lease.token, deadline=lease.deadline
        )
    _journal.rpush("journal", json.dumps(entry))


@app.task(shared=False, bind=True, base=LeasedTask, name="hold", lease_key=("tag",))
def hold(self: Any, tag: str, seconds: float = 30.0, mode: str = "sleep") -> str:
    """Hold the lease for ``seconds``: one long ``sleep``, short ``chunks``, or a ``busy`` loop.

    ``chunks`` and ``busy`` call ``lease.check()`` before each step, as a task that makes
    outside effects should.
    """
    record("start", tag)
    try:
        if mode == "sleep":
            time.sleep(seconds)
            record("step", tag)
        else:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if mode == "chunks":
                    time.sleep(0.02)
                self.lease.check()
                record("step", tag) if mode == "chunks" else None
    except LeaseLost as exc:
        server_pttl = _direct.pttl(exc.key) if _direct is not None else None
        record(
            "lost",
            tag,
            cause=exc.cause,
            late=exc.late,
            at=clock.now(),
            is_soft_limit=isinstance(exc, SoftTimeLimitExceeded),
            server_pttl=server_pttl,
        )
        raise
    record("end", tag)
    return tag


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="durable",
    lease_key=("tag",),
    acks_late=True,
    reject_on_worker_lost=True,
)
def durable(self: Any, tag: str, seconds: float) -> str:
    """An acks_late task whose message comes back when its worker process dies."""
    record("start", tag)
    time.sleep(seconds)
    record("end", tag)
    return tag


@app.task(
    shared=False, bind=True, base=LeasedTask, name="quiet", lease_key=("tag",), ignore_result=True
)
def quiet(self: Any, tag: str, seconds: float) -> None:
    """A task whose result is never stored: nothing in the backend says it finished."""
    record("start", tag)
    time.sleep(seconds)
    record("end", tag)


@app.task(shared=False, bind=True, base=LeasedTask, name="requeue_json", lease_key=("mapping",))
def requeue_json(self: Any, mapping: dict[Any, Any], times: int) -> int:
    """Requeue itself with an argument JSON changes on the way ({1: "a"} arrives as {"1": ...})."""
    record("start", "rqj", times=times)
    if times > 0:
        requeue_json.delay({1: "a"}, times - 1)
    record("end", "rqj", times=times)
    return times


@app.task(shared=False, bind=True, base=LeasedTask, name="green_cpu", lease_key=("tag",))
def green_cpu(self: Any, tag: str, seconds: float) -> str:
    """Spin without yielding (starves a green heartbeat), then look at the lease."""
    record("start", tag)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    try:
        self.lease.check()
    except LeaseLost as exc:
        record("lost", tag, cause=exc.cause, at=clock.now())
        raise
    record("end", tag)
    return tag


@app.task(shared=False, bind=True, base=LeasedTask, name="spin", lease_key=("tag",))
def spin(self: Any, tag: str, seconds: float) -> str:
    """Count in a pure-Python ``while`` loop that never looks at the lease, inside its own
    ``try``: the loss lands at the inner loop's backward jump nearly every time."""
    record("start", tag)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            count = 0
            while count < 100_000:
                count += 1
    except LeaseLost as exc:
        record("lost", tag, cause=exc.cause, at=clock.now())
        raise
    record("end", tag)
    return tag


@app.task(shared=False, bind=True, base=LeasedTask, name="retry_once", lease_key=("tag",))
def retry_once(self: Any, tag: str) -> str:
    """Retry itself once with ``countdown=0``."""
    record("start", tag, retries=self.request.retries)
    if self.request.retries == 0:
        raise self.retry(countdown=0)
    record("end", tag)
    return tag


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="always_fails",
    lease_key=("tag",),
    autoretry_for=(ValueError,),
    max_retries=2,
    default_retry_delay=0,
)
def always_fails(self: Any, tag: str) -> None:
    """Fail every attempt; autoretry gives up after two retries."""
    record("start", tag, retries=self.request.retries)
    raise ValueError(tag)


@app.task(shared=False, bind=True, base=LeasedTask, name="requeue", lease_key=("tag",))
def requeue(self: Any, tag: str, times: int) -> int:
    """Enqueue itself with the same key at the end of its body."""
    record("start", tag, times=times)
    time.sleep(0.3)
    if times > 0:
        requeue.delay(tag, times - 1)
    record("end", tag, times=times)
    return times


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="limited",
    lease_key=("tag",),
    time_limit=1.0,
    lease_ttl=0.6,
)
def limited(self: Any, tag: str, seconds: float) -> None:
    """Overrun a hard time limit."""
    record("start", tag)
    time.sleep(seconds)
    record("end", tag)


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="fail_on_conflict",
    lease_key=("tag",),
    lease_on_conflict="fail",
)
def fail_on_conflict(self: Any, tag: str, seconds: float = 0.0) -> str:
    """Conflict policy ``fail``."""
    record("start", tag)
    time.sleep(seconds)
    return tag


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="retry_on_conflict",
    lease_key=("tag",),
    lease_on_conflict="retry",
    max_retries=20,
)
def retry_on_conflict(self: Any, tag: str, seconds: float = 0.0) -> str:
    """Conflict policy ``retry``."""
    record("start", tag, retries=self.request.retries)
    time.sleep(seconds)
    record("end", tag)
    return tag


@signals.lease_conflict.connect
def _on_conflict(sender: Any, key: str, policy: str, holder_task_id: str, **_: Any) -> None:
    _journal.rpush(
        "journal",
        json.dumps(
            {
                "event": "conflict-signal",
                "key": key,
                "policy": policy,
                "holder_task_id": holder_task_id,
            }
        ),
    )


@signals.lease_lost.connect
def _on_lost(sender: Any, key: str, cause: str, **_: Any) -> None:
    _journal.rpush("journal", json.dumps({"event": "lost-signal", "key": key, "cause": cause}))


@app.task(base=LeasedTask, name="echo", lease_key=("tag",))
def echo(tag: str, i: int) -> int:
    """The shortest leased execution: returns ``i`` (a skipped duplicate returns a marker)."""
    return i


if os.environ.get("KILL_AFTER_RELEASE_WRITE") == "1":
    # The process dies the moment a release is handed to its socket: before the reply is
    # read, before the result is stored.
    import signal as _signal

    from celery_lease.store import pending as _pending

    _write = _pending.write

    def _write_then_die(*args: Any, **kwargs: Any) -> Any:
        _write(*args, **kwargs)
        os.kill(os.getpid(), _signal.SIGKILL)

    _pending.write = _write_then_die  # type: ignore[assignment]


@app.task(
    shared=False, bind=True, base=LeasedTask, name="one_retry", lease_key=("tag",), max_retries=1
)
def one_retry(self: Any, tag: str) -> int:
    """A task Celery retries once at most; returns the retries it ran after."""
    record("start", tag, retries=self.request.retries)
    return int(self.request.retries)


@app.task(
    shared=False,
    bind=True,
    base=LeasedTask,
    name="short_outage",
    lease_key=("tag",),
    lease_store_outage_max=1.5,
)
def short_outage(self: Any, tag: str) -> None:
    """Waits out a store outage of 1.5 s at most."""
    record("start", tag)


# --- the acquire written as the pool accepts the request (celery_lease.execution.accepted)
# ----------------


class _RefusedBeforeStart(LeasedTask):  # type: ignore[misc]
    """``at_prerun``'s class: its ``before_start`` hook (run by Celery's tracer after
    ``task_prerun``, before the task) fails a request whose tag starts with ``fail-``."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        if str(args[0]).startswith("fail-"):
            raise RuntimeError("before_start refused the request")


@app.task(base=_RefusedBeforeStart, name="at_prerun", lease_key=("tag",))
def at_prerun(tag: str) -> str:
    """Records its own start; the ``task_prerun`` receiver below records the store's state."""
    record("start", tag)
    return tag


@task_prerun.connect
def _record_prerun(sender: Any = None, task_id: str = "", args: Any = (), **_: Any) -> None:
    """For ``at_prerun``: whether the store holds the task's lease key for this execution's
    task id before the task runs (asked for up to a second: the grant's reply may still be on
    its way)."""
    if getattr(sender, "name", None) != "at_prerun":
        return
    tag = str(args[0])
    key = sender.lease_key_for((tag,))
    store = redis.Redis.from_url(LEASES)  # a plain URL here
    deadline = time.monotonic() + 1.0
    held_by = None
    while held_by is None and time.monotonic() < deadline:
        raw = store.get(key)
        held_by = json.loads(raw.decode().split(":", 2)[2])["id"] if raw else None
        if held_by is None:
            time.sleep(0.01)
    record("prerun", tag, held_by=held_by, task_id=task_id, key=key)


if os.environ.get("LEASE_APP_SWEEP") == "1":  # a task that hands over: the worker sweeps

    @app.task(
        shared=False,
        bind=True,
        base=LeasedTask,
        name="coalesced",
        lease_key=("tag",),
        lease_on_conflict="coalesce",
    )
    def coalesced(self: Any, tag: str) -> None:
        """Gives the worker the hand-over sweep thread (``lease_on_conflict="coalesce"``)."""
        record("start", tag)
