"""celery-lease: singleton Celery tasks with a renewed Redis lease.

``@app.task(base=LeasedTask)`` takes a lease keyed by the task name and arguments before the
body runs, renews it from a heartbeat thread while the body runs, releases it when the
execution ends, and raises :class:`LeaseLost` inside the body the moment it is lost.

The layers, each importing only from itself and those below it (tests/test_layout.py)::

    operations    cli, doctor, inspection, flower, metrics, testing, worker (start check),
                  acl (the ACL rule an app needs), sweep (hand-overs a dead holder left)
    entry points  task (+ conflict), hold (+ hold_core, hold_async, hold_options, hold_shapes),
                  beat, lease_tasks, eager
    the lease     lifecycle, heartbeat, interrupt (delivering LeaseLost; + next_instruction),
                  lease, handoff (coalesce and queue: parking, handing the key over)
    settings      config, names, publish_settings (read once per task class)
    store/        the Redis side: the protocol and its Lua scripts, the client and its
                  topologies, routing, pending replies, stored values, store errors, the
                  commands each feature sends (permissions), the asyncio wait of a hold
    base          keys, errors, signals, clock, process (this process's id)
"""

from __future__ import annotations

from .errors import (
    LeaseConfigError,
    LeaseConflict,
    LeaseError,
    LeaseKeyError,
    LeaseLost,
    LeaseStartRefused,
    LeaseStoreUnavailable,
    LostCause,
)
from .handoff import follow, is_coalesced
from .hold import Hold, hold
from .hold_async import AsyncHold, hold_async
from .keys import hold_name
from .lease import Lease, current_lease
from .lease_tasks import apply_lease_tasks  # also: applies app.conf.lease_tasks at finalize
from .task import LeasedTask, is_skipped

__all__ = [
    "AsyncHold",
    "Hold",
    "Lease",
    "LeaseConfigError",
    "LeaseConflict",
    "LeaseError",
    "LeaseKeyError",
    "LeaseLost",
    "LeaseStartRefused",
    "LeaseStoreUnavailable",
    "LeasedTask",
    "LostCause",
    "apply_lease_tasks",
    "current_lease",
    "follow",
    "hold",
    "hold_async",
    "hold_name",
    "is_coalesced",
    "is_skipped",
]

__version__ = "0.1.0"
