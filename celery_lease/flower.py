"""Show lease outcomes in Flower: call :func:`install` from ``flowerconfig.py``.

Leased tasks send two task events (see :class:`~celery_lease.LeasedTask`):

- ``task-lease-skipped`` (a refused duplicate): fields ``lease_key``, ``lease_holder``
  (``"host:pid"`` of the execution that holds the key), ``lease_holder_task_id``,
  ``lease_remaining`` (float seconds) and ``lease_cause``;
- ``task-lease-lost`` (the running execution lost its lease): ``lease_key``, ``lease_cause``
  (``refused``, ``deadline`` or ``store_error``), ``lease_holder`` (this execution),
  ``fencing_token`` and ``lease_late`` (float seconds).

Renewals send no event. Celery's event state turns both events into the task's state
(``LEASE-SKIPPED``, ``LEASE-LOST``; a later ``task-failed`` still wins) and keeps the fields,
but Flower only displays the fields listed in ``celery.events.state.Task._fields``. With
:func:`install`:

- the task detail page and ``/api/task/info/<id>`` and ``/api/tasks`` show every ``lease_*``
  field;
- the tasks list gets a ``lease`` column (add ``lease`` to Flower's ``tasks_columns``), one
  line such as ``held by another execution: lease:{proj.sync:...} held by w1@host:42``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LEASE_FIELDS", "install", "lease_summary"]

#: The event fields :func:`install` makes visible, in display order.
LEASE_FIELDS = (
    "lease",
    "lease_key",
    "lease_holder",
    "lease_holder_task_id",
    "lease_cause",
    "lease_remaining",
    "lease_late",
    "fencing_token",
)

#: The column Flower's tasks list gets (slug -> header label).
COLUMN = ("lease", "Lease")


def lease_summary(task: Any) -> str | None:
    """One line describing the lease outcome of a ``celery.events.state.Task``, or ``None``."""
    fields = task.__dict__
    key = fields.get("lease_key")
    if not key:
        return None
    cause = fields.get("lease_cause") or "lease"
    holder = fields.get("lease_holder") or "?"
    if fields.get("state") == "LEASE-SKIPPED" or "lease_remaining" in fields:
        return f"skipped ({cause}): {key} held by {holder}"
    return f"lost ({cause}): {key} was held by {holder}"


def install() -> None:
    """Make Flower show the lease fields; idempotent. Call it from ``flowerconfig.py``.

    Patches ``celery.events.state.Task`` (adds the fields, with ``None`` class defaults so
    tasks without them still serialise, and a computed ``lease`` summary) and Flower's table of
    task-list columns. Both are read at request time, so calling this in the config file (which
    Flower executes before it starts serving) is enough.
    """
    from celery.events.state import Task

    missing = tuple(name for name in LEASE_FIELDS if name not in Task._fields)
    for name in missing:
        if name == "lease":
            Task.lease = property(lease_summary)
        elif not hasattr(Task, name):
            setattr(Task, name, None)
    if missing:
        Task._fields = tuple(Task._fields) + missing
    try:
        from flower.views import tasks as flower_tasks
    except ImportError:  # Flower not installed: the events API still gets the fields
        return
    columns = getattr(flower_tasks, "TASK_COLUMNS", None)
    if isinstance(columns, dict):
        columns.setdefault(*COLUMN)
