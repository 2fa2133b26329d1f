"""The clock that lease deadlines are measured on.

A local deadline must keep counting while the host is suspended (a suspended VM is the
textbook "pause" a lease must survive being wrong about), so on Linux it uses
``CLOCK_BOOTTIME``; elsewhere it falls back to :func:`time.monotonic`. Both are immune to
wall-clock steps (NTP, manual changes).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["CLOCK_NAME", "now"]


def _pick() -> tuple[Callable[[], float], str]:
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    if clock_id is not None:
        try:
            time.clock_gettime(clock_id)
        except OSError:
            pass
        else:
            return (lambda: time.clock_gettime(clock_id)), "CLOCK_BOOTTIME"
    return time.monotonic, "monotonic"


now, CLOCK_NAME = _pick()
now.__doc__ = "Seconds (float) on the deadline clock; only differences are meaningful."
