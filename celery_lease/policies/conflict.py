"""What a leased task's execution does when it finds its key held: one handler per policy.

:func:`handle` picks the policy (the task's ``lease_on_conflict``, or one of the cases that
ignore it: a message the holder published for its own key, a redelivery of the holder's own
message, a skip inside a chain), logs it, sends :data:`~celery_lease.base.signals.lease_conflict`
and calls the policy's handler from :data:`HANDLERS`. A handler raises what ends the
execution (``Ignore``, ``Retry``, ``LeaseConflict``), returns the result of an eager call,
or returns :data:`AGAIN`: take the key again (it was free by the time the duplicate was to be
parked; or an eager ``queue`` call waiting its turn).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from celery import states
from celery.backends.base import DisabledBackend
from celery.exceptions import Ignore, Retry
from celery.result import ResultBase
from redis.exceptions import RedisError

from .. import store
from ..base import signals
from ..errors import LeaseConflict
from ..settings.config import LeaseOptions
from . import dedupe, handoff, preempt

__all__ = [
    "AGAIN",
    "HANDLERS",
    "REDELIVERY_HEADER",
    "SKIPPED_MARKER",
    "SUCCESSOR_HEADER",
    "Conflict",
    "ended",
    "handle",
    "is_skipped",
]

#: What a handler returns for "take the key again now" (see the module docstring).
AGAIN: Any = object()
_EAGER_POLL = (0.02, 0.5)  # float seconds: an eager queued call's first and longest poll

logger = logging.getLogger("celery_lease")

#: Message header naming the token of the execution that published this message, when that
#: execution held the same key (a retry or a self-requeue): it runs after that holder ends.
SUCCESSOR_HEADER = "lease_successor_of"

#: Message header of a copy republished by a delivery that found its own task id holding the
#: lease; its value is the holder's token. The copy runs only if that holder did not release
#: (it died), which the release notes beside the fencing counter.
REDELIVERY_HEADER = "lease_redelivery"

#: The key in the result stored for a duplicate skipped by ``lease_on_conflict="skip"``.
SKIPPED_MARKER = "lease_skipped"


def is_skipped(result: Any) -> bool:
    """True when ``result`` (an ``AsyncResult.get()`` value) is a skipped duplicate's marker.

    Raises:
        TypeError: ``result`` is the ``AsyncResult`` (or ``EagerResult``) itself, which would
            always answer False.
    """
    if isinstance(result, ResultBase):
        raise TypeError(
            "is_skipped() takes the task's result, not its AsyncResult: is_skipped(result.get())"
        )
    return isinstance(result, Mapping) and result.get(SKIPPED_MARKER) is True


@dataclass(frozen=True)
class Conflict:
    """One execution that found its key held, as a handler sees it.

    Attributes:
        task: the :class:`~celery_lease.LeasedTask` instance (its ``request`` is the
            execution's).
        request: the execution's Celery request.
        options: the task's lease options.
        key: the lease key (str).
        found: what the acquire found (the holder, its time left).
        error: the :class:`LeaseConflict` that describes it.
        client: the store's client (for the policies that park the duplicate).
        attempt: how many times this execution found the key held before (int, 0 first).
        waited: float seconds since it first found the key held.
        claim: the execution's :class:`~celery_lease.core.lifecycle.Claim`, for a handler that takes
            the key after all (``"preempt"``), or None.
    """

    task: Any
    request: Any
    options: LeaseOptions
    key: str
    found: store.AcquireResult
    error: LeaseConflict
    client: Any = None
    attempt: int = 0
    waited: float = 0.0
    claim: Any = None


def _policy(c: Conflict) -> str:
    holder, request = c.found.holder, c.request
    if holder.hostname == store.RAN_HOLDER:
        return "handed_over"  # a second copy of a handed-over run that started already
    # A cooldown record (lease_cooldown) is a holder that ended: its successor is a copy.
    if (
        holder.token
        and not holder.cooldown_until
        and (request.headers or {}).get(SUCCESSOR_HEADER) == holder.token
    ):
        return "successor"  # published by the holder itself (a retry): run once it ends
    if holder.task_id and holder.task_id == request.id:
        return "redelivered"  # same message again while it runs: not ours, not stored
    if c.options.debounce is not None:
        return "queue"  # a burst that fired waits for the previous run's release, in line
    if c.options.on_conflict in ("skip", "coalesce") and (request.chain or request.callbacks):
        # A skipped (or coalesced) link would leave the rest of its chain waiting forever
        # (Ignore sends nothing on): fail it instead, so the chain's result raises
        # LeaseConflict.
        return "fail"
    return c.options.on_conflict


def _redelivered(c: Conflict) -> NoReturn:
    if c.request.is_eager:
        raise c.error
    if c.found.holder.cooldown_until:  # only its release writes a cooldown record: it ended
        logger.info(
            "task %s[%s] already finished (its lease is in its cooldown): not run again",
            c.task.name,
            c.request.id,
        )
        raise Ignore()
    # Either the broker delivered a message that is still running (acks_late, visibility
    # timeout) or the execution that holds it died (a SIGKILLed child with
    # reject_on_worker_lost). Look again once the holder's lifetime is over: the copy runs
    # only if the first execution did not finish.
    request = c.request
    c.task.signature_from_request(
        request,
        countdown=max(0.05, c.found.remaining),
        retries=request.retries,
        headers={**(request.headers or {}), REDELIVERY_HEADER: c.found.holder.token},
    ).apply_async()
    raise Ignore()


def _successor(c: Conflict) -> NoReturn:
    if c.request.is_eager:
        raise c.error
    c.task.signature_from_request(
        c.request,
        countdown=max(0.05, min(c.found.remaining, c.options.renew_interval / 2)),
        retries=c.request.retries,
    ).apply_async()
    raise Ignore()


def _retry(c: Conflict) -> Any:
    # "Run when the holder is done": the copy waits in the key's line as a queued one does
    # (state RETRY meanwhile), and the holder's release hands it the key; a holder that dies
    # hands over through the sweep, once its lease expires. Waiting uses up no retry. Only a
    # full line (or a store that refuses the park) falls back to Celery's retry at the
    # holder's remaining lifetime, which counts against max_retries.
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
    raise Retry(f"waiting for the holder of {c.key} (position {parked.length})", c.error)


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


def _fail(c: Conflict) -> NoReturn:
    raise c.error


def _skip(c: Conflict) -> dict[str, Any]:
    # Store a marker result so AsyncResult.get() returns instead of hanging.
    task, request, key, found = c.task, c.request, c.key, c.found
    holder = found.holder
    # A cooldown record (lease_cooldown): the marker says until when (epoch seconds, the
    # store's clock).
    cooling = {"cooldown_until": holder.cooldown_until} if holder.cooldown_until else {}
    task._event(
        "task-lease-skipped",
        lease_key=key,
        lease_holder=holder.where,
        lease_holder_task_id=holder.task_id,
        lease_remaining=found.remaining,
        lease_cause="in its cooldown" if cooling else "held by another execution",
        **cooling,
    )
    marker = {
        SKIPPED_MARKER: True,
        "key": key,
        "holder_task_id": holder.task_id,
        "holder": holder.where,
        **cooling,
    }
    if request.is_eager:
        return marker  # returned as the result: no worker, no stored state to set
    # Without a result backend (or with ignore_result) nothing is stored: say so, since a
    # caller's .get() then cannot learn that the duplicate was skipped.
    stores = not isinstance(task.backend, DisabledBackend) and not (
        request.ignore_result if request.ignore_result is not None else task.ignore_result
    )
    try:
        if stores:
            task.backend.mark_as_done(request.id, marker, request=request, state=states.SUCCESS)
    except Exception:
        logger.exception("could not store the skipped marker of %s", request.id)
    else:
        logger.info(
            "skipped: task %s[%s] not run, lease %s held by %s (task %s, %.1fs "
            "left, fencing_token=%d); %s",
            task.name,
            request.id,
            key,
            holder.where,
            holder.task_id or "?",
            found.remaining,
            holder.fencing_token,
            "result stored as SUCCESS with a skip marker"
            if stores
            else "no result stored (no result backend, or ignore_result): a caller "
            "cannot read the skip marker",
        )
    # Ignore, not a returned marker: a return would send task-succeeded, which would
    # replace the task-lease-skipped state in Flower.
    raise Ignore()


def _handed_over(c: Conflict) -> NoReturn:
    logger.info(
        "task %s[%s] not run: a copy of this handed-over run already ran", c.task.name, c.request.id
    )
    raise Ignore()


def _park(c: Conflict) -> store.handoff.Parked | None:
    """Park the duplicate; None when the key was free by then (take it again)."""
    try:
        limit = c.found.limit if isinstance(c.found, store.SlotsFull) else 1
        parked = handoff.park(
            c.task, c.request, c.options, c.client, c.key, c.found.remaining, limit
        )
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
        c.task._store_error(c.options, c.key, exc)
    if parked.outcome == "free":
        if c.attempt < 100:
            return None
        raise c.error  # freed and taken again a hundred times over: give up, loudly
    if parked.outcome == "ran":
        _handed_over(c)  # a copy retried after store errors, back after its run ended
    return parked


def _coalesce(c: Conflict) -> Any:
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
    task._event(
        "task-lease-coalesced",
        lease_key=key,
        lease_into=parked.task_id,
        lease_holder=holder.where,
        lease_holder_task_id=holder.task_id,
        lease_remaining=c.found.remaining,
    )
    marker = {
        handoff.COALESCED_MARKER: True,
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


def _queue(c: Conflict) -> Any:
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
    task._event(
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


def _preempt(c: Conflict) -> Any:
    # What cannot be taken over (a cooldown record, an unknown holder) is skipped; inside a
    # chain it fails instead, as a skip does (see _policy).
    in_chain = c.request.chain or c.request.callbacks
    return preempt.take_over(c) or (_fail(c) if in_chain else _skip(c))


#: Policy name -> its handler. The task's ``lease_on_conflict`` names one of ``skip``,
#: ``retry``, ``fail``, ``coalesce``, ``queue`` and ``preempt``; ``successor``,
#: ``redelivered`` and ``handed_over`` are chosen by :func:`handle`.
HANDLERS: dict[str, Callable[[Conflict], Any]] = {
    "skip": _skip,
    "retry": _retry,
    "fail": _fail,
    "coalesce": _coalesce,
    "queue": _queue,
    "handed_over": _handed_over,
    "preempt": _preempt,
    "successor": _successor,
    "redelivered": _redelivered,
}


def handle(
    task: Any,
    request: Any,
    options: LeaseOptions,
    key: str,
    found: store.AcquireResult,
    client: Any = None,
    attempt: int = 0,
    waited: float = 0.0,
    claim: Any = None,
) -> Any:
    """Deal with an execution of ``task`` that found ``key`` held (``found``).

    Args:
        client: the store's client (coalesce and queue park the duplicate with it).
        attempt, waited: see :class:`Conflict`.

    Returns:
        The marker result of a skipped or coalesced eager call, :data:`AGAIN`, or the lease
        a ``"preempt"`` took over (set in ``claim``, a :class:`~celery_lease.core.lifecycle.Claim`):
        the body runs.

    Raises:
        celery.exceptions.Ignore: the execution ends without a result of its own (a stored
            skip marker, or a copy sent to run later).
        celery.exceptions.Retry: ``lease_on_conflict="retry"`` (the copy waits in the key's
            line; with a full line, Celery's retry at the holder's remaining lifetime).
        LeaseConflict: ``lease_on_conflict="fail"``, or a skip or coalesce inside a chain,
            or a successor or redelivery in eager mode, or a full line or a wait past
            ``lease_queue_timeout`` (queue).
        LeaseStoreUnavailable: the duplicate could not be parked (store error, with
            ``lease_on_store_error="fail"``; ``"retry"`` raises ``Retry``).
    """
    holder = found.holder
    c = Conflict(
        task,
        request,
        options,
        key,
        found,
        LeaseConflict(key, holder.task_id, holder.where, found.remaining),
        client,
        attempt,
        waited,
        claim,
    )
    policy = _policy(c)
    # A skip says what happened in its own line, once the marker is stored.
    logger.log(
        logging.DEBUG if policy in ("skip", "coalesce", "queue") else logging.INFO,
        "lease conflict (%s): task %s[%s] not run: %s (fencing_token=%d)",
        policy,
        task.name,
        request.id,
        c.error,
        holder.fencing_token,
    )
    signals.lease_conflict.send(
        sender=task,
        key=key,
        task_id=request.id,
        holder_task_id=holder.task_id,
        holder=holder.where,
        remaining=found.remaining,
        policy=policy,
        fencing_token=holder.fencing_token,
        token=holder.token,
    )
    try:
        return HANDLERS[policy](c)
    except Retry:
        raise  # published again under its task id: a waiting copy keeps its claim
    except BaseException:
        key_claimed = (request.headers or {}).get(dedupe.CLAIM_HEADER)
        # Its message ends here: a skip, a failure, a coalesce (the pending run, not this task
        # id, serves the trigger), a preempt that could not take over. A queued copy runs
        # later under its own id, a retried one too: they keep it.
        if key_claimed and policy in ("skip", "fail", "retry", "coalesce", "preempt"):
            dedupe.forget(task, str(key_claimed), request.id, f"it ended on a conflict ({policy})")
        raise


def ended(client: Any, key: str, token: str) -> bool:
    """Whether the execution holding ``token`` released lease ``key``: a redelivered copy of
    it then does not run again. False when the store cannot tell (at least once beats never).
    """
    try:
        return store.released_last(client, key, token)
    except RedisError:
        return False
