"""The cost of a publish with and without ``lease_dedupe`` and ``lease_debounce``: round trips
and time per publish.

Two private redis-servers, one the broker, one the lease store, so each server's own counts
(``INFO commandstats``) say what a publish sends it: the broker's commands (each a round trip
here), the lease store's scripts (``EVALSHA``/``EVAL``: each one round trip) and the commands
those scripts run inside the server (no round trip). Variants, each ``apply_async`` of a leased task
whose body never runs (no worker):

- ``plain``: ``lease_dedupe`` off: the broker publish only;
- ``dedupe, published``: every publish a new key, so each claims, is published, and gives its
  claim its full lifetime (a second script);
- ``dedupe, deduplicated``: every publish the same key, whose copy is waiting: nothing is
  published, the waiting copy's result is returned;
- ``debounce, new burst``: every publish a new key (``lease_debounce``): the burst's script,
  the sweep's note, and the timer's publish to the broker;
- ``debounce, joined``: every publish the same key, whose burst waits: its script only.

Rounds interleave the variants; the figure is the median over rounds of each round's mean
time per publish (microseconds). The execution side is timed too: an acquire and a release,
without a claim and with one (a message that claimed at publish: the same round trip, the
claim cleared inside it). Run ``python -m benchmarks.publish
[--publishes N]``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery

from celery_lease import LeasedTask, store
from harness.redis_server import RedisServer

from ._infra import spread

Variant = Callable[[int], Any]


def _counts(client: redis.Redis) -> dict[str, int]:
    """Calls per command so far, ``INFO`` left out (the reading itself)."""
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(v["calls"])
        for name, v in stats.items()
        if name != "cmdstat_info"
    }


def _per_publish(before: dict[str, int], after: dict[str, int], n: int) -> dict[str, float]:
    calls = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    scripts = calls.get("evalsha", 0) + calls.get("eval", 0)
    return {
        "round_trips": scripts / n if scripts else sum(calls.values()) / n,
        "commands_inside_scripts": (sum(calls.values()) - scripts) / n if scripts else 0.0,
    }


def make_tasks(broker_url: str, lease_url: str) -> tuple[Any, Any, Any]:
    """The same task without and with ``lease_dedupe``, and with ``lease_debounce``, in an app
    without a result backend."""
    app = Celery("bench_publish", broker=broker_url, set_as_current=False)
    app.conf.update(lease_backend=lease_url, task_default_queue="bench-publish")

    @app.task(base=LeasedTask, name="bench.plain", lease_key=("n",), shared=False)  # type: ignore[untyped-decorator]
    def plain(n: int) -> None:
        """Never runs: no worker."""

    @app.task(
        base=LeasedTask,
        name="bench.dedupe",
        lease_key=("n",),
        lease_dedupe=True,  # type: ignore[untyped-decorator]
        shared=False,
    )
    def dedupe(n: int) -> None:
        """Never runs: no worker."""

    @app.task(
        base=LeasedTask,
        name="bench.debounce",
        lease_key=("n",),  # type: ignore[untyped-decorator]
        lease_debounce=600.0,
        shared=False,
    )
    def debounce(n: int) -> None:
        """Never runs: no worker."""

    return plain, dedupe, debounce


def measure(publishes: int = 2000, rounds: int = 5) -> dict[str, Any]:
    """Round trips to each server and microseconds per publish, for every variant."""
    with RedisServer() as broker, RedisServer() as lease_store:
        plain, dedupe, debounce = make_tasks(broker.url(), lease_store.url())
        counters = {"broker": broker.client(), "lease store": lease_store.client()}
        variants: dict[str, Variant] = {
            "plain": lambda i: plain.delay(i),
            "dedupe, published": lambda i: dedupe.delay(i),
            "dedupe, deduplicated": lambda i: dedupe.delay(-1),
            "debounce, new burst": lambda i: debounce.delay(i),
            "debounce, joined": lambda i: debounce.delay(-1),
        }
        for variant in variants.values():  # connections made, scripts loaded
            for i in range(-50, 0):
                variant(i)
        times: dict[str, list[float]] = {name: [] for name in variants}
        trips: dict[str, dict[str, dict[str, float]]] = {}
        for round_ in range(rounds):
            for name, variant in variants.items():
                base = (round_ + 1) * 1_000_000
                before = {k: _counts(c) for k, c in counters.items()}
                started = time.perf_counter()
                for i in range(publishes):
                    variant(base + i)
                elapsed = time.perf_counter() - started
                after = {k: _counts(c) for k, c in counters.items()}
                times[name].append(elapsed / publishes * 1e6)
                trips[name] = {k: _per_publish(before[k], after[k], publishes) for k in counters}
                broker.client().flushall()  # the queue, not the counting
        for client in counters.values():
            client.close()
        return {name: {"us_per_publish": spread(times[name]), **trips[name]} for name in variants}


def measure_acquire(cycles: int = 2000, rounds: int = 5) -> dict[str, Any]:
    """Microseconds per acquire + release, unclaimed and claimed (the claim cleared in it)."""
    with RedisServer() as server:
        client = store.client_for(server.url(), 2.0)
        holder = store.holder_json("bench.dedupe", "task-id", "host", 1)
        times: dict[str, list[float]] = {"unclaimed": [], "claimed": []}
        for round_ in range(rounds + 1):  # the first round warms up
            for name, claimed in (("unclaimed", False), ("claimed", True)):
                started = time.perf_counter()
                for i in range(cycles):
                    key, token = f"lease:{{bench:{i}}}", f"{i:032x}"
                    store.acquire(client, key, token, 30_000, holder, 0, "task-id", claimed=claimed)
                    store.release(client, key, token)
                if round_:
                    times[name].append((time.perf_counter() - started) / cycles * 1e6)
        return {name: {"us_per_acquire_and_release": spread(t)} for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    """Print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print(
        json.dumps(
            {
                **measure(args.publishes, args.rounds),
                **measure_acquire(args.publishes, args.rounds),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
