"""The three durations of a lease: their rules, every problem at once, and one fix for all.

The durations are ``lease_ttl``, ``lease_renew_interval`` (default ``lease_ttl / 3``) and
``lease_store_timeout`` (default ``min(interval / 2, 2.0)``), float seconds. The rules come
from the design notes in ``docs/concepts.md``:

- each is a finite number of seconds above zero, at most a year, and at least Redis' 1 ms;
- the renew interval is at most half the TTL (a third or less is recommended: two failed
  renewals in a row still leave time to recover; above a third is a warning, not an error);
- each store call may take at least :data:`MIN_STORE_TIMEOUT` (a healthy round trip plus a GC
  or scheduling pause), and times out before the next renewal is due.

:func:`check` reports every broken rule at once, and :func:`repair` finds the one set of
values that, applied together, passes every rule: a suggested fix never leads to a second
error. It changes as little as it can: an invalid value becomes its default, an interval above
half the TTL becomes a third of it, a store timeout below the floor becomes the floor, and
only a TTL too short for any store timeout is raised (to :data:`MIN_TTL`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

__all__ = [
    "DEFAULT_TTL",
    "MIN_STORE_TIMEOUT",
    "MIN_TTL",
    "Durations",
    "check",
    "duration_problem",
    "repair",
    "resolve",
    "round_down",
]

#: The default ``lease_ttl``, float seconds.
DEFAULT_TTL = 30.0
#: The shortest store timeout accepted, float seconds: below it a healthy round trip plus a
#: garbage collection or scheduling pause times out (docs/reference/settings.md).
MIN_STORE_TIMEOUT = 0.05
#: The smallest ``lease_ttl`` whose derived store timeout (``lease_ttl / 6``) reaches the floor.
MIN_TTL = round(MIN_STORE_TIMEOUT * 6, 3)
MAX_SECONDS = 366 * 24 * 3600.0  # a lease that long is a configuration mistake
_EPSILON = 1e-9


def duration_problem(value: Any) -> str | None:
    """Why ``value`` is not a usable duration (the end of a sentence), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "must be a number of seconds (float)"
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds) or seconds <= 0 or seconds > MAX_SECONDS:
        return (
            f"must be a finite number of seconds above zero and at most a year ({MAX_SECONDS:.0f})"
        )
    if round(seconds * 1000) < 1:
        return "is below Redis' 1 ms resolution"
    return None


class Durations(NamedTuple):
    """A TTL and the interval and store timeout given for it (float seconds; None: derived).

    Attributes:
        ttl: the lease TTL.
        interval: the renew interval, or None for ``ttl / 3``.
        timeout: the store timeout, or None for ``min(interval / 2, 2.0)``.
    """

    ttl: float
    interval: float | None = None
    timeout: float | None = None

    @property
    def effective(self) -> tuple[float, float, float]:
        """``(ttl, interval, timeout)`` with the derived defaults filled in."""
        interval = self.ttl / 3 if self.interval is None else self.interval
        timeout = min(interval / 2, 2.0) if self.timeout is None else self.timeout
        return self.ttl, interval, timeout


def _broken(d: Durations) -> list[str]:
    """The rules ``d`` breaks: ``"half"``, ``"floor"``, ``"order"``."""
    ttl, interval, timeout = d.effective
    found = []
    if interval > ttl / 2 + _EPSILON:
        found.append("half")
    if timeout < MIN_STORE_TIMEOUT - _EPSILON:
        found.append("floor")
    if timeout >= interval:
        found.append("order")
    return found


def round_down(seconds: float) -> float:
    """``seconds`` rounded down to the millisecond: shown as typed, and never above a bound."""
    return math.floor(seconds * 1000) / 1000


def repair(d: Durations) -> Durations:
    """The closest :class:`Durations` to ``d`` that breaks no rule (``d`` itself when none)."""
    for _ in range(8):  # each step fixes one rule; a handful always suffices
        broken = _broken(d)
        if not broken:
            return d
        ttl, interval, _ = d.effective
        if broken[0] == "half":
            third = round_down(ttl / 3)
            d = d._replace(interval=third if third / 2 >= MIN_STORE_TIMEOUT else None)
        elif broken[0] == "floor":
            if d.timeout is not None:
                d = d._replace(timeout=MIN_STORE_TIMEOUT if MIN_STORE_TIMEOUT < interval else None)
            elif d.interval is not None:
                d = d._replace(interval=None)
            else:
                d = d._replace(ttl=MIN_TTL)
        else:  # order: an explicit timeout at or above the interval
            half = round_down(interval / 2)
            d = d._replace(timeout=half if half >= MIN_STORE_TIMEOUT else None)
    raise AssertionError(f"no durations repair {d}")  # pragma: no cover - the rules converge


def check(d: Durations, names: tuple[str, str, str]) -> list[tuple[str, str]]:
    """Every rule ``d`` breaks, as ``(head, why)``: ``head`` is ``name=value`` of the setting
    at fault (``names``: how the TTL, interval and timeout settings are called here)."""
    ttl_name, interval_name, timeout_name = names
    ttl, interval, timeout = d.effective
    found = []
    for rule in _broken(d):
        if rule == "half":
            found.append(
                (
                    f"{interval_name}={interval!r}",
                    f"is above half of {ttl_name}={ttl!r}: one slow renewal would lose "
                    f"the lease (at most {ttl_name} / 2; {ttl_name} / 3 or less leaves "
                    f"time for a second try)",
                )
            )
        elif rule == "floor":
            head, given = (
                (f"{timeout_name}={timeout!r}", "is")
                if d.timeout is not None
                else (
                    f"{ttl_name}={ttl!r}",
                    f"gives a store timeout (min({interval_name} / 2, 2.0) "
                    f"with {interval_name}={interval:.4g}) of",
                )
            )
            found.append(
                (
                    head,
                    f"{given} {timeout * 1000:.0f} ms, below the "
                    f"{MIN_STORE_TIMEOUT * 1000:.0f} ms floor: a healthy store call (a "
                    f"network round trip plus a GC or scheduling pause) would time out "
                    f"and renewals fail. The smallest {ttl_name} that works is {MIN_TTL} "
                    f"(with {interval_name} and {timeout_name} unset)",
                )
            )
        else:
            found.append(
                (
                    f"{timeout_name}={timeout!r}",
                    f"must be shorter than {interval_name}={interval!r}, or a hanging "
                    f"renewal silently becomes no renewal",
                )
            )
    return found


def resolve(
    raw: tuple[Any, Any, Any], names: tuple[str, str, str]
) -> tuple[Durations, list[tuple[str, str]]]:
    """Check the TTL, interval and timeout as given (``raw``; None: unset, derived) and return
    them with every problem found, as :func:`check` does; the last problem ends with the fix
    for all of them (:func:`repair`), e.g. ``Fix: lease_ttl=0.3 and leave
    lease_renew_interval unset``. An unusable value is a problem and counts as its default
    (:data:`DEFAULT_TTL`, or derived) for the rules between the three."""
    found: list[tuple[str, str]] = []
    usable: list[float | None] = []
    unusable: list[bool] = []
    for name, value in zip(names, raw, strict=True):
        problem = None if value is None else duration_problem(value)
        if problem is not None:
            found.append((f"{name}={value!r}", problem))
        unusable.append(problem is not None)
        usable.append(None if value is None or problem is not None else float(value))
    given = Durations(DEFAULT_TTL if usable[0] is None else usable[0], *usable[1:])
    found += check(given, names)
    if found:
        fixed = repair(given)
        changes = [
            f"leave {name} unset" if after is None else f"{name}={after!r}"
            for name, before, after, bad in zip(names, given, fixed, unusable, strict=True)
            if after != before or bad
        ]
        head, why = found[-1]
        found[-1] = (head, f"{why}. Fix: {' and '.join(changes)}")
    return given, found
