"""Whether a hold waits: ``on_conflict``, ``blocking`` and ``timeout`` read together.

The rule follows :meth:`threading.Lock.acquire` and redis-py's ``Lock(blocking_timeout=...)``:
asking for a ``timeout`` or for ``blocking=True`` means waiting, and no argument is ignored in
the combination given (a combination in which one would be is refused, naming the fix):

===========================  =================================================================
given                        does
===========================  =================================================================
nothing                      answers at once (``LeaseConflict``, or False from ``acquire()``)
``timeout=t``                waits up to ``t`` float seconds
``blocking=True``            waits with no limit (``timeout=t``: up to ``t``)
``on_conflict="wait"``       as ``blocking=True``
``blocking=False``           answers at once; with a ``timeout``: refused
``on_conflict="raise"``      answers at once; with ``timeout`` or ``blocking=True``: refused
===========================  =================================================================

``on_conflict="wait", blocking=False`` (once documented as "answers at once") still answers at
once, with a :class:`DeprecationWarning`. :meth:`Hold.acquire
<celery_lease.holds.plain.Hold.acquire>` applies the same rule to its own ``blocking`` and
``timeout`` for one attempt.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass

from ..errors import LeaseConfigError

__all__ = ["ON_CONFLICT", "Waiting", "for_call", "resolve"]

ON_CONFLICT = ("raise", "wait")


@dataclass(frozen=True)
class Waiting:
    """Whether a hold waits for a release, and for how long.

    Attributes:
        wait: True to wait for the holder's release.
        timeout: the most float seconds to wait (``None``: no limit); ``None`` when not waiting.
    """

    wait: bool
    timeout: float | None

    @property
    def on_conflict(self) -> str:
        """``"wait"`` or ``"raise"``."""
        return "wait" if self.wait else "raise"


def _check_timeout(timeout: object, where: str) -> None:
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0
    ):
        raise LeaseConfigError(
            f"timeout={timeout!r} ({where}) must be None (wait as long as it takes) or a "
            f"number of seconds >= 0"
        )


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside celery_lease (the user's ``hold()`` or
    ``hold_async()`` call), counted from :func:`resolve`'s caller of ``warnings.warn``."""
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(
        "celery_lease"
    ):
        frame, level = frame.f_back, level + 1
    return level


def resolve(
    name: str, on_conflict: str | None, blocking: bool | None, timeout: float | None
) -> Waiting:
    """The :class:`Waiting` that :func:`celery_lease.hold`'s three arguments ask for (see the
    module docstring for the rule).

    Raises:
        LeaseConfigError: an unknown ``on_conflict``, a bad ``timeout``, or a combination in
            which an argument would do nothing; the message names the fix.
    """
    where = f"hold {name!r}"
    if on_conflict is not None and on_conflict not in ON_CONFLICT:
        raise LeaseConfigError(
            f"on_conflict={on_conflict!r} ({where}) is not one of "
            f"{', '.join(map(repr, ON_CONFLICT))}"
        )
    _check_timeout(timeout, where)
    if on_conflict == "raise" and (timeout is not None or blocking):
        given = f"timeout={timeout!r}" if timeout is not None else "blocking=True"
        raise LeaseConfigError(
            f"{where}: on_conflict='raise' answers at once, so {given} would do nothing. Fix: "
            f"to wait, drop on_conflict='raise' (or pass on_conflict='wait'); to answer at "
            f"once, drop {given.partition('=')[0]}"
        )
    if blocking is False and timeout is not None:
        raise LeaseConfigError(
            f"{where}: blocking=False answers at once, so timeout={timeout!r} would do nothing "
            f"(as threading.Lock.acquire refuses it). Fix: drop one of them"
        )
    if on_conflict == "wait" and blocking is False:
        warnings.warn(
            f"{where}: on_conflict='wait' with blocking=False answers at once, and will be "
            f"refused in a later release; pass blocking=False alone (or call "
            f"acquire(blocking=False) for one attempt that does not wait)",
            DeprecationWarning,
            stacklevel=_caller_level(),
        )
        return Waiting(False, None)
    wait = on_conflict == "wait" or bool(blocking) or timeout is not None
    return Waiting(wait, timeout if wait else None)


def for_call(name: str, held: Waiting, blocking: bool | None, timeout: float | None) -> Waiting:
    """What one ``acquire(blocking, timeout)`` call does on a hold configured as ``held``:
    ``blocking=False`` answers at once, ``blocking=True`` or a ``timeout`` waits (up to
    ``timeout``, else the hold's own), neither keeps the hold's configuration.

    Raises:
        LeaseConfigError: a bad ``timeout``, or ``blocking=False`` with a ``timeout``.
    """
    where = f"hold {name!r}: acquire()"
    _check_timeout(timeout, where)
    if blocking is False:
        if timeout is not None:
            raise LeaseConfigError(
                f"{where}: blocking=False answers at once, so timeout={timeout!r} would do "
                f"nothing (as threading.Lock.acquire refuses it). Fix: drop one of them"
            )
        return Waiting(False, None)
    if timeout is not None:
        return Waiting(True, timeout)
    if blocking:
        return Waiting(True, held.timeout)
    return held
