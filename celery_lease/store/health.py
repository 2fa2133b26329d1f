"""Whether this process can reach each lease store, and the few log lines that say so.

Every part of a process that talks to a store (a task's acquire, the heartbeat's renewals of
the leases held, the hand-over sweep, beat's leader election, the worker's start check, a
failed release) reports here instead of logging each failed call,
so an outage reads as three kinds of WARNING:

- one when a store stops answering: ``lease store redis://:**@host:6379/0 is unreachable
  (seen by <what noticed>: <error>); ...``;
- reminders while it lasts, ``lease store ... still unreachable after 30.2s (<n> failed
  calls; last seen by ...)``: :data:`FIRST_REMINDER` (30.0) seconds into the outage, then
  after gaps that double (60 s, 120 s, ...), at most :data:`MAX_REMINDER_GAP` (600.0) s apart;
- one when it answers again, with the outage's length as this process saw it, from its
  first failed call to its first answer, in float seconds, and how long before that answer
  its last failed call was (a process idle meanwhile learns of the end late): ``lease store
  ... is reachable again after 42.7s (<n> failed calls, the last 0.4s ago)``. A WARNING,
  not INFO, so that a worker run at ``-l warning`` shows the end of what it showed the start
  of.

A process that makes no call for a while cannot tell whether the store answered meanwhile: a
failure more than :data:`NEW_OUTAGE_AFTER` (30.0) seconds after its previous failed call,
with no call in between, begins a new outage, logged as the first one was with ``; this
process made no call in the 41.2s since its previous failed call, whose outage it did not see
end`` added in the parentheses (the earlier one has no "reachable again" line). Whatever
keeps calling during an outage calls more often than that: a held lease's renewal, tried at
most a second apart, the sweep every pass, an execution waiting the outage out, tried again
at most 30 s apart (:data:`celery_lease.execution.outage.MAX_WAIT`), if by the same process.

Only errors that say the store could not be reached count (:func:`is_unreachable`: refused
or broken connections, timeouts); a store that answers with an error is reachable, and that
error is logged where it happens. The state is per process (a prefork child starts its own,
with no outage) and per store URL, and guarded by a lock: reports come from pool threads,
greenlets and the sweep thread at once. Store URLs are logged through
:func:`celery_lease.store.url.safe_url` (passwords masked).
"""

from __future__ import annotations

import logging
import threading

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..base import clock, process
from .errors import describe
from .url import safe_url

__all__ = [
    "FIRST_REMINDER",
    "MAX_REMINDER_GAP",
    "NEW_OUTAGE_AFTER",
    "Reachability",
    "is_unreachable",
    "never_reached",
    "reachability",
]

logger = logging.getLogger("celery_lease")

#: Float seconds from the start of an outage to its first reminder; each next gap doubles.
FIRST_REMINDER = 30.0
#: The longest gap between two reminders, float seconds.
MAX_REMINDER_GAP = 600.0

#: Float seconds without a call after which this process's next failure begins a new outage.
NEW_OUTAGE_AFTER = 30.0

#: Set on an error once reported, so that a caller further up reporting it too counts it once.
_COUNTED = "_lease_reachability_counted"


def is_unreachable(error: BaseException) -> bool:
    """True when ``error`` says the store could not be reached (a refused, reset or broken
    connection, a timeout, a Sentinel that names no primary), not that it answered with an
    error."""
    return isinstance(error, RedisConnectionError | RedisTimeoutError)


def never_reached(error: BaseException) -> bool:
    """True when ``error`` was raised before a command could be written: the connection
    was refused or timed out while connecting, or no primary is known. A command that
    failed so cannot have run on the store; any other error leaves that open (a read that
    timed out after the write may follow a command the server ran)."""
    if not is_unreachable(error):
        return False
    if isinstance(error.__cause__, ConnectionRefusedError):
        return True
    text = str(error)
    return (
        text.startswith("Timeout connecting")
        or " connecting to " in text
        or (type(error).__name__ == "MasterNotFoundError")
    )


class Reachability:
    """Whether one store answers, as this process last saw it (see the module docstring).

    Args:
        url: the store's URL (logged masked).
    """

    def __init__(self, url: str) -> None:
        self.name = safe_url(url)
        self._lock = threading.Lock()
        self._down_since: float | None = None  # clock.now() of the outage's first failure
        self._next_reminder = 0.0
        self._gap = FIRST_REMINDER
        self._failures = 0
        self._last_failure = 0.0  # clock.now() of the latest

    @property
    def down(self) -> bool:
        """True from a failure that :func:`is_unreachable` counts until the next answer."""
        return self._down_since is not None

    def failed(self, error: BaseException, what: str) -> bool:
        """Report a failed call (``what``: who called, e.g. ``"acquire of <key>"``).

        Errors :func:`is_unreachable` does not count are ignored, and an error already
        reported (by a callee) is not counted again. Logs the outage's first failure and the
        reminders due.

        Returns:
            True when ``error`` counts as the store being unreachable.
        """
        if not is_unreachable(error):
            return False
        if getattr(error, _COUNTED, False):  # reported on its way up already: counted once
            return True
        setattr(error, _COUNTED, True)
        now = clock.now()
        with self._lock:
            started, quiet = self._down_since, None
            if started is not None and now - self._last_failure > NEW_OUTAGE_AFTER:
                # No call since: whether the store answered meanwhile is unknown.
                started, quiet, self._failures = None, now - self._last_failure, 0
            self._failures += 1
            self._last_failure = now
            if started is None:
                self._down_since, self._gap = now, FIRST_REMINDER
                self._next_reminder = now + FIRST_REMINDER
            elif now >= self._next_reminder:
                self._gap = min(self._gap * 2, MAX_REMINDER_GAP)
                self._next_reminder = now + self._gap
            else:
                return True
            failures = self._failures
        if started is None:
            self._log_start(error, what, quiet)
        else:
            logger.warning(
                "lease store %s still unreachable after %.1fs (%d failed calls; last seen by "
                "%s: %s)",
                self.name,
                now - started,
                failures,
                what,
                describe(error),
            )
        return True

    def _log_start(self, error: BaseException, what: str, quiet: float | None) -> None:
        """The outage's first line (``quiet``: float seconds since the previous failed call
        of an earlier outage whose end this process did not see, else None)."""
        logger.warning(
            "lease store %s is unreachable (seen by %s: %s%s); leased tasks follow "
            "lease_on_store_error, beat stays standby; reminders while it lasts, and a line "
            "when it answers again",
            self.name,
            what,
            describe(error),
            ""
            if quiet is None
            else f"; this process made no call in the {quiet:.1f}s since its previous failed "
            "call, whose outage it did not see end",
        )

    def answered(self) -> None:
        """Report a call the store answered; ends an outage (logged with its length)."""
        if self._down_since is None:  # the common case: no lock taken
            return
        now = clock.now()
        with self._lock:
            started, self._down_since = self._down_since, None
            failures, self._failures = self._failures, 0
            last = self._last_failure
        if started is not None:
            # The last failure says how long ago this process last tried: one that was idle
            # meanwhile learns of the end late, and its figure is the outage's upper bound.
            logger.warning(
                "lease store %s is reachable again after %.1fs (%d failed calls, the last "
                "%.1fs ago)",
                self.name,
                now - started,
                failures,
                now - last,
            )


#: (pid, URL) -> state: a forked child (a prefork pool process) finds none of its parent's,
#: and needs no lock to make its own (``setdefault`` is atomic), so none held at the fork.
_states: dict[tuple[int, str], Reachability] = {}


def reachability(url: str) -> Reachability:
    """This process's :class:`Reachability` of the store at ``url`` (one per URL)."""
    key = (process.pid(), url)
    state = _states.get(key)
    if state is None:
        state = _states.setdefault(key, Reachability(url))
    return state
