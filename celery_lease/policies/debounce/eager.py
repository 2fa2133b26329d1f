"""``lease_debounce`` in eager mode (``task_always_eager``), run as a worker would run it.

Eager mode has no broker to hold a timer message, so the burst's timer is a thread of the
publishing process (:func:`arm`): it sleeps until the burst's due time, asks the store the
same question a worker asks of a timer message (:func:`celery_lease.store.debounce.fire`:
early, gone, or due), sleeps again for the remainder while later publishes move the due time,
and at the due time runs the burst once with its latest arguments (``task.apply``, under the
normal lease: a previous run still holding the key is waited for, as an eager queued call
waits). Every caller of the burst in this process gets the same :class:`BurstResult`, whose
``get()`` waits for that run, as an ``AsyncResult`` of a published message would.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import states
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import EagerResult
from kombu.utils import json

from ...store import debounce as stored

__all__ = ["BurstResult", "arm", "result_of"]

logger = logging.getLogger("celery_lease")

_results: dict[str, BurstResult] = {}  # burst task id -> its result, until the run ends
_lock = threading.Lock()


class BurstResult(EagerResult):  # type: ignore[misc]
    """The result every eager caller of one burst shares: ``PENDING`` until its run ended,
    then that run's state and result. ``get(timeout)`` (float seconds, or None: as long as it
    takes) waits for the run.

    Raises (``get``): :class:`celery.exceptions.TimeoutError` when the run has not ended
    within ``timeout``; what the run raised, with ``propagate``.
    """

    def __init__(self, task_id: str, name: str) -> None:
        super().__init__(task_id, None, states.PENDING, name=name)  # type: ignore[no-untyped-call]
        self.ended = threading.Event()

    def settle(self, ran: Any = None, error: BaseException | None = None) -> None:
        """Take the state and result of the run ``ran`` (an ``EagerResult``), or fail with
        ``error``, and wake every waiter."""
        if ran is not None:
            self._state, self._result, self._traceback = ran.state, ran._result, ran._traceback
        else:
            self._state, self._result = states.FAILURE, error
        self.ended.set()

    def ready(self) -> bool:
        """True once the burst's run ended."""
        return self.ended.is_set()

    def get(self, timeout: float | None = None, propagate: bool = True, **kwargs: Any) -> Any:
        """The run's result, once it ended (see the class docstring)."""
        if not self.ended.wait(timeout):
            raise CeleryTimeoutError(f"the debounced burst {self.id} has not run yet")
        return super().get(propagate=propagate, disable_sync_subtasks=False)

    wait = get


def result_of(task: Any, task_id: str) -> Any:
    """The result shared by the callers of burst ``task_id``: this process's
    :class:`BurstResult`, else an ``AsyncResult`` (a burst another process armed)."""
    with _lock:
        found = _results.get(task_id)
    return found if found is not None else task.AsyncResult(task_id)


def arm(
    task: Any, client: Any, key: str, task_id: str, due_in: float, first: Any, margin_ms: int
) -> BurstResult:
    """Start the timer thread of the burst ``task_id`` of lease ``key``, due in ``due_in``
    float seconds (``first``: the first publish's ``(args, kwargs)``, run should the store
    lose the record; ``margin_ms``: the fired burst's tombstone lifetime, int milliseconds);
    returns the burst's :class:`BurstResult`."""
    result = BurstResult(task_id, task.name)
    with _lock:
        _results[task_id] = result
    thread = threading.Thread(
        target=_timer,
        args=(task, client, key, result, due_in, first, margin_ms),
        name=f"celery-lease-debounce-{task_id}",
        daemon=True,
    )
    thread.start()
    return result


def _timer(
    task: Any, client: Any, key: str, result: BurstResult, due_in: float, first: Any, margin_ms: int
) -> None:
    try:
        while True:
            if result.ended.wait(due_in):
                return
            decided = stored.fire(client, key, result.id, margin_ms)
            if decided.outcome != "early":
                break
            due_in = decided.due_in
        if decided.outcome == "stale":  # its record lapsed or was deleted by hand
            result.settle(error=RuntimeError(f"the burst {result.id} of {key} is gone"))
            return
        body = json.loads(decided.arguments)  # type: ignore[no-untyped-call]
        logger.info(
            "debounced (eager): task %s[%s] runs for %d publishes of %s",
            task.name,
            result.id,
            decided.count,
            key,
        )
        result.settle(task.apply(tuple(body["args"]), dict(body["kwargs"]), task_id=result.id))
    except BaseException as exc:  # the store, or the run outside its own result
        result.settle(error=exc)
    finally:
        with _lock:
            _results.pop(result.id, None)
