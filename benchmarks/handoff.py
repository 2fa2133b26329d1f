"""The release cost of a task that hands its key over (``coalesce``, ``queue``), next to the
default policies' release: ``python -m benchmarks.handoff [--rounds N] [--cycles N]``.

Starts a private redis-server on a free loopback port and times, per call, in rounds that
interleave the variants (median of each round, then the median and spread of the rounds):

- ``release-2``: :func:`celery_lease.store.release`, what every default task's release is;
- ``release_handoff-4, empty line``: :func:`celery_lease.store.handoff.release_handing_over`
  of a key nobody waits for (the common case of a ``coalesce`` or ``queue`` task);
- ``release_handoff-4, one waiting``: the same with one run parked, reserved and answered.

Each cycle acquires first (untimed), so every release deletes a held key.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable

import redis

from celery_lease import store
from celery_lease.store import handoff
from harness.redis_server import RedisServer, redis_server_binary

KEY = "lease:{bench.handoff}"
TTL_MS = 30_000
HOLDER = store.holder_json("bench.handoff", "task-id", "host", 1)


def _acquire(client: redis.Redis) -> str:
    token = uuid.uuid4().hex
    if not store.acquire(client, KEY, token, TTL_MS, HOLDER).granted:
        raise AssertionError("not granted")
    return token


def _release(client: redis.Redis, token: str) -> None:
    store.release(client, KEY, token)


def _handoff(client: redis.Redis, token: str) -> None:
    handoff.release_handing_over(client, KEY, token, TTL_MS, 86_400_000, 0)


def _park_one(client: redis.Redis) -> None:
    handoff.park(client, KEY, "queue", uuid.uuid4().hex, '{"task": "bench"}', 100, 86_400_000)


VARIANTS: dict[
    str, tuple[Callable[[redis.Redis], None] | None, Callable[[redis.Redis, str], None]]
] = {
    "release-2": (None, _release),
    "release_handoff-4, empty line": (None, _handoff),
    "release_handoff-4, one waiting": (_park_one, _handoff),
}


def measure(client: redis.Redis, rounds: int, cycles: int) -> dict[str, list[float]]:
    """Microseconds per release, one median per round, for each variant."""
    found: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(rounds):
        for name, (prepare, release) in VARIANTS.items():
            samples = []
            for _ in range(cycles):
                client.delete(f"{KEY}:reserved")  # the previous hand-over's, not taken
                token = _acquire(client)
                if prepare is not None:
                    prepare(client)
                start = time.perf_counter()
                release(client, token)
                samples.append((time.perf_counter() - start) * 1e6)
            found[name].append(statistics.median(samples))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cycles", type=int, default=200)
    args = parser.parse_args()
    with RedisServer(binary=redis_server_binary()) as server:
        client = store.client_for(server.url(0), 2.0)
        for name, medians in measure(client, args.rounds, args.cycles).items():
            q = statistics.quantiles(medians, n=4)
            print(
                f"{name:34s} median {statistics.median(medians):7.1f} us "
                f"(rounds: q1 {q[0]:.1f}, q3 {q[2]:.1f})"
            )


if __name__ == "__main__":
    main()
