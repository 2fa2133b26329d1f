"""Running one function in several threads at once, collecting what they raise."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_in_threads(
    func: Callable[[], object], count: int, timeout: float = 30.0
) -> list[BaseException]:
    """Run ``func()`` in ``count`` threads started together; join each for up to ``timeout``
    float seconds. Returns the exceptions they raised (empty when all returned)."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            func()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return failures
