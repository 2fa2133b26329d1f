"""The leader election of one ``celery beat`` process: :class:`BeatLeader`.

Used by :class:`celery_lease.beat.scheduler.LeasedScheduler` (see that module for the behaviour).
The leader lease is an ordinary lease (:func:`celery_lease.core.lifecycle.take` and
:func:`~celery_lease.core.lifecycle.end`); a standby waits for the leader's release on the key's
wake list (:func:`celery_lease.store.wait_for_release`, the wait of a hold), and a leader that
steps down releases with :func:`celery_lease.store.release_and_wake`, so a clean stop hands
over at once instead of at the standby's next try.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import redis
from redis.exceptions import RedisError

from .. import store
from ..base import clock, signals
from ..base.keys import BEAT_TASK_NAME, last_run_key
from ..core import lifecycle
from ..core.lease import Lease
from ..errors import LeaseLost
from ..settings import config
from ..settings.config import BEAT_WHERE, LeaseOptions, LeaseSettings
from ..store import records

__all__ = ["LAST_RUN_PERIODS", "BeatLeader"]

logger = logging.getLogger("celery_lease")

#: The last-run record outlives the last send by this many of the longest period (at least
#: as many ``lease_beat_ttl``): enough for any hand-over, and no record left forever.
LAST_RUN_PERIODS = 10


class _NoInterrupt:
    """Delivery target of the leader lease: nothing to interrupt, the scheduler polls."""

    mechanism = "poll"

    def deliver(self, error: LeaseLost) -> bool:
        return False

    def finish(self) -> None:
        pass


class BeatLeader:
    """The leader election of one beat process (used by :class:`LeasedScheduler`).

    Args:
        app: the Celery app.
        key: the leader lease key.
        options: lease settings (TTL, renew interval, store timeout: float seconds).
        url: the Redis URL of the lease store.
        node: how this process names itself in the holder (default ``beat@<host>``).
    """

    def __init__(
        self, app: Any, key: str, options: LeaseOptions, url: str, node: str | None = None
    ) -> None:
        self.app = app
        self.key = key
        self.state_key = last_run_key(key)
        self.options = options
        self.url = url
        self.settings = LeaseSettings(
            options, url, config.check_process_settings(app.conf, BEAT_WHERE)
        )
        self.node = node or f"beat@{socket.gethostname()}"
        self.lease: Lease | None = None
        self.terms = 0  # how many times this process became leader
        self._next_try = 0.0
        self._seen_fence = -1  # last leader seen while standby (to log each leader once)
        self._seen_leader = ""  # who that leader was, for the log line of a take-over

    @property
    def client(self) -> redis.Redis:
        """The Redis client of the lease store (process-wide, timeouts = ``store_timeout``)."""
        options = self.options
        return store.client_for(  # type: ignore[no-any-return]
            self.url, options.store_timeout, options.backend_options
        )

    @property
    def is_leader(self) -> bool:
        """True while this process holds the leader lease and its local deadline is ahead."""
        return self.lease is not None and not self.lease.lost

    def poll(self) -> tuple[bool, float]:
        """Keep the election going; call before each scheduler tick.

        Returns:
            ``(leader, delay)``: whether this process may send now, and the float seconds after
            which ``poll`` must run again at the latest.
        """
        lease = self.lease
        if lease is not None:
            if not lease.lost:
                return True, self.options.renew_interval
            self.step_down()
        now = clock.now()
        if now < self._next_try:
            return False, self._next_try - now
        if self._try_acquire():
            return True, self.options.renew_interval
        # Not a whole renew interval: the next try is due when the leader's lifetime ends.
        return False, max(self._next_try - clock.now(), 0.0)

    def _try_acquire(self) -> bool:
        holder = lifecycle.HolderInfo(BEAT_TASK_NAME, self.node, socket.gethostname())
        try:
            got = lifecycle.take(
                self.settings, self.client, self.key, holder, _NoInterrupt(), sender=BEAT_TASK_NAME
            )
        except RedisError as exc:
            # take() reported it to the store's reachability state (store.health), which
            # logs an outage once, with reminders, and its end: here only what beat does.
            logger.debug("beat: staying standby (key=%s): %s", self.key, store.describe(exc))
            self._next_try = clock.now() + self.options.renew_interval
            return False
        if not isinstance(got, Lease):
            self._standby(got)
            return False
        self.lease = got
        self.terms += 1
        # INFO: taking the lead is the normal start of every beat (and of every hand-over);
        # a lost lead is what is logged as a WARNING (step_down).
        logger.info(
            "beat: became leader key=%s token=%s fencing_token=%d ttl=%.3fs node=%s%s",
            self.key,
            got.token,
            got.fencing_token,
            self.options.ttl,
            self.node,
            f" (after {self._seen_leader})" if self._seen_leader else "",
        )
        self._seen_fence, self._seen_leader = -1, ""
        return True

    def _standby(self, found: store.AcquireResult) -> None:
        leader = found.holder
        if leader.fencing_token != self._seen_fence:
            self._seen_fence = leader.fencing_token
            self._seen_leader = f"{leader.task_id or leader.hostname} (pid {leader.pid})"
            logger.info(
                "beat: standby; leader is %s (pid %d) key=%s fencing_token=%d expires_in=%.3fs",
                leader.hostname,
                leader.pid,
                self.key,
                leader.fencing_token,
                found.remaining,
            )
            signals.lease_conflict.send(
                sender=BEAT_TASK_NAME,
                key=self.key,
                task_id=self.node,
                holder_task_id=leader.task_id,
                holder=leader.where,
                remaining=found.remaining,
                policy="standby",
                fencing_token=leader.fencing_token,
                token=leader.token,
            )
        # Ask again the moment the leader's lifetime ends, or at the next interval (a key
        # without a lifetime, remaining < 0, is not retried in a tight loop).
        renew = self.options.renew_interval
        wait = found.remaining + 0.01 if found.remaining >= 0 else renew
        self._next_try = clock.now() + min(wait, renew)

    def step_down(self) -> None:
        """Stop leading: stop renewing, release the lease if still ours (token-checked)."""
        lease, self.lease = self.lease, None
        if lease is None:
            return
        # The release that wakes a standby blocked in wait_released (one hand-over, not a poll).
        ending = lifecycle.end(lease, sender=BEAT_TASK_NAME, release=store.release_and_wake)
        if ending.loss is not None:
            logger.warning(
                "beat: lost leadership, back to standby: key=%s cause=%s fencing_token=%d "
                "held=%.3fs",
                lease.key,
                ending.loss.cause,
                lease.fencing_token,
                ending.held,
            )
        else:
            logger.info(
                "beat: released leadership key=%s fencing_token=%d held=%.3fs",
                lease.key,
                lease.fencing_token,
                ending.held,
            )
        # Let another beat take over first after a loss.
        self._next_try = clock.now() + (self.options.renew_interval if ending.loss else 0.0)

    def wait_released(self, seconds: float) -> bool:
        """Block up to ``seconds`` (float, at most ``renew_interval``) for the leader's release
        (:meth:`step_down` of another beat); True when woken by one, and the next :meth:`poll`
        then tries at once. False on the timeout, and when the store cannot be reached (the
        next :meth:`poll` says so)."""
        options = self.options
        # One waiting client: its reads outlast the longest wait, a renew interval.
        waiting = store.client_for(
            self.url, options.renew_interval + options.store_timeout, options.backend_options
        )
        started = clock.now()
        try:
            woken = store.wait_for_release(waiting, self.key, min(seconds, options.renew_interval))
        except RedisError:
            # Unreachable: sleep the rest as before this wait existed, the try reports it.
            time.sleep(max(seconds - (clock.now() - started), 0.0))
            return False
        if woken:
            self._next_try = 0.0
        return woken

    def record_run(self, name: str, period: float) -> None:
        """Record that the leader sent entry ``name`` just now, on the store's clock, and keep
        the record for :data:`LAST_RUN_PERIODS` times ``period`` (float seconds: the entry's
        wait until its next run) or that many leader TTLs, whichever is longer."""
        lifetime = LAST_RUN_PERIODS * max(period, self.options.ttl)
        try:
            records.record_run(self.client, self.state_key, name, int(lifetime * 1000))
        except RedisError as exc:
            logger.warning(
                "beat: could not record the last run of %s in %s: %s",
                name,
                self.state_key,
                store.describe(exc),
            )

    def last_run_ages(self) -> dict[str, float]:
        """Entry name -> float seconds since its last send by any leader, measured on the
        store's clock; empty when the store cannot be read (logged)."""
        try:
            return records.last_run_ages(self.client, self.state_key)
        except RedisError as exc:
            logger.warning("beat: could not read %s: %s", self.state_key, store.describe(exc))
            return {}
