"""The conflict policies that wait in the key's line: ``coalesce``, ``queue`` and ``retry``,
and the hand-over's part of every leased execution (:class:`HandOver`).

Each parks the duplicate in the key's line (:func:`celery_lease.policies.handoff.park`); the
holder's release hands the key to the line's head (:class:`HandOver`'s :meth:`release`).
``retry`` waits as a queued copy does (state ``RETRY`` meanwhile) and falls back to Celery's
retry only when the line is full or the store refuses the park. In eager mode there is no
line: a queued or retried call waits in its own thread and takes the key again.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from celery import states
from celery.exceptions import Ignore
from celery.exceptions import Retry as CeleryRetry
from redis.exceptions import RedisError

from ... import store
from ...base import signals
from ...base.headers import HANDOFF_HEADER
from ...core import lifecycle
from ...errors import LeaseConflict
from ...settings.config import LeaseOptions
from ...store import handoff as stored
from ..base import AGAIN, Arguments, Conflict, Policy, adopt
from . import (
    COALESCED_MARKER,
    Releaser,
    lifetime_ms,
    mode_of,
    park,
    publish_handoff,
    publish_released,
)

if TYPE_CHECKING:
    from ...core.lease import Lease

__all__ = ["Coalesce", "HandOver", "Queue", "Retry"]

logger = logging.getLogger("celery_lease")

_EAGER_POLL = (0.02, 0.5)  # float seconds: an eager queued call's first and longest poll


class HandOver(Policy):
    """The hand-over's part of every execution: a run a hand-over published says so to its
    acquire, takes the arguments a later duplicate joined it with, and (for a task whose
    release hands the key over) releases into the key's line."""

    name = "hand-over"
    order = 20
    triggers = {"shape": HANDOFF_HEADER, "on_grant": HANDOFF_HEADER}  # a handed-over run

    def applies(self, options: LeaseOptions, limit: Any) -> bool:
        return options.hands_over

    def shape(
        self, task: Any, request: Any, args: Any, kwargs: Any, asked: lifecycle.AcquireRequest
    ) -> None:
        asked.handed_over = HANDOFF_HEADER in (request.headers or {})

    def on_grant(self, task: Any, request: Any, lease: Lease) -> Arguments | None:
        if lease.joined is None:
            return None
        return adopt(request, lease.joined)  # a duplicate joined this handed-over run: its args

    def release(self, task: Any, lease: Lease, ending: str, wait: bool) -> lifecycle.Ending | None:
        options = lease.options
        if not options.hands_over:
            return None
        handed = HANDOFF_HEADER in (task.request.headers or {})  # hand the key (slot) over
        retried = ending == "retry"
        if lease.limit > 1:
            ran = lease.task_id if handed else ""  # a slot's release: a handed-over run's
        else:
            # Noted: a handed-over run (a second copy of it is refused, until its retry
            # parks), and a run that ended for good: a copy of a waiting run (sent again
            # after a store error, without the hand-over header) may have taken a free key
            # while its element waited; that element must not run the task id again.
            ran = lease.task_id if handed or not retried else ""
        how = "retried" if retried else "handed" if handed else "ended"
        releaser = Releaser(options, ran, lease.limit, how)
        ended = lifecycle.end(lease, sender=task, release=releaser)
        publish_released(task, lease, releaser.result)
        return ended

    def sweep(
        self, app: Any, client: Any, prefix: str, key: str, score: int, options: LeaseOptions
    ) -> int:
        """The crash sweep's look at ``key`` (noted at ``score``): hand over what a dead
        holder or releaser left waiting; 1 when it published a run."""
        got = stored.recover(
            client,
            key,
            options.ttl_ms,
            lifetime_ms(options),
            round((options.queue_timeout or 0.0) * 1000),
            mode_of(options),
        )
        margin = round(options.renew_interval * 500)
        logger.debug(
            "lease sweep looked at %s: wait %s ms, handed %s",
            key,
            got.wait_ms,
            got.handed and got.handed.task_id,
        )
        if got.wait_ms is not None:
            stored.watch(client, prefix, key, got.wait_ms + margin)
            if got.handed is None:
                return 0
            # A limited key's slot reservations past due: their releaser's publish was lost.
            logger.warning(
                "lease %s: the publish of the run %s handed a slot was lost; publishing it again",
                key,
                got.handed.task_id,
            )
            return int(publish_handoff(app, got, key, options, by="sweep") is not None)
        if got.handed is None:
            publish_handoff(app, got, key, options, by="sweep")
            stored.forget(client, prefix, key, score)
            return 0
        logger.warning(
            "lease %s: its holder or releaser is gone; handing the key over to the waiting run %s",
            key,
            got.handed.task_id,
        )
        # Looked at again once its reservation is due: it is handed over again if not taken.
        stored.watch(client, prefix, key, options.ttl_ms + margin)
        return int(publish_handoff(app, got, key, options, by="sweep") is not None)


def _handed_over(c: Conflict) -> None:
    logger.info(
        "task %s[%s] not run: a copy of this handed-over run already ran", c.task.name, c.request.id
    )
    raise Ignore()


def _park(c: Conflict) -> stored.Parked | None:
    """Park the duplicate; None when the key was free by then (take it again)."""
    try:
        limit = c.found.limit if isinstance(c.found, store.SlotsFull) else 1
        parked = park(c.task, c.request, c.options, c.client, c.key, c.found.remaining, limit)
    except TypeError as exc:
        raise LeaseConflict(
            c.key,
            c.found.holder.task_id,
            c.found.holder.where,
            c.found.remaining,
            f"held, and this duplicate cannot be kept to "
            f"run later (its message is not JSON: {exc})",
        ) from None
    except RedisError as exc:
        c.fail_on_store(exc)
    if parked.outcome == "free":
        if c.attempt < 100:
            return None
        raise c.error  # freed and taken again a hundred times over: give up, loudly
    if parked.outcome == "ran":
        _handed_over(c)  # a copy retried after store errors, back after its run ended
    return parked


def _wait_eagerly(c: Conflict) -> Any:
    """An eager call waits in its own thread and takes the key again (a worker's duplicate
    waits in the line, without a thread); past ``lease_queue_timeout`` it fails."""
    options, holder = c.options, c.found.holder
    if options.queue_timeout is not None and c.waited > options.queue_timeout:
        raise LeaseConflict(
            c.key,
            holder.task_id,
            holder.where,
            c.found.remaining,
            f"waited {c.waited:.1f}s, past lease_queue_timeout={options.queue_timeout}: not run",
        )
    time.sleep(min(_EAGER_POLL[0] * 1.5**c.attempt, _EAGER_POLL[1], c.found.remaining))
    return AGAIN


class Retry(Policy):
    """``"retry"``: run when the holder is done."""

    name = "retry"
    handles = ("retry",)

    def on_conflict(self, c: Conflict) -> Any:
        # "Run when the holder is done": the copy waits in the key's line as a queued one does
        # (state RETRY meanwhile), and the holder's release hands it the key; a holder that
        # dies hands over through the sweep, once its lease expires. Waiting uses up no retry.
        # Only a full line (or a store that refuses the park) falls back to Celery's retry at
        # the holder's remaining lifetime, which counts against max_retries.
        countdown = max(c.found.remaining, 0.05)
        if c.request.is_eager:
            return _wait_eagerly(c)
        try:
            parked = _park(c)
        except LeaseConflict:  # the message cannot be kept in Redis: Celery's retry keeps it
            raise c.task.retry(exc=c.error, countdown=countdown) from None
        if parked is None:
            return AGAIN
        if parked.outcome == "full":
            raise c.task.retry(exc=c.error, countdown=countdown)
        signals.lease_queued.send(
            sender=c.task,
            key=c.key,
            task_id=c.request.id,
            position=parked.length,
            holder_task_id=c.found.holder.task_id,
        )
        logger.info(
            "retry: task %s[%s] waits for lease %s (held by task %s) in its line, "
            "position %d; it runs once the holder releases (no retry used up)",
            c.task.name,
            c.request.id,
            c.key,
            c.found.holder.task_id or "?",
            parked.length,
        )
        raise CeleryRetry(f"waiting for the holder of {c.key} (position {parked.length})", c.error)


class Coalesce(Policy):
    """``"coalesce"``: a duplicate becomes (or joins) the key's single pending run."""

    name = "coalesce"
    handles = ("coalesce",)

    def on_conflict(self, c: Conflict) -> Any:
        task, request, key, holder = c.task, c.request, c.key, c.found.holder
        parked = _park(c)
        if parked is None:
            return AGAIN
        signals.lease_coalesced.send(
            sender=task,
            key=key,
            task_id=request.id,
            into=parked.task_id,
            joined=parked.joined,
            holder_task_id=holder.task_id,
        )
        c.event(
            "task-lease-coalesced",
            lease_key=key,
            lease_into=parked.task_id,
            lease_holder=holder.where,
            lease_holder_task_id=holder.task_id,
            lease_remaining=c.found.remaining,
        )
        marker = {
            COALESCED_MARKER: True,
            "into": parked.task_id,
            "key": key,
            "holder_task_id": holder.task_id,
        }
        if request.is_eager:
            return marker
        try:
            task.backend.mark_as_done(request.id, marker, request=request, state=states.SUCCESS)
        except Exception:
            logger.exception("could not store the coalesced marker of %s", request.id)
        logger.info(
            "coalesced: task %s[%s] not run now: lease %s held by task %s; its trigger "
            "runs in the pending run %s, after the holder's release",
            task.name,
            request.id,
            key,
            holder.task_id or "?",
            parked.task_id,
        )
        raise Ignore()  # as for a skip: the marker stays the state Flower shows


class Queue(Policy):
    """``"queue"``: a duplicate waits in the key's line, in arrival order, under its own id."""

    name = "queue"
    handles = ("queue",)
    keeps_message = frozenset(handles)  # it runs later under its own task id

    def on_conflict(self, c: Conflict) -> Any:
        task, request, key, options, holder = c.task, c.request, c.key, c.options, c.found.holder
        if request.is_eager:
            return _wait_eagerly(c)
        parked = _park(c)
        if parked is None:
            return AGAIN
        if parked.outcome == "full":
            raise LeaseConflict(
                key,
                holder.task_id,
                holder.where,
                c.found.remaining,
                f"held, and {parked.length} runs already wait in its line "
                f"(lease_queue_max={options.queue_max}): not run",
            )
        signals.lease_queued.send(
            sender=task,
            key=key,
            task_id=request.id,
            position=parked.length,
            holder_task_id=holder.task_id,
        )
        c.event(
            "task-lease-queued",
            lease_key=key,
            lease_position=parked.length,
            lease_holder=holder.where,
            lease_holder_task_id=holder.task_id,
            lease_remaining=c.found.remaining,
        )
        logger.info(
            "queued: task %s[%s] waits for lease %s (held by task %s), position %d in "
            "its line; it runs under its own task id once handed the key",
            task.name,
            request.id,
            key,
            holder.task_id or "?",
            parked.length,
        )
        raise Ignore()  # acknowledged: the message is kept in the line, not on a worker
