"""Polling with a deadline instead of bare sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.02,
    tick: Callable[[float], None] | None = None,
    every: float = 1.0,
) -> T:
    """Call ``predicate`` until it returns something truthy or ``timeout`` seconds pass.

    Returns the predicate's last value (truthy on success, falsy on timeout); it is always
    tried at least once, and once more at the deadline. ``tick(elapsed_seconds)`` (if given)
    is called about every ``every`` float seconds while waiting, e.g. to print progress.
    Exceptions of the predicate propagate at once.
    """
    started = time.monotonic()
    deadline = started + timeout
    last_tick = started
    while True:
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if now >= deadline:
            return value
        if tick is not None and now - last_tick >= every:
            last_tick = now
            tick(now - started)
        time.sleep(min(interval, deadline - now))


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.02,
    message: str | Callable[[], str] = "condition not met",
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that value.

    Raises ``AssertionError`` with ``message`` (a string, or a callable evaluated
    lazily, e.g. to include a log tail) once ``timeout`` seconds have passed.
    The predicate is always tried at least once, and once more at the deadline.
    """
    value = poll(predicate, timeout, interval)
    if not value:
        text = message() if callable(message) else message
        raise AssertionError(f"{text} (waited {timeout:.2f}s)")
    return value
