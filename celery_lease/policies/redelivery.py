"""The conflicts no ``lease_on_conflict`` setting decides: a message that is a holder's own.

- ``"successor"``: a message the holder published for its own key (a retry, a self-requeue,
  marked :data:`~celery_lease.base.headers.SUCCESSOR_HEADER` at publish) runs once the holder
  ended: it is sent again shortly, at most half a renewal interval later.
- ``"redelivered"``: the broker delivered a message whose own task id holds the lease (a
  running ``acks_late`` message redelivered, or one whose execution died): a check copy is
  sent for when the holder's lifetime is over, and runs only if the first execution did not
  finish (:meth:`Redelivery.admit`: the store notes the last token that ended each key).
- ``"handed_over"``: a second copy of a run that a hand-over published, once that run
  started: it does not run.

These answer to message headers, not to a task's settings, so they hold for every leased task.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from celery.exceptions import Ignore
from redis.exceptions import RedisError

from .. import store
from ..base.headers import REDELIVERY_HEADER
from .base import Conflict, Policy

__all__ = ["HandedOver", "Redelivery", "Successor", "ended"]

logger = logging.getLogger("celery_lease")


def ended(client: Any, key: str, token: str) -> bool:
    """Whether the execution holding ``token`` released lease ``key``: a redelivered copy of
    it then does not run again. False when the store cannot tell (at least once beats never).
    """
    try:
        return store.released_last(client, key, token)
    except RedisError:
        return False


class Redelivery(Policy):
    """``"redelivered"``: the holder's own message delivered again while it runs."""

    name = "redelivered"
    order = 0
    handles = ("redelivered",)
    keeps_message = frozenset(handles)
    triggers = {"admit": REDELIVERY_HEADER, "acquires_apart": REDELIVERY_HEADER}

    def acquires_apart(self, task: Any, headers: Any) -> bool:
        return REDELIVERY_HEADER in headers  # its acquire waits for the look at the last end

    def admit(self, task: Any, request: Any, client: Any, key: str) -> None:
        earlier = (request.headers or {}).get(REDELIVERY_HEADER)
        if earlier and ended(client, key, str(earlier)):
            logger.info(
                "task %s[%s] already finished in an earlier delivery: not run again",
                task.name,
                request.id,
            )
            raise Ignore()

    def on_conflict(self, c: Conflict) -> NoReturn:
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


class Successor(Policy):
    """``"successor"``: a message the holder published for its own key runs after it."""

    name = "successor"
    order = 0
    handles = ("successor",)
    keeps_message = frozenset(handles)

    def on_conflict(self, c: Conflict) -> NoReturn:
        if c.request.is_eager:
            raise c.error
        c.task.signature_from_request(
            c.request,
            countdown=max(0.05, min(c.found.remaining, c.options.renew_interval / 2)),
            retries=c.request.retries,
        ).apply_async()
        raise Ignore()


class HandedOver(Policy):
    """``"handed_over"``: a second copy of a handed-over run that started already."""

    name = "handed_over"
    order = 0
    handles = ("handed_over",)
    keeps_message = frozenset(handles)

    def on_conflict(self, c: Conflict) -> NoReturn:
        logger.info(
            "task %s[%s] not run: a copy of this handed-over run already ran",
            c.task.name,
            c.request.id,
        )
        raise Ignore()
