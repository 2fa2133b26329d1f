"""Collect what a Celery signal sends during a ``with`` block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def received(signal: Any) -> Iterator[list[dict[str, Any]]]:
    """Yield a list that gets the keyword arguments of every ``signal`` sent in the block.

    The receiver is strongly referenced while the block runs and disconnected after it.
    """
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any = None, **kwargs: Any) -> None:
        seen.append(kwargs)

    signal.connect(receiver, weak=False)
    try:
        yield seen
    finally:
        signal.disconnect(receiver)
