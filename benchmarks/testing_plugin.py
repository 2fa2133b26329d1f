"""``python -m benchmarks.testing_plugin [--rounds N]``: what the pytest plugin's session
server (:func:`celery_lease.ops.testing.lease_redis_server`) costs a test session.

Runs the fixture as pytest does (setup, one write, teardown) ``N`` times and prints the
setup and teardown times in float seconds as JSON (``summary``: median, p99, min, max).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from celery_lease.ops import testing

from ._infra import summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    # The function under pytest's fixture wrapper (pytest 8: __wrapped__).
    fixture: Callable[[], Iterator[Any]] = testing.lease_redis_server.__wrapped__
    setups, teardowns = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        session = fixture()
        server = next(session)
        ready = time.perf_counter()
        server.client.set("written", "1")
        stopping = time.perf_counter()
        for _ in session:  # the teardown: the code after the fixture's yield
            pass
        setups.append(ready - started)
        teardowns.append(time.perf_counter() - stopping)
    print(json.dumps({"setup_s": summary(setups), "teardown_s": summary(teardowns)}, indent=2))


if __name__ == "__main__":
    main()
