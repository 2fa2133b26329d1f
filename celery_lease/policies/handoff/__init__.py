"""Handing the key over: ``lease_on_conflict="coalesce"`` and ``"queue"``, the task side.

A duplicate that finds its key held does not run and is not lost: :func:`park` keeps its
message in the key's line in Redis (:mod:`celery_lease.store.handoff`) and the duplicate ends
at once (acknowledged; no worker slot held, no retry used up):

- ``coalesce``: it becomes the key's single *pending run* (a fresh task id, shared by every
  duplicate that joins it; the latest arguments win) and its result is a marker naming that
  run (:func:`is_coalesced`, :func:`follow`);
- ``queue``: it waits in the key's line, in arrival order, under its own task id, so its
  caller's ``AsyncResult`` completes later with the real result; ``lease_queue_max`` bounds
  the line and ``lease_queue_timeout`` the wait (past either, ``LeaseConflict``).

A ``coalesce`` duplicate that arrives after a release handed the key to the pending run, but
before that run starts, joins it all the same (its arguments replace the run's): the run's
grant answers them and the run takes them (:func:`~celery_lease.policies.base.adopt`), so a
burst runs at most two bodies (one running, one pending). A queued run's reservation is never
joined: queue runs every copy.

The holder's release (:class:`Releaser`, one token-checked script) reserves the key for the
next run and the releasing worker publishes it (:func:`publish`). With ``lease_limit=N``
(N > 1) the line is the key's too: a duplicate parks once all N slots are held, and each
slot's release reserves the freed slot for the line's head (coalesce: at most one pending run
per key, which takes the first slot that frees). The crash sweep
(:mod:`celery_lease.ops.sweep`) publishes what a dead holder or releaser left. Where the idea
comes from: trailing runs of BullMQ's ``keepLastIfActive`` and Temporal's ``BUFFER_ONE``, and
the parked waiters of Solid Queue's ``:block`` (docs/howto/shaping/queue.md).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

import redis
from celery import states
from celery.result import AsyncResult, EagerResult, ResultBase
from celery.utils import uuid
from kombu.utils import json

from ...base import clock, signals
from ...base.headers import HANDOFF_HEADER
from ...core import eager
from ...errors import LeaseConflict
from ...settings.config import LeaseOptions
from ...store import handoff as stored

__all__ = [
    "COALESCED_MARKER",
    "HANDOFF_HEADER",
    "LINE_LIFETIME",
    "Releaser",
    "follow",
    "is_coalesced",
    "lifetime_ms",
    "message_of",
    "mode_of",
    "park",
    "publish",
    "publish_handoff",
]

logger = logging.getLogger("celery_lease")

#: The key in the result stored for a duplicate coalesced into a pending run.
COALESCED_MARKER = "lease_coalesced"
#: Float seconds a line and a reservation live without a park, hand-over or sweep look: a day
#: (more with a longer ``lease_queue_timeout``).
LINE_LIFETIME = 24 * 3600.0

# Options of a request that are the delivery's, not the message's.
_DELIVERY_ONLY = ("redelivered", "is_eager", "countdown", "eta")


def is_coalesced(result: Any) -> bool:
    """True when ``result`` (an ``AsyncResult.get()`` value) is a coalesced duplicate's marker:
    ``{"lease_coalesced": True, "into": <task id of the run covering it>, ...}``.

    Raises:
        TypeError: ``result`` is the ``AsyncResult`` itself (always False otherwise).
    """
    if isinstance(result, ResultBase):
        raise TypeError(
            "is_coalesced() takes the task's result, not its AsyncResult: "
            "is_coalesced(result.get())"
        )
    return isinstance(result, Mapping) and result.get(COALESCED_MARKER) is True


def follow(result: Any, timeout: float | None = None, *, app: Any = None) -> Any:
    """The result of the run that covers ``result``, following coalesced markers (a covering
    run that was itself coalesced, after a crash, names the next one). Needs a result backend.

    Args:
        result: an ``AsyncResult`` (waited for), or a value one returned.
        timeout: float seconds in all, or None to wait as long as it takes.
        app: the Celery app whose result backend to read (default: ``result``'s, else the
            current app).

    Returns:
        The first result along the way that is not a coalesced marker.

    Raises:
        celery.exceptions.TimeoutError: not ready within ``timeout``.
        Exception: what the covering run raised (as ``AsyncResult.get()`` does).
    """
    deadline = None if timeout is None else clock.now() + timeout
    app = app or getattr(result, "app", None)

    def left() -> float | None:
        return None if deadline is None else max(deadline - clock.now(), 0.0)

    value = result.get(timeout=left()) if isinstance(result, ResultBase) else result
    while is_coalesced(value):
        value = AsyncResult(value["into"], app=app).get(timeout=left())
    return value


def lifetime_ms(options: LeaseOptions) -> int:
    """The lifetime of a key's line and reservation, int milliseconds."""
    return round(max(LINE_LIFETIME, (options.queue_timeout or 0.0) + 2 * options.ttl) * 1000)


def mode_of(options: LeaseOptions) -> str:
    """The line policy of a task with ``options``: ``"coalesce"``, or ``"queue"`` (queue, and
    retry and debounce, which wait in the line as queue does)."""
    return "coalesce" if options.on_conflict == "coalesce" else "queue"


def message_of(task: Any, request: Any, task_id: str, key: str) -> str:
    """The message that runs ``request`` again later under ``task_id``, serialized (JSON).

    Raises:
        TypeError: an argument or option JSON cannot hold.
    """
    sig = task.signature_from_request(request)
    options = {k: v for k, v in dict(sig.options).items() if k not in _DELIVERY_ONLY}
    headers = {
        k: v for k, v in (options.get("headers") or {}).items() if not k.startswith("lease_")
    }
    options.update(task_id=task_id, headers={**headers, HANDOFF_HEADER: key})
    return str(
        json.dumps(
            {
                "task": task.name,
                "args": list(sig.args),  # type: ignore[no-untyped-call]
                "kwargs": dict(sig.kwargs),
                "options": options,
            }
        )
    )


def park(
    task: Any,
    request: Any,
    options: LeaseOptions,
    client: redis.Redis,
    key: str,
    remaining: float,
    limit: int = 1,
) -> stored.Parked:
    """Park ``request`` in ``key``'s line (its policy: coalesce; queue, and retry, which waits
    in the line as queue does) and note the key for the crash sweep, first (a note without a
    line is harmless, a line without one is not). ``limit`` (``lease_limit``, int): above 1
    the duplicate parks only while all its slots are held (else ``"free"``: take one). A copy
    of a handed-over run whose task id already ran is not parked (``"ran"``).

    Raises:
        redis.exceptions.RedisError: on store errors.
        TypeError: the message cannot be serialized.
    """
    mode = mode_of(options)
    task_id = uuid() if mode == "coalesce" else request.id
    message = message_of(task, request, task_id, key)
    stored.watch(
        client, options.key_prefix, key, round((remaining + options.renew_interval) * 1000)
    )
    handed_over = HANDOFF_HEADER in (request.headers or {})
    return stored.park(
        client,
        key,
        mode,
        task_id,
        message,
        options.queue_max,
        lifetime_ms(options),
        limit,
        handed_over=handed_over,
        min_replicas=options.min_replicas,
    )


class Releaser:
    """The release of a task that hands its key over, as :func:`celery_lease.core.lifecycle.end`
    calls it (``release(client, key, token) -> bool``), keeping what it handed over.

    Attributes:
        result: the :class:`~celery_lease.store.handoff.HandOff` of the first call that
            answered one (a repeat hands nothing over), or None.
    """

    def __init__(
        self, options: LeaseOptions, ran: str = "", limit: int = 1, ending: str = "handed"
    ) -> None:
        self.options = options
        self.limit = limit  # above 1: one slot's release hands the freed slot over
        self.ran = ran  # the task id of a run noted at its release (see release_handing_over)
        self.ending = ending  # "ended", "handed" (handed over, ended) or "retried"
        self.result: stored.HandOff | None = None

    def __call__(self, client: redis.Redis, key: str, token: str) -> bool:
        options = self.options
        timeout = round((options.queue_timeout or 0.0) * 1000)
        got = stored.release_handing_over(
            client,
            key,
            token,
            options.ttl_ms,
            lifetime_ms(options),
            timeout,
            self.ran,
            self.limit,
            mode=mode_of(options),
            handed_over=self.ending != "ended",
            retried=self.ending == "retried",
        )
        if self.result is None or self.result.handed is None:
            self.result = got
        return got.released


def publish(app: Any, waiting: stored.Waiting, key: str, *, by: str) -> Any:
    """Publish the run handed ``key`` (a release's or the sweep's: ``by``) and return its
    ``AsyncResult`` (None when it failed); never raises (a run not published is published
    again by the sweep once its reservation is past due)."""
    try:
        body = json.loads(waiting.message)  # type: ignore[no-untyped-call]
        # The element's task id: a pending run keeps its first id while later duplicates
        # replace its message (which carries the id that duplicate would have taken).
        options = {**body["options"], "task_id": waiting.task_id}
        sig = app.signature(body["task"], args=body["args"], kwargs=body["kwargs"], **options)
        published = sig.apply_async()
    except Exception as exc:
        logger.warning(
            "could not publish the run %s handed lease %s (%s: %s): the sweep "
            "publishes it once its reservation is past due",
            waiting.task_id,
            key,
            type(exc).__name__,
            exc,
        )
        return None
    logger.info(
        "lease %s handed over to task %s[%s] (by %s)", key, body["task"], waiting.task_id, by
    )
    if signals.lease_handed_over.receivers:
        signals.lease_handed_over.send(sender=body["task"], key=key, task_id=waiting.task_id, by=by)
    return published


def fail_expired(
    app: Any, waiting: stored.Waiting, key: str, now_ms: int, timeout: float | None
) -> None:
    """Store ``LeaseConflict`` (how long it waited) as the result of a waiter past its wait
    timeout (float seconds); never raises."""
    waited = max(now_ms - waiting.accepted_ms, 0) / 1000
    error = LeaseConflict(
        key,
        "",
        "",
        0.0,
        f"waited {waited:.1f}s in the line, past lease_queue_timeout={timeout}: not run",
    )
    try:
        app.backend.mark_as_failure(waiting.task_id, error, state=states.FAILURE)
    except Exception:
        logger.exception("could not store the wait timeout of %s", waiting.task_id)
    logger.info(
        "task %s waited %.1fs for lease %s: past lease_queue_timeout, failed with LeaseConflict",
        waiting.task_id,
        waited,
        key,
    )


def publish_handoff(
    app: Any, got: stored.HandOff | None, key: str, options: LeaseOptions, *, by: str
) -> Any:
    """Publish what a release or a sweep look handed over (its ``AsyncResult``, or None), and
    fail the expired waiters."""
    if got is None:
        return None
    for waiting in got.expired:
        fail_expired(app, waiting, key, got.now_ms, options.queue_timeout)
    for waiting in got.more:  # a limited key: more slots than the one released were free
        publish(app, waiting, key, by=by)
    return None if got.handed is None else publish(app, got.handed, key, by=by)


def publish_released(task: Any, lease: Any, got: stored.HandOff | None) -> None:
    """Publish the run ``task``'s release of ``lease`` handed the key to (after the release:
    it sees every change made before its trigger). An eager call runs it after its own end,
    as a worker would, not nested in this one."""
    if got is None or (got.handed is None and not got.expired):
        return
    publish_now = functools.partial(
        publish_handoff, task.app, got, lease.key, lease.options, by="release"
    )
    if task.request.is_eager and task.app.conf.task_always_eager and got.handed:
        task_id = got.handed.task_id

        def run() -> Any:
            return publish_now() or EagerResult(task_id, None, states.PENDING)

        eager.defer(lease.token, task_id, task.name, run)
    else:
        publish_now()
