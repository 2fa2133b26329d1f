"""Eager mode (``task_always_eager``, ``apply()``) run in the order a worker would run it.

On a worker, a message published by the execution that holds the same lease key (a
self-requeue with ``self.delay(...)``, a retry, a replacement with ``self.replace(...)``) is a
*successor*: it runs once the holder has ended. In eager mode Celery runs such a call at once,
nested inside the holder's body, where it would meet the holder's own lease. Here it is
deferred instead: the call is kept until the holder has released its lease, then run, in the
order the calls were made, by the outermost eager execution of the thread (a loop, not a
recursion, so a task that requeues itself a thousand times needs no deep stack).

The caller gets an :class:`~celery.result.EagerResult` at once, ``PENDING`` until the
successor has run and then holding its state and result, as an ``AsyncResult`` of a published
message would.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from celery import states
from celery.result import EagerResult

__all__ = ["defer", "run_deferred"]

logger = logging.getLogger("celery_lease")


class _Pending(threading.local):
    def __init__(self) -> None:
        self.by_token: dict[str, list[Callable[[], None]]] = {}
        self.queue: deque[Callable[[], None]] | None = None  # set while a loop drains


_pending = _Pending()


def defer(token: str, task_id: str, name: str, call: Callable[[], Any]) -> EagerResult:
    """Keep ``call`` (an eager publish) until the lease with ``token`` is released.

    Args:
        token: the holding lease's token.
        task_id: the id the successor runs under.
        name: the task name, for the result.
        call: runs the successor and returns its :class:`~celery.result.EagerResult`.

    Returns:
        An ``EagerResult`` that is ``PENDING`` until the successor has run.
    """
    result = EagerResult(task_id, None, states.PENDING, name=name)  # type: ignore[no-untyped-call]

    def run() -> None:
        try:
            done = call()
        except Exception as exc:  # task_eager_propagates: the holder is not the one failing
            result._state, result._result = states.FAILURE, exc
            return
        result._state, result._result = done.state, done._result
        result._traceback = done._traceback

    _pending.by_token.setdefault(token, []).append(run)
    return result


def run_deferred(token: str) -> None:
    """Run the calls deferred by the execution that held ``token``; call after its release.

    Inside an outer eager execution that is already running deferred calls, they are handed
    to it (it runs them next); otherwise this runs them, and those they defer in turn.
    """
    calls = _pending.by_token.pop(token, None)
    if not calls:
        return
    if _pending.queue is not None:
        _pending.queue.extend(calls)
        return
    _pending.queue = queue = deque(calls)
    try:
        while queue:
            queue.popleft()()
    finally:
        _pending.queue = None
