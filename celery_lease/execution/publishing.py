"""The lease's part of publishing a :class:`~celery_lease.LeasedTask` (its ``apply_async``).

A message an execution publishes for its own key (a self-requeue, a retry) is marked as its
successor: it runs once that execution ended, on a worker and in eager mode. With
``lease_dedupe`` one decision in the lease store comes first
(:func:`celery_lease.policies.dedupe.send`). Every result carries ``lease_disposition``.

Published from a body that holds a lease, the whole publish runs under
:class:`~celery_lease.core.interrupt.HeldBack`: a loss of that lease never lands inside it (it would
leave a claim without its message, or, inside Celery's ``Task.retry``, become
``Reject(requeue=False)``, which drops the message). Once the message is out, the loss is
raised to the body, except for a publish under the execution's own task id (a retry: Celery
would turn it into that ``Reject``): that execution ends on the retry, its loss recorded
(:data:`~celery_lease.base.signals.lease_lost` at the loss, the ``task-lease-lost`` event at its
end).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery.utils import uuid

from ..base.headers import HANDOFF_HEADER, REDELIVERY_HEADER, SUCCESSOR_HEADER
from ..core import eager
from ..core.interrupt import HeldBack
from ..core.lease import Lease, _current
from ..policies import compose
from ..policies.base import PASS, mark, sent_key

__all__ = ["apply_async"]


def apply_async(
    task: Any, args: Any, kwargs: Any, options: dict[str, Any], publish: Callable[..., Any]
) -> Any:
    """Publish a call of ``task`` (a :class:`~celery_lease.LeasedTask`) with Celery's
    ``options``; ``publish(**options)`` is Celery's own ``apply_async`` of the call.

    Returns:
        The call's ``AsyncResult`` (the waiting copy's when deduplicated, the burst's with
        ``lease_debounce``: :func:`celery_lease.policies.debounce.send`), with
        ``lease_disposition``.

    Raises:
        LeaseStoreUnavailable: ``lease_dedupe``, the store could not be asked and
            ``lease_on_store_error`` is ``"fail"``.
        LeaseConfigError: ``lease_dedupe`` and this process has no lease store configured.
        LeaseLost: the body's lease was lost while it published (the message is out);
            not for a publish under the execution's own task id (a retry).
    """
    steps = compose.publish_steps(task)
    for before in steps.publish:  # a debounce burst answers for the call
        answered = before(task, args, kwargs, options, publish)
        if answered is not PASS:
            return answered
    holding = _current.get()
    if holding is None or holding.retired:
        return _apply_async(task, steps, None, args, kwargs, options, publish)
    own_id = bool(task.request.id) and options.get("task_id") == task.request.id
    with HeldBack(holding.target) as held:
        result = _apply_async(task, steps, holding, args, kwargs, options, publish)
    if held.loss is not None and not own_id:
        raise held.loss
    return result


def _apply_async(
    task: Any,
    steps: compose.PublishSteps,
    holding: Lease | None,
    args: Any,
    kwargs: Any,
    options: dict[str, Any],
    publish: Callable[..., Any],
) -> Any:
    key: str | None = None
    take_over = False
    if (
        holding is not None
        and (holding.lost or holding.retired)
        and HANDOFF_HEADER in (options.get("headers") or {})
        and options.get("task_id") == task.request.id
    ):
        # A retry of a handed-over run whose lease is gone: a new attempt all the same, not
        # a second copy of the run (refused once that ran to its release).
        options["headers"] = {k: v for k, v in options["headers"].items() if k != HANDOFF_HEADER}
    elif holding is not None and not holding.lost and not holding.retired:
        key = sent_key(task, args, kwargs, options)
        if key == holding.key:
            take_over = True
            # The holder's successor (a retry copies the request's headers): not the
            # handed-over run it may have been, whose second copy is refused once it ran.
            headers = {
                k: v for k, v in (options.get("headers") or {}).items() if k != HANDOFF_HEADER
            }
            options["headers"] = {**headers, SUCCESSOR_HEADER: holding.token}
            if task.app.conf.task_always_eager:
                # A worker runs it after the holder ends; so does eager mode (not nested).
                task_id = options.pop("task_id", None) or uuid()
                return mark(
                    eager.defer(
                        holding.token,
                        task_id,
                        task.name,
                        lambda: publish(task_id=task_id, **options),
                    ),
                    "published",
                )
    # The policies' send first: it is cached, the eager setting's lookup is not (~40 000
    # instructions a publish).
    if not steps.send or task.app.conf.task_always_eager:
        return mark(publish(**options), "published")
    if REDELIVERY_HEADER in (options.get("headers") or {}):
        key = None  # a check copy of a running message, never a waiting copy
    else:
        key = key or sent_key(task, args, kwargs, options)
        # Published again under its own id (a retry, a copy a conflict policy sends on).
        take_over = take_over or (options.get("task_id") or "") == task.request.id
    for send in steps.send:  # lease_dedupe: at most one waiting copy per key
        sent = send(task, key, options, publish, take_over)
        if sent is not PASS:
            return sent
    return mark(publish(**options), "published")
