"""``lease_on_conflict="skip"`` (the default) and ``"fail"``: a duplicate does not run.

A skipped duplicate's result is a marker (:data:`SKIPPED_MARKER`, :func:`is_skipped`), stored
as ``SUCCESS`` so that ``AsyncResult.get()`` returns instead of hanging; a failed one raises
:class:`~celery_lease.errors.LeaseConflict`, naming the holder. They are also what other
policies fall back to (:mod:`celery_lease.policies.compose`): a ``preempt`` with nothing to
take over skips, and a skip inside a chain fails, so the chain's result raises.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NoReturn

from celery import states
from celery.backends.base import DisabledBackend
from celery.exceptions import Ignore
from celery.result import ResultBase

from .base import Conflict, Policy

__all__ = ["SKIPPED_MARKER", "Fail", "Skip", "is_skipped"]

logger = logging.getLogger("celery_lease")

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


class Skip(Policy):
    """``"skip"``: store the marker and end the execution (``Ignore``)."""

    name = "skip"
    handles = ("skip",)

    def on_conflict(self, c: Conflict) -> Any:
        return _skip(c)


class Fail(Policy):
    """``"fail"``: the execution raises the conflict (its result is the ``LeaseConflict``)."""

    name = "fail"
    handles = ("fail",)

    def on_conflict(self, c: Conflict) -> NoReturn:
        raise c.error


def _stores_result(task: Any, request: Any) -> bool:
    """Whether a result of ``request`` is stored (a result backend, and no ignore_result)."""
    ignored = request.ignore_result if request.ignore_result is not None else task.ignore_result
    return not isinstance(task.backend, DisabledBackend) and not ignored


def _skip(c: Conflict) -> dict[str, Any]:
    # Store a marker result so AsyncResult.get() returns instead of hanging.
    task, request, key, found = c.task, c.request, c.key, c.found
    holder = found.holder
    # A cooldown record (lease_cooldown): the marker says until when (epoch seconds, the
    # store's clock).
    cooling = {"cooldown_until": holder.cooldown_until} if holder.cooldown_until else {}
    c.event(
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
    stores = _stores_result(task, request)
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
