"""Collect a worker's task events (``-E``) in a background thread, for tests of what Flower
gets."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def task_events(
    app: Any,
    wanted: Callable[[dict[str, Any]], bool],
    last: Callable[[dict[str, Any]], bool],
    timeout: float = 30.0,
) -> Iterator[list[dict[str, Any]]]:
    """Yield the list the events ``wanted`` says are wanted are appended to, from the moment
    the receiver listens; on leaving, wait (``timeout`` float seconds at most) until ``last``
    says the latest one ends the capture."""
    got: list[dict[str, Any]] = []
    listening = threading.Event()

    def keep(event: dict[str, Any], receiver: Any) -> None:
        if wanted(event):
            got.append(event)
            receiver.should_stop = last(event)

    def listen() -> None:
        with app.connection_for_read() as conn:
            receiver = app.events.Receiver(conn, handlers={})
            receiver.handlers["*"] = lambda event: keep(event, receiver)
            listening.set()
            with contextlib.suppress(socket.timeout, TimeoutError):
                receiver.capture(limit=None, timeout=timeout)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    listening.wait(10)
    yield got
    thread.join(timeout + 5)
