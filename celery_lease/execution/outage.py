"""What a leased execution does while its lease store cannot be reached.

With ``lease_on_store_error="retry"`` (the default) an execution that cannot take its lease
because the store does not answer is not run, and waits the outage out: it is published
again, and these retries do **not** use up the task's ``max_retries`` (a store outage is not
the task's failure, and Celery's default of three retries would give up within seconds). It
waits as long as the outage has lasted so far (so the waits double), at least the renew
interval and at most :data:`MAX_WAIT`, until the outage has lasted ``lease_store_outage_max``
float seconds (default 300.0); the next store error after that fails the execution with
:class:`~celery_lease.errors.LeaseStoreUnavailable`, as ``lease_on_store_error="fail"`` does at
once. The choice and the figures are in docs/reference/settings.md.

An outage is measured from the first store error of the message: the retries carry its time in
the :data:`OUTAGE_HEADER` header, on the wall clocks of the workers that saw the errors (the
store's clock, which other timings use, is what cannot be read). A store error more than
:data:`NEW_OUTAGE_GAP` after the previous one of the same message (the store answered in
between, e.g. a later ``self.retry()`` of the task) starts a new outage.

An unreachable store is logged once per outage (:mod:`celery_lease.store.health`), a grant the
sentinels did not confirm once a minute, naming them (:func:`report_unconfirmed`); both at
WARNING, as retrying is the configured behaviour. An ERROR says an execution was given up.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NoReturn

from celery.exceptions import Reject, Retry

from ..base import clock
from ..errors import LeaseStoreUnavailable
from ..settings.config import LeaseOptions
from ..store.errors import PrimaryUnconfirmed

__all__ = [
    "MAX_WAIT",
    "NEW_OUTAGE_GAP",
    "OUTAGE_HEADER",
    "REPORT_EVERY",
    "report_unconfirmed",
    "wait_out",
]

logger = logging.getLogger("celery_lease")

#: Message header: ``[first, last]`` store error of this message, wall-clock epoch seconds.
OUTAGE_HEADER = "x-lease-store-outage"
#: The longest wait between two tries during an outage, float seconds.
MAX_WAIT = 30.0
#: Float seconds between two store errors of one message after which they count as two outages.
NEW_OUTAGE_GAP = 2 * MAX_WAIT


def _outage_start(headers: Any, now: float) -> float:
    """When the outage this message has been waiting out began (``now``: a new one)."""
    try:
        first, last = (float(t) for t in (headers or {})[OUTAGE_HEADER])
    except (KeyError, TypeError, ValueError):
        return now
    # Either way: another worker's wall clock may run ahead of this one's.
    return first if abs(now - last) <= NEW_OUTAGE_GAP and first <= last else now


def wait_out(
    task: Any, options: LeaseOptions, error: LeaseStoreUnavailable, unreachable: bool = True
) -> NoReturn:
    """Publish the execution of ``task`` again to wait out a store outage, or fail it.

    Logs an ERROR only when the execution is given up (failed, or dropped because its retry
    could not be published); a retry is logged at DEBUG when ``unreachable`` (the store did
    not answer: :mod:`celery_lease.store.health` logs the outage once, with reminders), else
    as a WARNING (the store answered with an error).

    Raises:
        celery.exceptions.Retry: published again (the task's state is ``RETRY``), its
            ``request.retries`` unchanged.
        celery.exceptions.Reject: the retry could not be published (the broker is down too):
            the message is dropped, as Celery's own retry does.
        LeaseStoreUnavailable: ``lease_on_store_error="fail"``, eager mode, or the outage has
            lasted ``lease_store_outage_max`` seconds.
    """
    request = task.request
    if options.on_store_error != "retry" or request.is_eager:
        _given_up(task, f"lease_on_store_error={options.on_store_error}", error)
    now = time.time()
    first = _outage_start(request.headers, now)
    lasted = now - first
    if lasted >= options.store_outage_max:
        _given_up(
            task,
            f"the lease store has not answered for {lasted:.1f}s, "
            f"lease_store_outage_max={options.store_outage_max:g}s",
            error,
        )
    wait = max(
        min(max(lasted, options.renew_interval), MAX_WAIT, options.store_outage_max - lasted), 0.05
    )
    logger.log(
        logging.DEBUG if unreachable else logging.WARNING,
        "task %s[%s] not run, tried again in %.1fs (store errors for %.1fs of "
        "lease_store_outage_max=%gs): %s",
        task.name,
        request.id,
        wait,
        lasted,
        options.store_outage_max,
        error,
    )
    again = task.signature_from_request(
        request,
        countdown=wait,
        retries=request.retries,
        headers={**(request.headers or {}), OUTAGE_HEADER: [first, now]},
    )
    try:
        again.apply_async()
    except Exception as exc:  # the broker is down too: as Celery's own retry does
        logger.error(
            "task %s[%s] dropped: its retry through a lease store outage could not be "
            "published: %s: %s",
            task.name,
            request.id,
            type(exc).__name__,
            exc,
        )
        raise Reject(exc, requeue=False) from None
    raise Retry(exc=error, when=wait, sig=again)


def _given_up(task: Any, why: str, error: LeaseStoreUnavailable) -> NoReturn:
    """Log that ``task``'s execution fails with ``error`` (an ERROR: it is not run) and
    raise it."""
    logger.error("task %s[%s] fails: %s: %s", task.name, task.request.id, why, error)
    raise error


#: Float seconds between two log lines about grants the sentinels did not confirm, per reason.
REPORT_EVERY = 60.0
#: Per reason: when it was last logged (clock.now()) and the refusals not logged since.
_reported: dict[str, tuple[float, int]] = {}


def report_unconfirmed(task: Any, options: LeaseOptions, error: PrimaryUnconfirmed) -> None:
    """Log that an execution of ``task`` was not run because the sentinels did not confirm its
    grant: one line per reason (the sentinels that do not answer, else the error's text)
    every :data:`REPORT_EVERY` seconds, with the count of the refusals in between,
    which are logged at DEBUG. A WARNING: the execution is tried again as
    ``lease_on_store_error`` says; an ERROR is logged only if it is given up
    (:func:`wait_out`)."""
    # Too few answered: the same sentinels, whatever each one's reason this time.
    reason = " ".join(sorted(error.unanswered)) or str(error)
    now = clock.now()
    last, since = _reported.get(reason, (float("-inf"), 0))
    if now - last < REPORT_EVERY:
        _reported[reason] = (last, since + 1)
        logger.debug("task %s[%s] not run: %s", task.name, task.request.id, error)
        return
    _reported[reason] = (now, 0)
    logger.warning(
        "lease grants not confirmed by the sentinels, task %s[%s] not run "
        "(lease_on_store_error=%s%s): %s; `celery lease doctor` names the sentinels",
        task.name,
        task.request.id,
        options.on_store_error,
        f", {since} more refused since the last report" if since else "",
        error,
    )
