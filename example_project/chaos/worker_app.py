"""The app the campaign's workers run, and its one leased job, which records its own history.

Configured from the environment the campaign sets (``CHAOS_BROKER_URL``: the broker, never
faulted; ``CHAOS_RESULT_URL``: the result backend, never faulted; ``CHAOS_QUEUE``: the run's
queue; ``CHAOS_LEASE_URL``: the lease store, reached through the nemesis' proxy;
``CHAOS_DSN``: the run's PostgreSQL database; ``CHAOS_TTL``: the lease TTL in float
seconds; ``CHAOS_COOLDOWN``: the job's ``lease_cooldown`` in float seconds (0 or unset: none);
``CHAOS_PREEMPT_GRACE``: the preempt job's ``lease_preempt_grace``, float seconds;
``CHAOS_LEASE_OPTIONS``: ``lease_backend_options`` as JSON, e.g. the Sentinel
``master_name``; ``CHAOS_BEAT_KEYS``, ``CHAOS_BEAT_PERIOD``: the keys beat sends the job for,
comma-separated, every that many float seconds; ``CHAOS_LIMIT``: the ``lease_limit`` of the
limited job, an int, 0 or unset: no limited job). The job uses the public API of
celery-lease (``LeasedTask``, ``self.lease``, ``LeaseLost``, the signals) and one private
switch: it waits for its release's reply (``_lease_release_wait``), see :class:`ChaosJob`.

Messages are acknowledged after the execution (``acks_late``) and given back when a worker
dies, so a SIGKILLed worker's jobs are redelivered, with RabbitMQ at once (while the dead
holder's lease may still be live: the lease's redelivery path, exercised on purpose).
"""

from __future__ import annotations

import functools
import json
import os
import time
import uuid
from typing import Any

from celery import Celery
from celery.beat import BeatLazyFunc
from celery.signals import before_task_publish, task_prerun

from celery_lease import Lease, LeasedTask, LeaseLost
from celery_lease.base import signals as lease_signals

from .db import Recorder
from .history import Execution, Job, Parked, Preemption

#: Name of the job task (the producer sends it by name too).
JOB_TASK = "example_project.chaos.worker_app.chaos_job"
#: The same job with ``lease_dedupe`` (its own keys: a lease key holds the task name).
DEDUPE_TASK = "example_project.chaos.worker_app.chaos_dedupe_job"
#: ``lease_dedupe_ttl`` of the dedupe job, float seconds: a waiting copy's claim lapses then.
DEDUPE_TTL = 10.0
#: The same job with ``lease_debounce`` (keys ``b0``...): a burst of publishes runs once.
DEBOUNCE_TASK = "example_project.chaos.worker_app.chaos_debounce_job"
#: ``lease_debounce`` and ``lease_debounce_max`` of the debounce job, float seconds.
DEBOUNCE_DELAY, DEBOUNCE_CAP = 0.5, 2.0
#: The same job with ``lease_on_conflict`` ``"coalesce"`` and ``"queue"`` (submission paths
#: of those names): a duplicate is parked in its key's line and handed the key later.
HANDOFF_TASKS = {
    "coalesce": "example_project.chaos.worker_app.chaos_coalesce",
    "queue": "example_project.chaos.worker_app.chaos_queue",
}
#: The same job with ``lease_on_conflict="preempt"`` (submission path ``preempt``, keys of its
#: own): a copy that starts while the key is held takes it over, newest wins.
PREEMPT_TASK = "example_project.chaos.worker_app.chaos_preempt"
#: The same job with ``lease_limit`` (``CHAOS_LIMIT`` executions per key at once; the
#: ``limited`` submission path, keys of its own; ``lease_on_conflict="queue"``: a copy that
#: finds all N slots held waits in the key's line): it makes no fenced writes (N holders share
#: the key by design); the checker holds it to "never more than N" instead.
LIMITED_TASK = "example_project.chaos.worker_app.chaos_limited"
LIMIT = int(os.environ.get("CHAOS_LIMIT") or 0)
#: Prefix of every lease key of a campaign (the leak check scans it).
LEASE_PREFIX = "chaos-lease"
#: Visibility timeout of a Redis broker (float seconds): a dead worker's message comes back
#: after it.
VISIBILITY_TIMEOUT = 15.0

BROKER_URL = os.environ.get("CHAOS_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
RESULT_URL = os.environ.get("CHAOS_RESULT_URL", "redis://127.0.0.1:6379/0")

app = Celery("chaos", broker=BROKER_URL, backend=RESULT_URL, set_as_current=False)
app.conf.update(
    task_default_queue=os.environ.get("CHAOS_QUEUE", "celery"),
    lease_backend=os.environ.get("CHAOS_LEASE_URL", RESULT_URL),
    lease_backend_options=json.loads(os.environ.get("CHAOS_LEASE_OPTIONS") or "{}"),
    lease_ttl=float(os.environ.get("CHAOS_TTL", "3.0")),
    lease_store_timeout=float(os.environ.get("CHAOS_STORE_TIMEOUT", "0.5")),
    lease_key_prefix=LEASE_PREFIX,
    lease_on_conflict="skip",
    lease_cooldown=float(os.environ.get("CHAOS_COOLDOWN") or 0) or None,
    lease_require_noeviction=False,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={
        "visibility_timeout": VISIBILITY_TIMEOUT,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
    if BROKER_URL.startswith("redis")
    else {},
    result_expires=3600,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
)


def _beat_job_id() -> str:
    return uuid.uuid4().hex


# Beat's entries: the job on a few keys. The job id is drawn per tick (a ``BeatLazyFunc`` is
# called at each send), and the send is recorded by ``_record_beat_send`` below.
app.conf.beat_schedule = {
    f"chaos-{key}": {
        "task": JOB_TASK,
        "schedule": float(os.environ.get("CHAOS_BEAT_PERIOD", 2)),
        "kwargs": {"key": key, "job": BeatLazyFunc(_beat_job_id), "writes": 3},
    }
    for key in filter(None, os.environ.get("CHAOS_BEAT_KEYS", "").split(","))
}
# Sends already recorded by this process: a retry of a beat job keeps Celery's beat header.
_beat_sent: set[str] = set()

# Times noted by receivers that must return at once (the heartbeat's), or that run before the
# body exists (``task_prerun``, before the lease is requested): the body records them.
_before_acquire: dict[str, float] = {}
_lost_at: dict[str, float] = {}


@task_prerun.connect  # type: ignore[untyped-decorator]
def _on_prerun(task_id: str = "", **_: Any) -> None:
    _before_acquire[task_id] = time.time()  # the acquire is sent after this


@before_task_publish.connect  # type: ignore[untyped-decorator]
def _record_beat_send(sender: str = "", body: Any = None, headers: Any = None, **_: Any) -> None:
    """Record a job beat sends, as :func:`submit` records the producer's: before it is sent.

    Beat marks its sends with the ``celery_beat_task`` header; the job id in the kwargs is
    this tick's own (drawn by the entry's ``BeatLazyFunc``), and the headers carry the task
    id. Celery logs and swallows a receiver's error and sends anyway: a send whose record
    failed (twice: the recorder tries once more) is in the beat's log, not in the history.
    """
    headers = headers or {}
    if sender != JOB_TASK or not headers.get("celery_beat_task") or headers.get("retries"):
        return
    kwargs = body[1] if isinstance(body, (tuple, list)) else {}
    if kwargs.get("job") in _beat_sent:
        return
    recorder().job_submitted(
        Job(
            job=kwargs["job"],
            key=kwargs["key"],
            path="beat",
            task_id=headers["id"],
            submitted_at=time.time(),
        )
    )
    _beat_sent.add(kwargs["job"])


def _record_park(
    sender: Any = None, key: str = "", task_id: str = "", into: str = "", **_: Any
) -> None:
    """Record a parked duplicate (coalesce: ``into`` is its pending run; queue: itself)."""
    kind = "coalesce" if into else "queue"
    request = getattr(sender, "request", None)
    job_key = (getattr(request, "kwargs", None) or {}).get("key", key)
    recorder().duplicate_parked(
        Parked(
            task_id=task_id,
            key=job_key,
            kind=kind,
            into=into or task_id,
            lower=_before_acquire.pop(task_id, 0.0),
            upper=time.time(),
        )
    )


lease_signals.lease_coalesced.connect(_record_park, weak=False)
lease_signals.lease_queued.connect(_record_park, weak=False)


@lease_signals.lease_preempted.connect  # type: ignore[untyped-decorator]
def _record_preempted(
    sender: Any = None, token: str = "", preempted_token: str = "", notified: int = 0, **_: Any
) -> None:
    """Record a take-over, once the newcomer holds the key (before its body runs)."""
    request = getattr(sender, "request", None)
    key = (getattr(request, "kwargs", None) or {}).get("key", "")
    recorder().preempted(Preemption(token, preempted_token, key, time.time(), notified))


@lease_signals.lease_lost.connect  # type: ignore[untyped-decorator]
def _on_lost(sender: Any = None, token: str = "", **_: Any) -> None:
    _lost_at.setdefault(token, time.time())


@lease_signals.lease_released.connect  # type: ignore[untyped-decorator]
def _on_released(
    sender: Any = None, token: str = "", released: bool | None = None, **_: Any
) -> None:
    _lost_at.pop(token, None)
    if getattr(sender, "name", None) in (
        JOB_TASK,
        DEDUPE_TASK,
        DEBOUNCE_TASK,
        PREEMPT_TASK,
        LIMITED_TASK,
        *HANDOFF_TASKS.values(),
    ):
        # None (the release's reply is read later, off the execution's path) says nothing:
        # recorded as None, never as False ("the store no longer had the token").
        recorder().execution_released(token, released)


def confirmed_since(lease: Lease) -> float | None:
    """A wall time at or before the send of the lease's last confirmed renewal (or grant).

    ``expires_in`` counts down to that send time + TTL - a drift margin, so ``now +
    expires_in - ttl`` can only fall early (by the margin, or by a pause between the two
    reads), never late: the checker may conclude from it that the store still had this
    lease after that time. ``None`` once the lease is lost.
    """
    now = time.time()
    left = lease.expires_in
    return now + left - lease.ttl if left > 0 else None


@functools.lru_cache(maxsize=1)
def recorder() -> Recorder:
    """This process's history writer (on ``CHAOS_DSN``)."""
    return Recorder(os.environ["CHAOS_DSN"])


def submit(
    key: str,
    path: str,
    writes: int = 3,
    step: float = 0.3,
    mode: str = "plain",
    parent: str | None = None,
    by_name: bool = False,
    dedupe: bool = False,
) -> Job:
    """Record a job, then send it (``chaos_job.apply_async``, or ``send_task`` by name; with
    ``dedupe``, ``chaos_dedupe_job.apply_async``, whose decision is recorded as well; the
    path ``debounce``: ``chaos_debounce_job.apply_async``, recorded the same way).

    Sent from inside a running job of the same key (a self-requeue), ``apply_async`` marks the
    message as the holder's successor, which celery-lease runs once the holder has ended.
    """
    job = Job(
        job=uuid.uuid4().hex, key=key, path=path, task_id=uuid.uuid4().hex, submitted_at=time.time()
    )
    recorder().job_submitted(job, parent)
    kwargs = {"key": key, "job": job.job, "writes": writes, "step": step, "mode": mode}
    try:
        if by_name:
            app.send_task(JOB_TASK, kwargs=kwargs, task_id=job.task_id)
        elif dedupe or path == "debounce":
            lower = time.time()
            task = chaos_dedupe_job if dedupe else chaos_debounce_job
            result = task.apply_async(kwargs=kwargs, task_id=job.task_id)
            recorder().job_published(
                job.job, result.lease_disposition, result.id, lower, time.time()
            )
        elif path == "preempt":
            chaos_preempt.apply_async(kwargs=kwargs, task_id=job.task_id)
        elif path == "limited":
            app.tasks[LIMITED_TASK].apply_async(kwargs=kwargs, task_id=job.task_id)
        elif path in HANDOFF_TASKS:
            app.tasks[HANDOFF_TASKS[path]].apply_async(kwargs=kwargs, task_id=job.task_id)
        else:
            chaos_job.apply_async(kwargs=kwargs, task_id=job.task_id)
    except BaseException:
        # The send raised (a requeue whose body lost its lease mid-publish: LeaseLost): the
        # caller was told, so the job is no promise; an execution of it, if the message went
        # out after all, is still checked like any other.
        recorder().job_unsent(job.job)
        raise
    return job


class ChaosJob(LeasedTask):
    """The job's base: a ``LeasedTask`` that waits for its release's reply.

    By default a standalone Redis release is written and its reply read later, and
    ``lease_released`` says ``released=None``; a release that found the key gone (the lease
    was lost after the body's last renewal) is then only an INFO log line. Property 3 of the
    checker needs the library's word on it, so the job waits for the reply, as the library
    does on Sentinel and Cluster. (Recorded as None, those executions are silent losers: see
    docs/chaos.md, "What the runs found".)
    """

    _lease_release_wait = True


@app.task(
    base=ChaosJob,
    bind=True,
    lease_key=("key",),
    name=JOB_TASK,  # type: ignore[untyped-decorator]
    max_retries=3,
)
def chaos_job(
    self: LeasedTask, key: str, job: str, writes: int = 3, step: float = 0.3, mode: str = "plain"
) -> dict[str, Any]:
    """The job (:func:`run_job`)."""
    return run_job(self, key, job, writes, step, mode)


@app.task(
    base=ChaosJob,
    bind=True,
    lease_key=("key",),
    name=DEDUPE_TASK,  # type: ignore[untyped-decorator]
    max_retries=3,
    lease_dedupe=True,
    lease_dedupe_ttl=DEDUPE_TTL,
    lease_min_replicas=int(os.environ.get("CHAOS_DEDUPE_MIN_REPLICAS") or 0),
)
def chaos_dedupe_job(
    self: LeasedTask, key: str, job: str, writes: int = 3, step: float = 0.3, mode: str = "plain"
) -> dict[str, Any]:
    """The job with ``lease_dedupe`` (:func:`run_job`); a requeue sends a dedupe job."""
    return run_job(self, key, job, writes, step, mode)


@app.task(
    base=ChaosJob,
    bind=True,
    lease_key=("key",),
    name=DEBOUNCE_TASK,  # type: ignore[untyped-decorator]
    max_retries=3,
    lease_debounce=DEBOUNCE_DELAY,
    lease_debounce_max=DEBOUNCE_CAP,
    lease_min_replicas=int(os.environ.get("CHAOS_DEBOUNCE_MIN_REPLICAS") or 0),
)
def chaos_debounce_job(
    self: LeasedTask, key: str, job: str, writes: int = 3, step: float = 0.3, mode: str = "plain"
) -> dict[str, Any]:
    """The job with ``lease_debounce`` (:func:`run_job`): the run's ``job`` is its burst's
    latest publish."""
    return run_job(self, key, job, writes, step, mode)


@app.task(
    base=ChaosJob,
    bind=True,
    lease_key=("key",),
    name=HANDOFF_TASKS["coalesce"],  # type: ignore[untyped-decorator]
    lease_on_conflict="coalesce",
)
def chaos_coalesce(
    self: LeasedTask, key: str, job: str, writes: int = 3, step: float = 0.3, mode: str = "plain"
) -> dict[str, Any]:
    """The job, its duplicates coalesced into one pending run per key."""
    return run_job(self, key, job, writes, step, mode)


@app.task(
    base=ChaosJob,
    bind=True,
    lease_key=("key",),
    name=HANDOFF_TASKS["queue"],  # type: ignore[untyped-decorator]
    lease_on_conflict="queue",
)
def chaos_queue(
    self: LeasedTask, key: str, job: str, writes: int = 3, step: float = 0.3, mode: str = "plain"
) -> dict[str, Any]:
    """The job, its duplicates waiting in line per key."""
    return run_job(self, key, job, writes, step, mode)


@app.task(
    base=ChaosJob,
    bind=True,
    lease_key=("key",),
    name=PREEMPT_TASK,  # type: ignore[untyped-decorator]
    lease_on_conflict="preempt",
    lease_preempt_grace=float(os.environ.get("CHAOS_PREEMPT_GRACE") or 0),
)
def chaos_preempt(
    self: LeasedTask, key: str, job: str, writes: int = 3, step: float = 0.3, mode: str = "plain"
) -> dict[str, Any]:
    """The job, newest wins: a copy that starts while the key is held takes it over."""
    return run_job(self, key, job, writes, step, mode)


if LIMIT:  # lease_limit refuses a cooldown: a campaign runs one or the other

    @app.task(
        base=ChaosJob,
        bind=True,
        lease_key=("key",),
        name=LIMITED_TASK,  # type: ignore[untyped-decorator]
        lease_limit=LIMIT,
        lease_on_conflict="queue",
    )
    def chaos_limited(
        self: LeasedTask,
        key: str,
        job: str,
        writes: int = 3,
        step: float = 0.3,
        mode: str = "plain",
    ) -> dict[str, Any]:
        """The job, up to ``CHAOS_LIMIT`` at once per key, without fenced writes; a copy that
        finds all slots held waits in the key's line, handed a slot at a release."""
        return run_job(self, key, job, writes, step, mode)


def run_job(
    self: LeasedTask, key: str, job: str, writes: int, step: float, mode: str
) -> dict[str, Any]:
    """Make ``writes`` fenced writes to ``key``, ``step`` float seconds apart; record it all.

    ``mode``: ``plain``; ``retry`` (the first execution asks for a retry after its writes);
    ``requeue`` (the execution sends the next job for its key before it ends).

    Raises:
        LeaseLost: the lease was lost (told by the library, or a write was refused).
    """
    lease = self.lease
    assert lease is not None, "chaos_job runs as a leased execution"
    upper = time.time()  # the body runs: the grant is done
    lower = _before_acquire.pop(self.request.id or "", upper)
    confirmed = confirmed_since(lease)
    rec = recorder()
    worker = self.request.hostname or "?"
    rec.execution_started(
        Execution(
            token=lease.token,
            key=key,
            job=job,
            task_id=self.request.id or "",
            fence=lease.fencing_token,
            worker=worker,
            pid=os.getpid(),
            grant_lower=lower,
            grant_upper=upper,
        )
    )
    try:
        for _ in range(writes):
            time.sleep(step)  # the work before each effect
            lease.check()  # the pool may not interrupt a blocking call: look before writing
            if self.name == LIMITED_TASK:  # N holders at once: no single writer to fence
                continue
            if not rec.fenced_write(key, job, lease.token, lease.fencing_token, worker):
                raise lease.lose()  # a later holder wrote: stop acting as the holder
            confirmed = confirmed_since(lease) or confirmed
        if mode == "retry" and self.request.retries == 0:
            rec.execution_ended(lease.token, "retry", time.time(), confirmed=confirmed)
            raise self.retry(countdown=0.2)
        if mode == "requeue":
            submit(key, "requeued", writes, step, parent=job, dedupe=self.name == DEDUPE_TASK)
        lease.check()
        rec.execution_ended(lease.token, "ok", time.time(), confirmed=confirmed)
    except LeaseLost as exc:
        rec.execution_ended(
            lease.token, "lost", None, exc.cause, _lost_at.get(lease.token, time.time()), confirmed
        )
        raise
    return {"key": key, "job": job, "fencing_token": lease.fencing_token}
