"""High-availability ``celery beat``: several beat processes, one leader, elected by a lease.

Run every beat process with the same app and ``-S celery_lease.beat:LeasedScheduler`` (or set
``beat_scheduler = "celery_lease.beat:LeasedScheduler"``). Each wraps the scheduler it would
have used otherwise (``lease_beat_scheduler``, else the configured ``beat_scheduler``, else
Celery's ``PersistentScheduler``) and only the process holding the leader lease lets it send:

- the leader lease is an ordinary lease (the same acquire, renew and release scripts, the
  same heartbeat thread and the same loss rules as a task's lease);
- a standby tries to take it whenever the leader's lifetime runs out (it asks again at the
  moment the store says the key expires), so it takes over within one ``lease_beat_ttl`` of
  the leader dying or pausing; between two tries it blocks on the key's wake list, the one a
  hold's waiter blocks on (:func:`celery_lease.store.wait_for_release`), and a leader that
  stops cleanly releases with :func:`celery_lease.store.release_and_wake`, so a standby
  takes over at once rather than at its next try (one standby is woken per release);
- before **every** send the leader checks that its lease still holds (refused by the store, or
  past its local deadline); the moment it does not, it stops sending, logs the loss, sends
  :data:`~celery_lease.base.signals.lease_lost` and goes back to standby. The process never exits
  because of a loss, so a supervisor does not see a crash loop;
- the leader records when it last sent each entry in Redis (``<lease key>:last-run``),
  stamped with the store's clock (``TIME``), never its own. A beat that takes over reads how
  long ago each entry ran, on that clock, onto its own timeline, so whatever the hosts' wall
  clocks say it neither repeats runs the previous leader sent nor skips one that fell due
  during the hand-over (sent once, as Celery does after any restart). Before each send the
  record is read again: a wrapped scheduler that re-read older times from its own storage
  (django-celery-beat's database after a schedule change) does not send an entry again. The
  record lives :data:`LAST_RUN_PERIODS` times the longest period, refreshed at every send.
  A stop (SIGTERM, SIGINT) that arrives during a send is held until its record is written:
  ``celery beat``'s handler releases the lease at once, and a standby leading before the
  record would send the entry again.

A check-then-send can still race with a pause that hits between the check and the send; the
window is one ``apply_async`` call. Tasks that must never overlap should also be
:class:`~celery_lease.LeasedTask` tasks: the task lease is the guard, the beat lease keeps the
schedule from firing twice. Settings (``lease_beat_scheduler``, ``lease_beat_ttl``,
``lease_beat_renew_interval``, ``lease_beat_key``): docs/reference/settings.md.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from celery.utils.imports import load_extension_class_names, symbol_by_name

from ..base.keys import BEAT_TASK_NAME, beat_leader_key
from ..errors import LeaseConfigError, LeaseStartRefused
from ..settings import config
from ..settings.config import BEAT_WHERE, DEFAULTS
from .leader import LAST_RUN_PERIODS, BeatLeader

__all__ = ["BEAT_TASK_NAME", "LAST_RUN_PERIODS", "BeatLeader", "LeasedScheduler", "beat_lease_key"]

logger = logging.getLogger("celery_lease")

_DEFAULT_INNER = "celery.beat:PersistentScheduler"

#: Float seconds: a send this close to the due time of the last recorded one is its own.
RESEND_SLACK = 1.0
#: What ``celery beat`` installs its stop handler on (it closes the scheduler, then exits).
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_SELF_NAMES = (
    "celery_lease.beat:LeasedScheduler",
    "celery_lease.beat.LeasedScheduler",
    "celery_lease.beat.scheduler:LeasedScheduler",
    "celery_lease.beat.scheduler.LeasedScheduler",
)


def beat_lease_key(app: Any) -> str:
    """The leader lease key of ``app``'s beat: ``lease_beat_key``, else one derived from the
    app's name (``Celery("proj")`` leads ``lease:{celery.beat:proj}``).

    Every beat of one app must share the key, and two apps must not: an app created without a
    name (``Celery()``, or ``__main__`` when the module runs as a script) has nothing to tell it
    from another app on the same Redis, so no key is guessed for it.

    Raises:
        LeaseConfigError: no ``lease_beat_key`` and the app has no name of its own.
    """
    configured = app.conf.get("lease_beat_key")
    if configured:
        return str(configured)
    main = app.main
    if not main or main == "__main__":
        raise LeaseConfigError(
            f"{BEAT_WHERE}: the app has no name (main={main!r}: created as Celery() or run as "
            f"a script), so its default leader key would be the same as that of any other "
            f"unnamed app on this Redis, and only one of their beats would ever send. Set "
            f"lease_beat_key (e.g. app.conf.lease_beat_key = 'lease:{{celery.beat:proj}}'), "
            f"the same for every beat of this app, or name the app: Celery('proj')"
        )
    prefix = app.conf.get("lease_key_prefix") or DEFAULTS["lease_key_prefix"]
    return beat_leader_key(prefix, main)


def _inner_class(app: Any) -> type:
    configured = app.conf.get("lease_beat_scheduler")
    if not configured:
        configured = app.conf.get("beat_scheduler") or _DEFAULT_INNER
        if configured in _SELF_NAMES or configured is LeasedScheduler:
            configured = _DEFAULT_INNER
    if isinstance(configured, type):
        inner: type = configured
    else:
        aliases = dict(load_extension_class_names("celery.beat_schedulers") or ())
        inner = symbol_by_name(configured, aliases=aliases)
    if inner is LeasedScheduler:
        raise LeaseConfigError(
            "lease_beat_scheduler names LeasedScheduler itself; set it to the scheduler to "
            "wrap, e.g. 'celery.beat:PersistentScheduler'"
        )
    return inner


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[None]:
    """Hold the signals ``celery beat`` stops on (SIGTERM, SIGINT) for the block, and deliver
    them after it. Only in the main thread (Python runs signal handlers there, and only there
    can they be replaced), and only a handler set from Python is replaced."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held: dict[signal.Signals, Any] = {}
    for stop in _STOP_SIGNALS:
        if callable(signal.getsignal(stop)):
            held[stop] = signal.signal(stop, lambda number, _frame: caught.append(number))
    try:
        yield
    finally:
        for stop, handler in held.items():
            signal.signal(stop, handler)
        for number in dict.fromkeys(caught):
            signal.raise_signal(number)  # its handler runs now, as if it came now


class LeasedScheduler:
    """A beat scheduler that only sends while this process holds the beat leader lease.

    Use with ``celery beat -S celery_lease.beat:LeasedScheduler``. Every attribute it does not
    define is the wrapped scheduler's (``self.inner``), so ``celery beat`` and other tools see
    the wrapped scheduler's schedule, ``info`` and sync behaviour.

    Args:
        app: the Celery app.
        lazy: ``celery beat`` builds a lazy instance for its banner: no election happens.
        **kwargs: passed to the wrapped scheduler (``schedule_filename``, ``max_interval``...).

    Raises:
        LeaseStartRefused: (a ``LeaseConfigError``) when built, lazily or not: an app without
            a name and no ``lease_beat_key``, invalid ``lease_beat_*`` settings, or no Redis
            URL.
    """

    def __init__(self, app: Any, lazy: bool = False, **kwargs: Any) -> None:
        self.app = app
        try:
            # Refused before anything is built, lazy instance included: `celery beat` builds
            # that one for its banner outside the block that logs a start error with its
            # traceback, so Click prints the refusal as one line and exits.
            beat_lease_key(app)
            config.beat_settings(app.conf)
        except LeaseConfigError as exc:
            raise LeaseStartRefused("beat", str(exc)) from None
        self.inner: Any = _inner_class(app)(app=app, lazy=lazy, **kwargs)
        self.leader: BeatLeader | None = None
        self._lazy = lazy
        self._was_leader = False
        # The guard sits on the send itself: Celery's apply_entry calls apply_async, and
        # schedulers such as RedBeat call apply_async directly.
        send: Callable[..., Any] = self.inner.apply_async
        self._send = send
        self.inner.apply_async = self._apply_async

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet: avoid recursing
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _election(self) -> BeatLeader:
        if self.leader is None:
            options, url, _ = config.beat_settings(self.app.conf)
            self.leader = BeatLeader(self.app, beat_lease_key(self.app), options, url)
            logger.info(
                "beat: leader election on key=%s ttl=%.3fs renew_interval=%.3fs",
                self.leader.key,
                options.ttl,
                options.renew_interval,
            )
        return self.leader

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One scheduler iteration: keep the election going, and tick the wrapped scheduler
        only while leading. Returns float seconds to sleep before the next tick."""
        leader = self._election()
        leading, poll_in = leader.poll()
        if leading and not self._was_leader:
            self._take_over(leader)
        self._was_leader = leading
        if not leading:
            # Standby: wait for the leader's release instead of sleeping, then poll again.
            wait = max(min(poll_in, float(self.inner.max_interval)), 0.0)
            if wait > 0.0:
                leader.wait_released(wait)
            return 0.0
        delay = float(self.inner.tick(*args, **kwargs))
        if not leader.is_leader:  # lost during the tick: notice it at once
            return 0.0
        return float(min(delay, poll_in))

    def _take_over(self, leader: BeatLeader) -> None:
        """Load the last runs the previous leaders recorded into the wrapped schedule: how
        long ago each ran, on the store's clock, placed on this host's timeline (``app.now()``,
        which the wrapped scheduler compares with), whatever the leader's wall clock said."""
        ages = leader.last_run_ages()
        if not ages:
            return
        now = self.app.now()
        updated = 0
        schedule = self.inner.schedule
        for name, entry in list(schedule.items()):
            age = ages.get(name)
            if age is None:
                continue
            at = now - _dt.timedelta(seconds=age)
            mine = entry.last_run_at.timestamp() if entry.last_run_at is not None else 0.0
            if at.timestamp() > mine:
                entry.last_run_at = at
                schedule[name] = entry
                updated += 1
        if updated:
            self.inner.populate_heap()  # the next due entries follow the loaded times
            logger.info("beat: loaded %d last-run time(s) from %s", updated, leader.state_key)

    def _apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        leader = self.leader
        if leader is None or not leader.is_leader:
            logger.warning(
                "beat: not sending %s (%s): this beat no longer holds the leader lease",
                entry.name,
                entry.task,
            )
            return None
        if self._sent_lately(leader, entry):
            logger.warning("beat: not sending %s: by its last-run record not due yet", entry.name)
            self._take_over(leader)  # the wrapped scheduler's times are older: load them again
            return None
        # A send and its record are one step for a beat told to stop: celery beat's handler
        # steps down at once, and a standby leading before the record would send it again.
        with _stop_signals_held():
            result = self._send(entry, producer=producer, advance=advance, **kwargs)
            leader.record_run(entry.name, self._period(entry))
        return result

    def _sent_lately(self, leader: BeatLeader, entry: Any) -> bool:
        """Whether the store's last-run record says ``entry`` is due in over RESEND_SLACK s."""
        age = leader.last_run_ages().get(entry.name)
        try:
            due, wait = entry.schedule.is_due(self.app.now() - _dt.timedelta(seconds=age or 0))
        except Exception:  # a third-party schedule that cannot say: sent, as before
            return False
        return age is not None and not due and float(wait) > RESEND_SLACK

    def _period(self, entry: Any) -> float:
        """Float seconds from now to ``entry``'s next run, by its schedule's own ``is_due``
        (an interval's period, a crontab's gap to its next match); 0.0 if it cannot say."""
        try:
            return max(float(entry.schedule.is_due(self.app.now())[1]), 0.0)
        except Exception:  # a third-party schedule: the record then lives LAST_RUN_PERIODS TTLs
            return 0.0

    @property
    def info(self) -> str:
        """The wrapped scheduler's banner info plus the leader lease key."""
        inner = str(getattr(self.inner, "info", "") or "")
        line = f"    . leader lease -> {beat_lease_key(self.app)}"
        return f"{inner}\n{line}" if inner else line

    def close(self) -> None:
        """Step down (releasing the lease so a standby takes over now) and close the
        wrapped scheduler."""
        if self.leader is not None:
            self.leader.step_down()
        self.inner.close()
