"""The settings of ``lease_debounce`` (:mod:`celery_lease.policies.debounce`): names, defaults,
checks.

``lease_debounce`` (float seconds, or None: off) is the quiet time a burst of publishes of one
key waits for before its single run; ``lease_debounce_max`` (float seconds, at least
``lease_debounce``; default ten times it) is the longest that run may be put off after the
burst's first publish. Both are Celery settings and task options, checked with the other
lease settings at registration (:func:`celery_lease.settings.config.resolve_options`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .timing import duration_problem

__all__ = ["DEFAULTS", "DEFAULT_CAP_FACTOR", "Debounce", "resolve"]

#: Setting name -> default (both None: no debounce; the cap derived from the delay).
DEFAULTS: dict[str, Any] = {"lease_debounce": None, "lease_debounce_max": None}
#: ``lease_debounce_max`` when unset: this many times ``lease_debounce``.
DEFAULT_CAP_FACTOR = 10.0


@dataclass(frozen=True)
class Debounce:
    """A task's debounce, validated.

    Attributes:
        delay: ``lease_debounce``, float seconds (> 0): each publish moves the burst's due
            time to ``now + delay``...
        cap: ``lease_debounce_max``, float seconds (>= ``delay``): ...but never past
            ``first publish + cap``.
    """

    delay: float
    cap: float

    @property
    def delay_ms(self) -> int:
        """``delay`` in int milliseconds (at least 1)."""
        return max(1, round(self.delay * 1000))

    @property
    def cap_ms(self) -> int:
        """``cap`` in int milliseconds (at least ``delay_ms``)."""
        return max(self.delay_ms, round(self.cap * 1000))


def resolve(pick: Callable[[str], Any], problems: list[tuple[str, str]]) -> Debounce | None:
    """The :class:`Debounce` the settings give (``pick(name)`` reads one), or None when
    ``lease_debounce`` is unset; each problem found is appended to ``problems`` as
    ``("name=value", why)`` (then None is returned).

    A problem: ``lease_debounce`` not a positive number of seconds; ``lease_debounce_max``
    not one, or below ``lease_debounce``, or set without ``lease_debounce``.
    """
    delay, cap = pick("lease_debounce"), pick("lease_debounce_max")
    if delay is None:
        if cap is not None:
            problems.append(
                (
                    f"lease_debounce_max={cap!r}",
                    "has no effect without "
                    "lease_debounce (the quiet time, float seconds): set "
                    "lease_debounce too, e.g. lease_debounce=2.0, or drop it",
                )
            )
        return None
    found = len(problems)
    problem = duration_problem(delay)
    if problem is not None:
        problems.append(
            (
                f"lease_debounce={delay!r}",
                f"{problem}, e.g. lease_debounce=2.0 (or None: no debounce)",
            )
        )
    if cap is not None:
        cap_problem = duration_problem(cap)
        if cap_problem is not None:
            problems.append(
                (f"lease_debounce_max={cap!r}", f"{cap_problem}, e.g. lease_debounce_max=60.0")
            )
        elif problem is None and float(cap) < float(delay):
            problems.append(
                (
                    f"lease_debounce_max={cap!r}",
                    f"is below lease_debounce="
                    f"{delay!r}: the longest wait cannot be shorter than the quiet "
                    f"time; set lease_debounce_max >= {float(delay)!r}",
                )
            )
    if len(problems) > found:
        return None
    return Debounce(float(delay), float(delay) * DEFAULT_CAP_FACTOR if cap is None else float(cap))
