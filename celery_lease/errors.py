"""Exceptions raised or stored by :mod:`celery_lease`.

Every exception here keeps *all* of its fields in ``self.args`` (positional, JSON-friendly
values only), so it survives ``pickle`` and Celery's JSON exception serialization, which
rebuilds an exception as ``cls(*args)`` (case C03).
"""

from __future__ import annotations

import os
from typing import Any

from celery.exceptions import CeleryCommandException, SoftTimeLimitExceeded

__all__ = [
    "LeaseConfigError",
    "LeaseConflict",
    "LeaseError",
    "LeaseKeyError",
    "LeaseLost",
    "LeaseStartRefused",
    "LeaseStoreUnavailable",
    "LostCause",
]

#: Exit status of a ``celery worker`` / ``celery beat`` that refused to start (sysexits'
#: configuration error).
EX_CONFIG: int = getattr(os, "EX_CONFIG", 78)


class LostCause:
    """Why a lease was lost (the ``cause`` of :class:`LeaseLost`).

    - ``REFUSED``: a renewal reached the store and the token no longer matched: the key was
      deleted, expired or taken by another holder.
    - ``DEADLINE``: the local deadline (send time of the last confirmed renewal + TTL - drift
      margin) passed without a confirmed renewal, e.g. because the process was paused.
    - ``STORE_ERROR``: the store answered renewals with an error (out of memory, read-only
      after a failover, ...) until the local deadline passed.
    - ``PREEMPTED``: a newer execution took the key over (``lease_on_conflict="preempt"``).
    """

    REFUSED = "refused"
    DEADLINE = "deadline"
    STORE_ERROR = "store_error"
    PREEMPTED = "preempted"


class LeaseError(Exception):
    """Base class of the errors that :mod:`celery_lease` raises."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self.args)


class LeaseConfigError(LeaseError, ValueError, CeleryCommandException):  # type: ignore[misc]
    """A lease setting or task option is invalid.

    Raised as early as possible: when the task is registered for per-task options, at worker
    start for app-wide settings. The message names the option and the fix.

    It is also the Click exception Celery's commands use: raised while ``celery worker`` (or
    any ``celery`` command) loads the app, it is printed as one line, ``Error: celery-lease
    configuration error: <message>``, and the command exits with :data:`EX_CONFIG` (78)
    instead of printing a traceback.
    """

    exit_code = EX_CONFIG

    def __init__(self, *args: Any) -> None:
        Exception.__init__(self, *args)  # not Click's: the args are the message, as usual
        self.show_color = None  # what Click's own __init__ would set: colour if a terminal

    def __str__(self) -> str:
        return Exception.__str__(self)

    @property
    def message(self) -> str:
        """The line a ``celery`` command prints (after ``Error: ``)."""
        return f"celery-lease configuration error: {self}"


class LeaseStartRefused(LeaseConfigError):
    """A worker or beat refused to start: no leased task (or no election) can work like this.

    Printed by ``celery worker`` / ``celery beat`` as one line, ``Error: celery-lease refused
    to start this <what>: <why>``, with exit status :data:`EX_CONFIG` (78).

    Args:
        what: ``"worker"`` or ``"beat"``.
        message: what is wrong and the fix (str).
    """

    def __init__(self, what: str = "worker", message: str = "") -> None:
        super().__init__(what, message)

    def __str__(self) -> str:
        return f"celery-lease refused to start this {self.args[0]}: {self.args[1]}"

    @property
    def message(self) -> str:
        """The line a ``celery`` command prints (after ``Error: ``)."""
        return str(self)


class LeaseKeyError(LeaseError, TypeError):
    """A task's arguments cannot be turned into a stable lease key.

    The message names the task, the parameter and the offending type. Raised when the key is
    built: before the body runs on a worker, or by ``task.lease_key_for(...)``.
    """


class LeaseStoreUnavailable(LeaseError):
    """The lease store could not be reached, or did not answer in time.

    Args:
        key: the lease key (str) the operation was for.
        operation: ``"acquire"``, ``"renew"``, ``"release"``, or ``"publish"`` (the decision
            of a publish with ``lease_dedupe``, :mod:`celery_lease.policies.dedupe`).
        detail: the underlying error as text.
    """

    def __init__(self, key: str = "", operation: str = "", detail: str = "") -> None:
        super().__init__(key, operation, detail)

    @property
    def key(self) -> str:
        return str(self.args[0])

    @property
    def operation(self) -> str:
        return str(self.args[1])

    @property
    def detail(self) -> str:
        return str(self.args[2])

    def __str__(self) -> str:
        return f"lease store unavailable during {self.operation} of {self.key!r}: {self.detail}"


class LeaseConflict(LeaseError):
    """Another execution holds the lease (the ``"fail"`` policy of ``lease_on_conflict``).

    Args:
        key: the lease key (str).
        holder_task_id: the Celery task id of the holder (str, may be empty if unknown).
        holder: ``"hostname:pid"`` of the holder (str).
        remaining: the holder's remaining lifetime on the server, float seconds.
        reason: what happened instead of the usual "held by" sentence (str; empty for it):
            a full line (``lease_queue_max``) or a wait past ``lease_queue_timeout``.
    """

    def __init__(
        self,
        key: str = "",
        holder_task_id: str = "",
        holder: str = "",
        remaining: float = 0.0,
        reason: str = "",
    ) -> None:
        if reason:
            super().__init__(key, holder_task_id, holder, float(remaining), reason)
        else:
            super().__init__(key, holder_task_id, holder, float(remaining))

    @property
    def reason(self) -> str:
        return str(self.args[4]) if len(self.args) > 4 else ""

    @property
    def key(self) -> str:
        return str(self.args[0])

    @property
    def holder_task_id(self) -> str:
        return str(self.args[1])

    @property
    def holder(self) -> str:
        return str(self.args[2])

    @property
    def remaining(self) -> float:
        return float(self.args[3])

    def __str__(self) -> str:
        if self.reason:
            return f"lease {self.key!r}: {self.reason}"
        return (
            f"lease {self.key!r} is held by task {self.holder_task_id} on {self.holder} "
            f"for {self.remaining:.3f}s more"
        )


class LeaseLost(SoftTimeLimitExceeded):  # type: ignore[misc]
    """The running execution no longer holds its lease; raised inside the task body.

    It subclasses :class:`celery.exceptions.SoftTimeLimitExceeded`, so cleanup written for soft
    time limits runs too; like that exception it derives from :class:`Exception`, so an
    ``except Exception`` in the task body swallows it (re-raise it there).

    Args:
        key: the lease key (str).
        cause: one of :class:`LostCause` (str).
        fencing_token: the fencing token of the lost grant (int).
        late: float seconds between the moment the loss could first be known and its detection
            (for ``refused``: time since the last confirmed renewal; otherwise time past the
            local deadline).
    """

    def __init__(
        self, key: str = "", cause: str = "", fencing_token: int = 0, late: float = 0.0
    ) -> None:
        super().__init__(key, cause, int(fencing_token), float(late))

    def __reduce__(self) -> tuple[Any, ...]:
        # Always rebuild as the public class: the worker-thread delivery path raises a
        # per-execution subclass that exists only in this process.
        return (LeaseLost, self.args)

    @property
    def key(self) -> str:
        return str(self.args[0])

    @property
    def cause(self) -> str:
        return str(self.args[1])

    @property
    def fencing_token(self) -> int:
        return int(self.args[2])

    @property
    def late(self) -> float:
        return float(self.args[3])

    def __str__(self) -> str:
        # `late` measures from the last moment the lease was known held, not a slowness.
        if self.cause == LostCause.PREEMPTED:
            return (
                f"lease {self.key!r} lost ({self.cause}, fencing token "
                f"{self.fencing_token}: a newer execution took the key over)"
            )
        since = (
            "after its last confirmed renewal"
            if self.cause == LostCause.REFUSED
            else "after its local deadline"
        )
        return (
            f"lease {self.key!r} lost ({self.cause}, fencing token {self.fencing_token}, "
            f"found {self.late:.3f}s {since})"
        )
