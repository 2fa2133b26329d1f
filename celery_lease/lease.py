"""The lease held by one running execution: ``self.lease`` and :func:`current_lease`."""

from __future__ import annotations

import contextvars
import logging
import os
import threading
from typing import TYPE_CHECKING

from . import clock, signals
from .errors import LeaseLost, LostCause

if TYPE_CHECKING:
    import redis

    from .config import LeaseOptions
    from .interrupt import Target

__all__ = ["Lease", "current_lease"]

logger = logging.getLogger("celery_lease")

_current: contextvars.ContextVar[Lease | None] = contextvars.ContextVar(
    "celery_lease_current", default=None)


def current_lease() -> Lease | None:
    """The lease of the execution running in this thread or greenlet, or ``None``.

    For code that has no task object at hand (``self.lease`` is the same object).
    """
    return _current.get()


class Lease:
    """One execution's hold on a lease key. Per execution, never shared between executions.

    Attributes:
        key: the Redis key (str).
        token: this execution's token (32 hex characters, unique per execution; not the task id,
            which a redelivered message shares).
        fencing_token: int, strictly increasing per key across every grant. Pass it to
            downstream writes and let the store refuse a lower one than it has seen.
        task_name, task_id: str.
        ttl, renew_interval: float seconds.
    """

    def __init__(
        self,
        *,
        key: str,
        token: str,
        fencing_token: int,
        task_name: str,
        task_id: str,
        options: LeaseOptions,
        client: redis.Redis,
        target: Target,
        sent_at: float,
    ) -> None:
        self.key = key
        self.token = token
        self.fencing_token = fencing_token
        self.task_name = task_name
        self.task_id = task_id
        self.options = options
        self.ttl = options.ttl
        self.renew_interval = options.renew_interval
        self.client = client
        self.target = target
        self.pid = os.getpid()
        self.acquired_at = sent_at
        self.confirmed_at = sent_at  # send time of the last confirmed grant or renewal
        self.deadline = sent_at + options.ttl - options.drift_margin
        self.next_renewal = sent_at + options.renew_interval
        self.released = False
        self.in_flight = False  # a renewal for it is on the wire (guarded by the heartbeat)
        # The store answered the last renewal with an error (OOM, READONLY after a failover...):
        # if the deadline passes like that, the cause is "store_error", not a silent "deadline".
        self.store_error: Exception | None = None
        self._lost: LeaseLost | None = None
        self._lock = threading.Lock()

    @property
    def expires_in(self) -> float:
        """Float seconds until the local deadline (0.0 once it passed or the lease was lost).

        The local deadline is the send time of the last confirmed renewal plus the TTL minus a
        clock-drift margin, so it falls before the key can expire on the server.
        """
        if self._lost is not None:
            return 0.0
        return max(0.0, self.deadline - clock.now())

    @property
    def lost(self) -> bool:
        """True once the lease is lost: refused by the store, or its local deadline passed."""
        return self._lost is not None or clock.now() >= self.deadline

    @property
    def loss(self) -> LeaseLost | None:
        """The :class:`LeaseLost` describing the loss, or ``None`` while the lease holds."""
        if self._lost is None and clock.now() >= self.deadline:
            self.mark_lost(self.deadline_cause, deliver=False)
        return self._lost

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost; do nothing otherwise.

        Call it before each outside effect where the pool cannot interrupt the body (a greenlet
        that never yields, C code holding the GIL, a blocking call in the threads pool).

        Raises:
            LeaseLost: the lease was refused by the store or its local deadline passed.
        """
        error = self.loss
        if error is not None:
            # The task has the error now: no asynchronous copy may land later (say, in the
            # cleanup it runs while handling this one).
            self.target.finish()
            raise error

    def lose(self, cause: str = LostCause.REFUSED) -> LeaseLost:
        """Declare the lease lost from inside the task and return the error to raise.

        For a task that learns of the loss itself, e.g. when a fenced downstream write is
        refused: the loss is logged, signalled and reported to Flower like any other.

        Args:
            cause: one of :class:`~celery_lease.errors.LostCause` (str).

        Returns:
            The :class:`LeaseLost` (the earlier one if the lease was already lost).
        """
        self.mark_lost(cause, deliver=False)
        self.target.finish()  # the task raises it itself: no asynchronous copy after this
        error = self._lost
        if error is None:  # released already: describe it anyway
            error = LeaseLost(self.key, cause, self.fencing_token, 0.0)
        return error

    @property
    def deadline_cause(self) -> str:
        """The cause to report when the local deadline passes: ``store_error`` when the store
        refused the last renewal with an error reply, else ``deadline``."""
        return LostCause.STORE_ERROR if self.store_error is not None else LostCause.DEADLINE

    def confirm(self, sent_at: float) -> None:
        """Record a renewal confirmed by the store (``sent_at``: clock seconds when sent)."""
        self.confirmed_at = sent_at
        self.store_error = None
        self.deadline = sent_at + self.ttl - self.options.drift_margin
        self.next_renewal = sent_at + self.renew_interval

    def mark_lost(self, cause: str, *, deliver: bool = True) -> LeaseLost | None:
        """Record the loss once: log it, send :data:`~celery_lease.signals.lease_lost`, and (from
        the heartbeat) raise :class:`LeaseLost` in the execution. Returns the new error, or
        ``None`` when the lease was already lost or released.
        """
        now = clock.now()
        late = now - self.confirmed_at if cause == LostCause.REFUSED else now - self.deadline
        with self._lock:
            if self._lost is not None or self.released:
                return None
            error = self._lost = LeaseLost(self.key, cause, self.fencing_token, max(late, 0.0))
        logger.warning(
            "lease lost: key=%s cause=%s task=%s[%s] fencing_token=%d late=%.3fs "
            "since_renewal=%.3fs", self.key, cause, self.task_name, self.task_id,
            self.fencing_token, max(late, 0.0), now - self.confirmed_at,
        )
        if deliver:
            self.target.deliver(error)
        try:
            signals.lease_lost.send(
                sender=self.task_name, key=self.key, token=self.token,
                fencing_token=self.fencing_token, task_id=self.task_id, cause=cause,
                late=max(late, 0.0), error=error)
        except Exception:  # pragma: no cover - Signal.send already guards receivers
            logger.exception("lease_lost receiver failed")
        return error

    def __repr__(self) -> str:
        state = "lost" if self._lost else "released" if self.released else "held"
        return f"<Lease {self.key} fence={self.fencing_token} {state}>"
