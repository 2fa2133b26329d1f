"""The cost of a publish with and without ``lease_dedupe``: round trips and time per publish.

Two private redis-servers, one the broker, one the lease store, so each server's own count of
commands (``INFO stats``: ``total_commands_processed``, less the ``INFO`` that reads it) says
how many round trips a publish makes to it. Variants, each ``apply_async`` of a leased task
whose body never runs (no worker):

- ``plain``: ``lease_dedupe`` off: the broker publish only;
- ``dedupe, published``: every publish a new key, so each claims and is published;
- ``dedupe, deduplicated``: every publish the same key, whose copy is waiting: nothing is
  published, the waiting copy's result is returned.

Rounds interleave the variants; the figure is the median over rounds of each round's mean
time per publish (microseconds). Run ``python -m benchmarks.publish [--publishes N]``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery

from celery_lease import LeasedTask
from harness.redis_server import RedisServer

from ._infra import spread

Variant = Callable[[int], Any]


def _commands(client: redis.Redis) -> int:
    return int(client.info("stats")["total_commands_processed"])


def make_app(broker_url: str, lease_url: str) -> tuple[Celery, Any, Any]:
    """An app (no result backend) with the same task with and without ``lease_dedupe``."""
    app = Celery("bench_publish", broker=broker_url, set_as_current=False)
    app.conf.update(lease_backend=lease_url, task_default_queue="bench-publish")

    @app.task(base=LeasedTask, name="bench.plain", lease_key=("n",), shared=False)  # type: ignore[untyped-decorator]
    def plain(n: int) -> None:
        """Never runs: no worker."""

    @app.task(base=LeasedTask, name="bench.dedupe", lease_key=("n",), lease_dedupe=True,  # type: ignore[untyped-decorator]
              shared=False)
    def dedupe(n: int) -> None:
        """Never runs: no worker."""

    return app, plain, dedupe


def measure(publishes: int = 2000, rounds: int = 5) -> dict[str, Any]:
    """Round trips to each server and microseconds per publish, for every variant."""
    with RedisServer() as broker, RedisServer() as lease_store:
        app, plain, dedupe = make_app(broker.url(), lease_store.url())
        counters = {"broker": broker.client(), "lease store": lease_store.client()}
        variants: dict[str, Variant] = {
            "plain": lambda i: plain.delay(i),
            "dedupe, published": lambda i: dedupe.delay(i),
            "dedupe, deduplicated": lambda i: dedupe.delay(-1),
        }
        for variant in variants.values():  # connections made, scripts loaded
            for i in range(-50, 0):
                variant(i)
        times: dict[str, list[float]] = {name: [] for name in variants}
        trips: dict[str, dict[str, float]] = {}
        for round_ in range(rounds):
            for name, variant in variants.items():
                base = (round_ + 1) * 1_000_000
                before = {k: _commands(c) for k, c in counters.items()}
                started = time.perf_counter()
                for i in range(publishes):
                    variant(base + i)
                elapsed = time.perf_counter() - started
                after = {k: _commands(c) for k, c in counters.items()}
                times[name].append(elapsed / publishes * 1e6)
                trips[name] = {k: (after[k] - before[k] - 1) / publishes for k in counters}
                broker.client().flushall()  # the queue, not the counting
        for client in counters.values():
            client.close()
        return {name: {"us_per_publish": spread(times[name]),
                       "round_trips_per_publish": trips[name]} for name in variants}


def main(argv: list[str] | None = None) -> int:
    """Print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.publishes, args.rounds), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
