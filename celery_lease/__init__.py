"""celery-lease: singleton Celery tasks with a renewed Redis lease.

``@app.task(base=LeasedTask)`` takes a lease keyed by the task name and arguments before the
body runs, renews it from a heartbeat thread while the body runs, releases it when the
execution ends, and raises :class:`LeaseLost` inside the body the moment it is lost.
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
from .lease import Lease, current_lease
from .task import LeasedTask, is_skipped

__all__ = [
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
    "current_lease",
    "is_skipped",
]

__version__ = "0.1.0"
