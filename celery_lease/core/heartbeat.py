"""The heartbeat: one daemon thread per process that renews every lease the process holds.

Each pass, in this order:

1. check local deadlines first (after a process pause this is the first thing that runs) and
   declare every lease past its deadline lost;
2. renew, in one round trip per store, every lease whose renewal is due or would be due within
   half an interval (renewing early is harmless, and it makes leases taken at different times
   share one round trip per interval);
3. sleep until the next renewal or deadline, at most one second: a suspended host does not
   advance the clock the wait uses, but it does advance the deadline clock, so a deadline
   passed during a suspension is seen within a second of resuming.

At each wake-up it also reads the replies of releases written without waiting for them
(:mod:`celery_lease.store.pending`), so none stays unread for more than a second. With no lease
left it waits a second more before it waits for no time limit: back-to-back executions then
neither wake it nor hand the GIL over to it (:meth:`Heartbeat.add` notifies only a thread that
would wake too late).

A round trip is only sent when its timeout ends before the earliest deadline, so the thread is
never stuck in a call when a deadline passes. A refused renewal (token gone or replaced) loses
the lease at once; a failed one (timeout, connection error) is retried until the deadline.

The thread starts lazily in the process that takes a lease (prefork children exist only after
the fork) and is forgotten in a forked child, which never renews or releases its parent's
leases. Under gevent and eventlet the monkey-patched ``threading`` makes it a greenlet.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
from dataclasses import dataclass

from redis.exceptions import RedisError, ResponseError

from .. import store
from ..base import clock, signals
from ..errors import LostCause
from ..store import health, pending, primary
from . import interrupt
from .lease import Lease, begin_renewals, confirm_renewed, end_renewals

__all__ = ["Heartbeat", "Plan", "heartbeat", "plan_pass"]

logger = logging.getLogger("celery_lease")

_MAX_SLEEP = 1.0  # float seconds


@dataclass(frozen=True)
class Plan:
    """What one heartbeat pass does (see :func:`plan_pass`).

    Attributes:
        expired: leases past their local deadline: declared lost, before anything is sent.
        renew: the leases to renew now, in one round trip (all on one client); may be empty.
        wake: clock seconds of the next renewal or deadline, when nothing is sent.
    """

    expired: list[Lease]
    renew: list[Lease]
    wake: float


def plan_pass(leases: list[Lease], now: float) -> Plan:
    """Decide one pass at clock time ``now`` (float seconds). Pure: sends and changes nothing.

    - every lease at or past its deadline is expired, whatever else is due;
    - of the leases of one client, renewal is due when one of them is due; the ones due within
      half an interval ride along (renewing early is harmless, and it makes leases taken at
      different times share one round trip per interval);
    - no round trip is planned whose timeout could still be running at the earliest deadline:
      the pass waits for that deadline instead, declares it, then renews the rest.
    """
    # One loop over the leases (a pass of 10 000 walked them seven times).
    expired: list[Lease] = []
    by_client: dict[int, list[Lease]] = {}
    due_clients: set[int] = set()  # the clients one of whose leases is due
    earliest_deadline = next_renewal = math.inf
    for lease in leases:
        deadline = lease.deadline
        if now >= deadline:
            expired.append(lease)
            continue
        if deadline < earliest_deadline:
            earliest_deadline = deadline
        renewal = lease._next_renewal  # the property's value, without its call
        if renewal < next_renewal:
            next_renewal = renewal
        client = id(lease.client)
        if renewal <= now:
            due_clients.add(client)
        group = by_client.get(client)
        if group is None:
            group = by_client[client] = []
        group.append(lease)
    if not by_client:
        return _plan(expired, [], now)
    wake = min(next_renewal, earliest_deadline)
    for client, group in by_client.items():
        if client not in due_clients:
            continue
        timeout = max(lease.options.store_timeout for lease in group)
        if primary.managed(group[0].client):
            timeout *= 2  # the sentinels confirm the renewals after their reply
        if now + timeout >= earliest_deadline:
            wake = earliest_deadline
            continue
        due = [x for x in group if x._next_renewal - x.renew_interval / 2 <= now]
        return _plan(expired, due, wake)
    return _plan(expired, [], wake)


def _plan(expired: list[Lease], renew: list[Lease], wake: float) -> Plan:
    """``Plan(expired, renew, wake)`` without the frozen dataclass's ``__init__`` (one
    ``object.__setattr__`` per field, on every wake-up: a fifth of an idle pass)."""
    plan: Plan = object.__new__(Plan)
    plan.__dict__.update(expired=expired, renew=renew, wake=wake)
    return plan


class Heartbeat:
    """Renews the leases of one process. Use :func:`heartbeat` to get the process's instance."""

    def __init__(self, block_signal: int | None = None) -> None:
        self._leases: set[Lease] = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._block_signal = block_signal
        # Clock seconds the thread wakes at on its own: +inf while it waits for a lease (after
        # a second with none added), -inf while it is not waiting. add() wakes it only when it
        # would wake too late.
        self._wake_at = -math.inf
        self._changes = 0  # leases added: a pass planned on an older set plans again
        self._idle_changes = -1  # _changes at the last wait for a lease (see _pass)
        self.passes = 0  # renewal round trips sent (for tests and benchmarks)

    def add(self, lease: Lease) -> None:
        """Start renewing ``lease``."""
        with self._cond:
            self._leases.add(lease)
            self._changes += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="celery-lease-heartbeat", daemon=True
                )
                self._thread.start()
            if lease.next_renewal < self._wake_at:  # a thread wake-up costs ~70 µs of CPU
                self._cond.notify_all()

    def wake_for_pending(self) -> None:
        """A release was written whose reply is unread: make sure the thread reads it soon."""
        if math.isfinite(self._wake_at):
            # Read without the lock: a finite wake-up time is set only while the thread is in
            # a wait of at most a second, and the pass that follows it reads the pending
            # replies (the release was queued before this call). Only a thread waiting for
            # no time limit (+inf) needs the notification; -inf (in a pass, or about to wait)
            # is decided under the lock, as before.
            return
        with self._cond:
            if self._wake_at == math.inf:
                self._cond.notify_all()

    def remove(self, lease: Lease) -> None:
        """Stop renewing ``lease``; returns once no renewal of it is on the wire.

        Called before a release is sent, so nothing renews a lease after its release.
        """
        try:
            with self._cond:
                self._leases.discard(lease)
        finally:  # retired whatever interrupts the above: a pass that listed it skips it
            lease.stop_renewing(wait=lease.options.store_timeout * 2)

    def held(self) -> list[Lease]:
        """A snapshot of the leases being renewed."""
        with self._cond:
            return list(self._leases)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        if self._block_signal is not None and hasattr(signal, "pthread_sigmask"):
            # The lease signal is meant for the main thread only.
            signal.pthread_sigmask(signal.SIG_BLOCK, {self._block_signal})
        while True:
            try:
                self._pass()
            except Exception:  # never let the heartbeat die silently
                logger.exception("lease heartbeat pass failed")
                with self._cond:
                    self._cond.wait(_MAX_SLEEP)

    def _pass(self) -> None:
        if pending.has_pending():
            # Releases written without waiting: their replies; one sent again after a broken
            # connection only if its timeout ends before the earliest deadline (see
            # plan_pass). The scan of the deadlines is paid only while one is pending.
            with self._cond:
                earliest = min((lease.deadline for lease in self._leases), default=math.inf)
            pending.settle_all(wait=False, until=earliest)
        with self._cond:
            while not self._leases:
                # Back-to-back executions leave it empty between two of them: a timed wait
                # then lets add() and wake_for_pending() skip the notification (a wake-up and
                # two GIL hand-overs per execution); only a second with no lease added ends
                # in a wait for no time limit.
                idle = self._changes == self._idle_changes and not pending.has_pending()
                self._idle_changes = self._changes
                self._wait(None if idle else _MAX_SLEEP)
                if pending.has_pending():
                    return
            leases = list(self._leases)
            changes = self._changes
        step = plan_pass(leases, clock.now())
        for lease in step.expired:  # deadlines first
            self._drop(lease)
            lease.mark_lost(lease.deadline_cause)
        if step.renew:
            self._renew(step.renew)
            return  # start the next pass with a fresh deadline check
        if step.expired:
            return
        with self._cond:
            if self._leases and self._changes == changes:
                # Longest sleep: one second. A host suspension stops the clock the wait uses
                # but not the deadline clock, so a deadline passed while suspended is seen
                # within a second of resuming (measured: about 3 ms of CPU per 10 s, one lease).
                self._wait(min(max(step.wake - clock.now(), 0.0), _MAX_SLEEP))

    def _wait(self, timeout: float | None) -> None:
        """Wait on the condition (held) for ``timeout`` float seconds (None: until notified)."""
        self._wake_at = math.inf if timeout is None else clock.now() + timeout
        try:
            self._cond.wait(timeout)
        finally:
            self._wake_at = -math.inf

    def _drop(self, lease: Lease) -> None:
        with self._cond:
            self._leases.discard(lease)

    def _renew(self, group: list[Lease]) -> None:
        group = begin_renewals(group)
        if not group:
            return
        sent_at = clock.now()
        answered = True  # the store answered the round trip (and no renewal said otherwise)
        try:
            replies = store.renew_many(
                group[0].client,
                [x._renew_args for x in group],
                max(x.options.min_replicas for x in group),
                [i for i, x in enumerate(group) if x.limit > 1],
            )  # lease_limit's slots
            self.passes += 1
        except RedisError as exc:
            replies = [exc] * len(group)
            answered = not health.is_unreachable(exc)
        finally:
            end_renewals(group)
        replied_at = clock.now()
        # Sent per lease per pass: skipped as a whole when nobody listens (10 000 leases).
        confirmed: list[Lease] | None = None
        if signals.lease_renewed.receivers:
            confirmed, before = [], {id(lease): lease.deadline for lease in group}
        rest = confirm_renewed(group, replies, sent_at, confirmed)
        for lease in confirmed or ():
            signals.lease_renewed.send(
                sender=lease.task_name,
                key=lease.key,
                token=lease.token,
                fencing_token=lease.fencing_token,
                task_id=lease.task_id,
                latency=replied_at - sent_at,
                margin=before[id(lease)] - replied_at,
            )
        for lease, answer in rest:
            if isinstance(answer, RedisError):
                answered = not self._failed(lease, answer) and answered
            else:  # 0: the key is gone; -1: another token holds it
                self._drop(lease)
                # A take-over whose notice was lost (lease_on_conflict="preempt"): the new
                # holder names this token, and the loss is a preemption all the same.
                taken = (
                    answer == -1
                    and lease.options.on_conflict == "preempt"
                    and store.was_preempted(lease.client, lease.key, lease.token)
                )
                lease.mark_lost(LostCause.PREEMPTED if taken else LostCause.REFUSED)
        reachable = group[0].reachable
        if answered and reachable is not None:
            reachable.answered()  # no outage: returns at once, no lock taken

    def _failed(self, lease: Lease, error: RedisError) -> bool:
        """Schedule the retry of ``lease``'s failed renewal, log it, send its signal.

        Returns:
            True when ``error`` says the store could not be reached (:mod:`.store.health`).
        """
        now = clock.now()
        # Try again soon (the pass sends it only while it can finish before the deadline). An
        # error reply is remembered: the store answered, so a passed deadline is its doing.
        lease.renewal_failed(
            now + min(lease.renew_interval / 3, _MAX_SLEEP),
            error if isinstance(error, ResponseError) else None,
        )
        # An unreachable store is logged once per outage by its reachability state, and a
        # failed renewal is retried every second: each try is only worth a DEBUG line.
        reachable = lease.reachable
        if reachable is not None:
            unreachable = reachable.failed(error, f"renewal of {lease.key}")
        else:
            unreachable = health.is_unreachable(error)
        logger.log(
            logging.DEBUG if unreachable else logging.WARNING,
            "lease renewal failed: key=%s task=%s[%s] fencing_token=%d error=%s time_left=%.3fs",
            lease.key,
            lease.task_name,
            lease.task_id,
            lease.fencing_token,
            store.describe(error),
            lease.deadline - now,
        )
        signals.lease_renewal_failed.send(
            sender=lease.task_name,
            key=lease.key,
            token=lease.token,
            fencing_token=lease.fencing_token,
            task_id=lease.task_id,
            error=error,
            time_left=lease.deadline - now,
        )
        return unreachable


_instance: Heartbeat | None = None
_instance_lock = threading.Lock()


def heartbeat(block_signal: int | None = None) -> Heartbeat:
    """The heartbeat of the calling process (created on first use, and anew after a fork)."""
    global _instance
    found = _instance
    if found is not None:  # a forked child starts without its parent's (the fork hook below)
        return found
    with _instance_lock:
        if _instance is None:
            _instance = Heartbeat(block_signal)
        return _instance


def _after_fork_in_child() -> None:
    global _instance, _instance_lock
    # The parent's thread does not exist here; its leases are not ours to renew or release.
    _instance = None
    _instance_lock = threading.Lock()
    interrupt.reset_after_fork()  # store clients: celery_lease.store.connection's own fork hook


if hasattr(os, "register_at_fork"):  # no fork hooks: no fork either (Windows)
    os.register_at_fork(after_in_child=_after_fork_in_child)
