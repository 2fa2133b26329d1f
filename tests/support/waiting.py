"""Polling with a deadline instead of bare sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


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
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            text = message() if callable(message) else message
            raise AssertionError(f"{text} (waited {timeout:.2f}s)")
        time.sleep(min(interval, remaining))
