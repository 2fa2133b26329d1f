"""The lease held by one running execution: ``self.lease`` and :func:`current_lease`."""

from __future__ import annotations

import contextvars
import logging
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..base import clock, process, signals
from ..errors import LeaseLost, LostCause

if TYPE_CHECKING:
    import redis

    from ..settings.config import LeaseOptions
    from ..store.health import Reachability
    from .interrupt import Target

__all__ = ["Lease", "begin_renewals", "confirm_renewed", "current_lease", "end_renewals"]

logger = logging.getLogger("celery_lease")

_current: contextvars.ContextVar[Lease | None] = contextvars.ContextVar(
    "celery_lease_current", default=None
)


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
        acquired_at: deadline-clock seconds (:func:`celery_lease.base.clock.now`) of the first send
            of the acquire.
        confirmed_at: deadline-clock seconds of the send of the last confirmed grant or renewal.
        deadline: deadline-clock seconds at which the lease counts as lost locally.
        limit: the key's ``lease_limit`` this lease holds one slot of (int; 1, the plain
            lease; set at the grant by :func:`celery_lease.core.lifecycle.take`).
        joined: the latest message (JSON str) of a duplicate that joined this handed-over
            ``coalesce`` run before it started, whose arguments the run takes
            (:attr:`celery_lease.store.AcquireResult.joined`); else None.
        reachable: this process's :class:`~celery_lease.store.health.Reachability` of the
            lease's store, which the heartbeat reports its renewals to; None: not reported.

    State and who changes it: the execution that took it and the heartbeat thread both act on
    a lease, only through its methods, and every change happens under the lease's own lock
    (:meth:`stop_renewing` waits for a renewal on the wire on an event made only then: rare,
    and a condition variable per execution costs more than the rest of the object). The
    float fields are read without the lock: a reader sees the old or the new value, both of
    which were true a moment ago.
    """

    # Slots: one is made per execution (and 10 000 may be held): a third less to build.
    __slots__ = (
        "_in_flight",
        "_lost",
        "_next_renewal",
        "_renew_args",
        "_renewal_over",
        "_retired",
        "_state",
        "_store_error",
        "acquired_at",
        "client",
        "confirmed_at",
        "deadline",
        "fencing_token",
        "joined",
        "key",
        "limit",
        "options",
        "pid",
        "reachable",
        "renew_interval",
        "target",
        "task_id",
        "task_name",
        "token",
        "ttl",
    )

    def __init__(  # noqa: PLR0913 - keyword-only facts of a grant (core.lifecycle.take)
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
        joined: str | None = None,
        reachable: Reachability | None = None,
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
        self.pid = process.pid()
        self.acquired_at = sent_at
        self.confirmed_at = sent_at  # send time of the last confirmed grant or renewal
        self.deadline = sent_at + options.ttl - options.drift_margin
        self._next_renewal = sent_at + options.renew_interval
        self._retired = False
        self._in_flight = False
        self._store_error: Exception | None = None
        self._lost: LeaseLost | None = None
        self._state = threading.Lock()
        # What a renewal sends (celery_lease.store.renew_many), built once, not every pass.
        self._renew_args = (key, token, options.ttl_ms)
        self.limit = 1  # set by the grant of a slot (lease_limit)
        self.joined = joined  # the latest message of a duplicate that joined (coalesce)
        self.reachable = reachable
        # Set when the renewal on the wire ends; made by a stop_renewing() that waits for it.
        self._renewal_over: threading.Event | None = None

    # -- state, read-only from outside -------------------------------------------------------

    @property
    def next_renewal(self) -> float:
        """Deadline-clock seconds at which the heartbeat should renew this lease next."""
        return self._next_renewal

    @property
    def in_flight(self) -> bool:
        """True while a renewal of this lease is on the wire."""
        return self._in_flight

    @property
    def store_error(self) -> Exception | None:
        """The error reply the store gave the last renewal (OOM, READONLY after a failover...),
        or ``None`` after a confirmed one: if the deadline passes like that, the cause is
        ``store_error``, not a silent ``deadline``."""
        return self._store_error

    @property
    def retired(self) -> bool:
        """True once the holder stopped renewing (the lease is being or has been released)."""
        return self._retired

    @property
    def released(self) -> bool:
        """Deprecated alias of :attr:`retired` (it never meant "the store deleted the key")."""
        warnings.warn(
            "Lease.released is deprecated; use Lease.retired", DeprecationWarning, stacklevel=2
        )
        return self._retired

    # -- state changes ------------------------------------------------------------------------

    def begin_renewal(self) -> bool:
        """Mark a renewal as being sent. Returns False (and marks nothing) once retired."""
        with self._state:
            if self._retired:
                return False
            self._in_flight = True
            return True

    def end_renewal(self) -> None:
        """The renewal begun by :meth:`begin_renewal` has its answer (or failed)."""
        with self._state:
            self._in_flight = False
            over = self._renewal_over
        if over is not None:
            over.set()

    def confirm(self, sent_at: float) -> None:
        """Record a renewal confirmed by the store (``sent_at``: clock seconds when sent)."""
        with self._state:
            self.confirmed_at = sent_at
            self._store_error = None
            self.deadline = sent_at + self.ttl - self.options.drift_margin
            self._next_renewal = sent_at + self.renew_interval

    def renewal_failed(self, retry_at: float, error_reply: Exception | None) -> None:
        """Record a renewal that proved nothing: try again at ``retry_at`` (clock seconds).

        Args:
            retry_at: when the next try is due, deadline-clock seconds.
            error_reply: the store's error reply, or ``None`` when it did not answer at all.
        """
        with self._state:
            if error_reply is not None:
                self._store_error = error_reply
            self._next_renewal = retry_at

    def stop_renewing(self, wait: float) -> None:
        """Retire the lease: nothing renews it from now on. Returns once no renewal of it is
        on the wire, or after ``wait`` float seconds; called before its release is sent."""
        with self._state:
            self._retired = True
            if not self._in_flight:
                return
            # Rare: a renewal is on the wire right now. end_renewal() sets the event once it
            # is over (it reads it under the lock, so it cannot miss one made here).
            over = self._renewal_over = self._renewal_over or threading.Event()
        over.wait(wait)

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

    def detect_loss(self) -> LeaseLost | None:
        """The :class:`LeaseLost` describing the loss, or ``None`` while the lease holds.

        A local deadline that passed unnoticed (a starved heartbeat) is recorded as a loss here,
        with its log line and :data:`~celery_lease.base.signals.lease_lost` signal.
        """
        if self._lost is None and clock.now() >= self.deadline:
            self.mark_lost(self.deadline_cause, deliver=False)
        return self._lost

    @property
    def loss(self) -> LeaseLost | None:
        """Deprecated: use :meth:`detect_loss` (this property records a passed deadline)."""
        warnings.warn(
            "Lease.loss is deprecated; use Lease.detect_loss()", DeprecationWarning, stacklevel=2
        )
        return self.detect_loss()

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost; do nothing otherwise.

        Call it before each outside effect where the pool cannot interrupt the body (a greenlet
        that never yields, C code holding the GIL, a blocking call in the threads pool).

        Raises:
            LeaseLost: the lease was refused by the store or its local deadline passed.
        """
        error = self.detect_loss()
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
        return LostCause.STORE_ERROR if self._store_error is not None else LostCause.DEADLINE

    def mark_lost(self, cause: str, *, deliver: bool = True) -> LeaseLost | None:
        """Record the loss once: log it, send :data:`~celery_lease.base.signals.lease_lost`, and
        (from the heartbeat) raise :class:`LeaseLost` in the execution. Returns the new error, or
        ``None`` when the lease was already lost or released.
        """
        now = clock.now()
        late = now - self.confirmed_at if cause == LostCause.REFUSED else now - self.deadline
        with self._state:
            if self._lost is not None or self._retired:
                return None
            error = self._lost = LeaseLost(self.key, cause, self.fencing_token, max(late, 0.0))
        if deliver:
            self.target.deliver(error)
        self._announce_loss(error, now, "lease lost")
        return error

    def lost_at_release(self) -> LeaseLost:
        """Record a loss that the release found: the key was no longer this execution's
        (deleted, evicted or expired since the last confirmed renewal) although no loss had
        been seen. Logged and signalled like any loss (cause ``refused``); nothing is
        delivered, the execution has ended. Returns the error.
        """
        now = clock.now()
        error = LeaseLost(
            self.key, LostCause.REFUSED, self.fencing_token, max(now - self.confirmed_at, 0.0)
        )
        with self._state:
            self._lost = self._lost or error
        self._announce_loss(error, now, "lease lost, found at release")
        return error

    def _announce_loss(self, error: LeaseLost, now: float, what: str) -> None:
        logger.warning(
            "%s: key=%s cause=%s task=%s[%s] fencing_token=%d late=%.3fs since_renewal=%.3fs",
            what,
            self.key,
            error.cause,
            self.task_name,
            self.task_id,
            self.fencing_token,
            error.late,
            now - self.confirmed_at,
        )
        try:
            signals.lease_lost.send(
                sender=self.task_name,
                key=self.key,
                token=self.token,
                fencing_token=self.fencing_token,
                task_id=self.task_id,
                cause=error.cause,
                late=error.late,
                error=error,
            )
        except Exception:  # pragma: no cover - Signal.send already guards receivers
            logger.exception("lease_lost receiver failed")

    def __repr__(self) -> str:
        state = "lost" if self._lost else "retired" if self._retired else "held"
        return f"<Lease {self.key} fence={self.fencing_token} {state}>"


# -- a renewal pass's state changes, one loop each ---------------------------------------------
# What Lease.begin_renewal, end_renewal and confirm do, for every lease of a pass, each change
# under that lease's own lock, without a method call per lease: a pass of 10 000 leases.


def begin_renewals(leases: Sequence[Lease]) -> list[Lease]:
    """:meth:`Lease.begin_renewal` for each of ``leases``; returns those marked (not retired)."""
    begun = []
    for lease in leases:
        with lease._state:
            if lease._retired:
                continue
            lease._in_flight = True
        begun.append(lease)
    return begun


def end_renewals(leases: Sequence[Lease]) -> None:
    """:meth:`Lease.end_renewal` for each of ``leases``."""
    for lease in leases:
        with lease._state:
            lease._in_flight = False
            over = lease._renewal_over
        if over is not None:
            over.set()


def confirm_renewed(
    leases: Sequence[Lease],
    replies: Sequence[object],
    sent_at: float,
    confirmed: list[Lease] | None = None,
) -> list[tuple[Lease, object]]:
    """:meth:`Lease.confirm` (``sent_at``: clock seconds when sent) for each lease not retired
    whose reply is ``1``, each appended to ``confirmed`` when given; returns the ``(lease,
    reply)`` pairs of the others not retired (a refusal or an error), in order, for the caller
    to handle."""
    rest: list[tuple[Lease, object]] = []
    drift: dict[int, float] = {}  # per options object: its drift_margin, computed once
    for lease, reply in zip(leases, replies, strict=True):
        if lease._retired:
            continue
        if reply != 1:
            rest.append((lease, reply))
            continue
        options = lease.options
        margin = drift.get(id(options))
        if margin is None:
            margin = drift[id(options)] = options.drift_margin
        with lease._state:
            lease.confirmed_at = sent_at
            lease._store_error = None
            lease.deadline = sent_at + lease.ttl - margin
            lease._next_renewal = sent_at + lease.renew_interval
        if confirmed is not None:
            confirmed.append(lease)
    return rest
