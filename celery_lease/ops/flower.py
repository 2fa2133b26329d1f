"""Show lease outcomes in Flower: call :func:`install` from ``flowerconfig.py``.

Leased tasks send these task events (see :class:`~celery_lease.LeasedTask`):

- ``task-lease-skipped`` (a refused duplicate): fields ``lease_key``, ``lease_holder``
  (``"node:pid"`` of the execution that holds the key), ``lease_holder_task_id``,
  ``lease_remaining`` (float seconds) and ``lease_cause``;
- ``task-lease-coalesced`` (a duplicate coalesced into its key's pending run,
  ``lease_on_conflict="coalesce"``): ``lease_key``, ``lease_into`` (the pending run's task id),
  ``lease_holder``, ``lease_holder_task_id``, ``lease_remaining``;
- ``task-lease-queued`` (a duplicate parked in its key's line, ``lease_on_conflict="queue"``;
  its own run later sends the usual events under the same task id): ``lease_key``,
  ``lease_position`` (1: the head), ``lease_holder``, ``lease_holder_task_id``,
  ``lease_remaining``;
- ``task-lease-lost`` (the running execution lost its lease): ``lease_key``, ``lease_cause``
  (``refused``, ``deadline`` or ``store_error``), ``lease_holder`` (this execution),
  ``fencing_token`` and ``lease_late`` (float seconds); ``task-lease-preempted`` with the
  same fields (cause ``preempted``) when a newer execution took the key over
  (``lease_on_conflict="preempt"``);
- ``task-lease-debounced`` (a ``lease_debounce`` timer that arrived before its burst was due
  and was published again for the remainder): ``lease_key``, ``lease_due_in`` (float
  seconds); ``task-lease-debounce-fired`` (the burst runs now): ``lease_key``,
  ``lease_triggers`` (the publishes folded into the run), ``lease_waited`` (float seconds
  since the first).

Renewals send no event. Celery's event state turns each event into the task's state
(``LEASE-SKIPPED``, ``LEASE-COALESCED``, ``LEASE-QUEUED``, ``LEASE-LOST``; a later
``task-started``, ``task-succeeded`` or ``task-failed`` still wins) and keeps the fields,
but Flower only displays the fields listed in ``celery.events.state.Task._fields``. With
:func:`install`:

- the task detail page and ``/api/task/info/<id>`` and ``/api/tasks`` show every ``lease_*``
  field, durations rounded to the millisecond;
- a task that failed with one of this library's errors shows the error's sentence
  (``LeaseLost: lease 'lease:{...}' lost (refused, fencing token 7, found 0.012s after its
  last confirmed renewal)``) instead of Celery's ``repr`` of its arguments;
- the tasks list gets a ``lease`` column (add ``lease`` to Flower's ``tasks_columns``) with
  a few words: ``skipped (lease held)``, ``coalesced (pending run)``, ``queued (#2)`` or
  ``lost (refused)``; the key, holder and token are on the task page.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from .. import errors

__all__ = ["LEASE_FIELDS", "describe_exception", "install", "lease_summary"]

#: The event fields :func:`install` makes visible, in display order.
LEASE_FIELDS = (
    "lease",
    "lease_key",
    "lease_holder",
    "lease_holder_task_id",
    "lease_into",
    "lease_position",
    "lease_cause",
    "lease_remaining",
    "lease_late",
    "fencing_token",
    "lease_due_in",
    "lease_triggers",
    "lease_waited",
)

#: Fields holding float seconds: shown rounded to the millisecond.
DURATIONS = ("lease_remaining", "lease_late", "lease_due_in", "lease_waited")

#: The column Flower's tasks list gets (slug -> header label).
COLUMN = ("lease", "Lease")

#: The errors whose ``repr`` (what a ``task-failed`` event carries) becomes their sentence.
_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (errors.LeaseLost, errors.LeaseConflict, errors.LeaseStoreUnavailable)
}
_REPR = re.compile(r"^(?P<name>\w+)\((?P<args>.*)\)$", re.DOTALL)


def lease_summary(task: Any) -> str | None:
    """A few words on the lease outcome of a ``celery.events.state.Task``, or ``None``.

    ``"skipped (lease held)"`` for a refused duplicate, ``"coalesced (pending run)"`` and
    ``"queued (#<position>)"`` for a parked one, ``"debounced (<n> publishes)"`` for a
    burst's run (``"debounced (waiting)"`` before it), ``"lost (<cause>)"`` for an execution
    that lost its lease. Kept this short (no key, holder or token: they are long unbreakable
    words, and the task page shows them) so the column never pushes the others off the
    tasks list.
    """
    fields = task.__dict__
    if not fields.get("lease_key"):
        return None
    parked = _parked(fields)
    if parked is not None:
        return parked
    if fields.get("state") == "LEASE-SKIPPED" or "lease_remaining" in fields:
        return "skipped (lease held)"
    return _debounced(fields) or f"lost ({fields.get('lease_cause') or '?'})"


def _parked(fields: dict[str, Any]) -> str | None:
    """The summary of a run that waited for another (its event ``fields``): folded into the
    pending run (``coalesce``), or in the key's line (``queue``: its position); else None."""
    if fields.get("lease_into"):
        return "coalesced (pending run)"
    if fields.get("lease_position"):  # parked, then run under the same task id
        waiting = fields.get("state") == "LEASE-QUEUED"
        return f"{'queued' if waiting else 'waited in line'} (#{fields['lease_position']})"
    return None


def _debounced(fields: dict[str, Any]) -> str | None:
    """The summary of a burst's run (how many publishes it stands for), or of a burst still
    waiting for its quiet time (its event ``fields``); else None."""
    if fields.get("lease_triggers"):
        return f"debounced ({fields['lease_triggers']} publishes)"
    if "lease_due_in" in fields:
        return "debounced (waiting)"
    return None


def describe_exception(text: str | None) -> str | None:
    """Celery's ``repr`` of a celery-lease error turned into its sentence; others unchanged.

    ``"LeaseLost('lease:{a}', 'refused', 7, 0.0123)"`` becomes ``"LeaseLost: lease
    'lease:{a}' lost (refused, fencing token 7, found 0.012s after its last confirmed
    renewal)"``. Text that is not such a ``repr`` (another exception, a truncated ``repr``) is
    returned as it is.
    """
    match = _REPR.match(text or "")
    if match is None or match["name"] not in _ERRORS:
        return text
    try:
        args = ast.literal_eval(f"({match['args']},)") if match["args"].strip() else ()
        return f"{match['name']}: {_ERRORS[match['name']](*args)}"
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text


def _stored(name: str, shown: Any) -> property:
    """A field read through ``shown(raw value)``; events still write the raw value."""

    def get(self: Any) -> Any:
        return shown(self.__dict__.get(name))

    def set_(self: Any, value: Any) -> None:
        self.__dict__[name] = value

    return property(get, set_)


def _milliseconds(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


def install() -> None:
    """Make Flower show the lease fields; idempotent. Call it from ``flowerconfig.py``.

    Patches ``celery.events.state.Task`` (adds the fields, with ``None`` class defaults so
    tasks without them still serialise, a computed ``lease`` summary, durations rounded to
    the millisecond and celery-lease errors shown as sentences) and Flower's table of
    task-list columns. Both are read at request time, so calling this in the config file
    (which Flower executes before it starts serving) is enough. Only the process that calls
    it (Flower) is affected.
    """
    from celery.events.state import Task

    missing = tuple(name for name in LEASE_FIELDS if name not in Task._fields)
    for name in missing:
        if name == "lease":
            Task.lease = property(lease_summary)
        elif name in DURATIONS:
            setattr(Task, name, _stored(name, _milliseconds))
        elif not hasattr(Task, name):
            setattr(Task, name, None)
    if missing:
        Task._fields = tuple(Task._fields) + missing
        Task.exception = _stored("exception", describe_exception)
    try:
        from flower.views import tasks as flower_tasks
    except ImportError:  # Flower not installed: the events API still gets the fields
        return
    columns = getattr(flower_tasks, "TASK_COLUMNS", None)
    if isinstance(columns, dict):
        columns.setdefault(*COLUMN)
