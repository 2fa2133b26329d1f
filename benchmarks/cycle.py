"""Benchmark 1: the cost of one uncontended acquire + release, next to the physical limit.

All variants share one redis-py client (one connection: the calls are sequential), created the
way celery-lease creates its own (:func:`celery_lease.store.client_for`), so the comparison is
between lock protocols and their Python code, not between client settings.

- ``limit``: two ``PING`` round trips, the least any acquire + release can cost when each
  is a separate call;
- ``celery-lease``: a token (``uuid4``), the holder description,
  :func:`~celery_lease.store.acquire` and :func:`~celery_lease.store.release`;
- ``celery-lease async``: what ``LeasedTask`` does per execution: the same acquire, after
  reading the previous release's reply, and a release written without waiting for its reply
  (:mod:`celery_lease.store.pending`);
- ``redis-py Lock``, ``python-redis-lock``, ``pottery Redlock`` (one master): a lock object made
  per cycle (as one is per job), non-blocking acquire, release.

Rounds interleave the variants in a rotated order; a ratio to the limit is taken per round
(median of that round's cycles), so a burst of load on the machine hits every variant alike.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from celery_lease import store
from celery_lease.store import pending

from ._infra import spread, summary

Cycle = Callable[[redis.Redis, str], None]

TTL_S = 30  # lifetime of every lock taken (int seconds: python-redis-lock takes whole seconds)


def _limit(client: redis.Redis, key: str) -> None:
    client.execute_command("PING")
    client.execute_command("PING")


def _celery_lease(client: redis.Redis, key: str) -> None:
    token = uuid.uuid4().hex
    holder = store.holder_json("bench.cycle", "task-id", "host", 1)
    found = store.acquire(client, key, token, TTL_S * 1000, holder)
    if not found.granted:
        raise AssertionError("celery-lease: lease not granted")
    store.release(client, key, token)


def _celery_lease_async(client: redis.Redis, key: str) -> None:
    # What LeasedTask does now: the previous release's reply is read before the acquire is
    # sent (lifecycle.take), the release is written and its reply left for later.
    pending.settle_all()
    token = uuid.uuid4().hex
    holder = store.holder_json("bench.cycle", "task-id", "host", 1)
    found = store.acquire(client, key, token, TTL_S * 1000, holder)
    if not found.granted:
        raise AssertionError("celery-lease: lease not granted")
    if pending.write(client, key, token, TTL_S, _ignore) is None:
        raise AssertionError("celery-lease: no asynchronous release on this client")


def _ignore(released: bool) -> None:
    pass


def _redis_py(client: redis.Redis, key: str) -> None:
    lock = client.lock(key, timeout=TTL_S)
    if not lock.acquire(blocking=False):
        raise AssertionError("redis-py Lock not acquired")
    lock.release()


def _python_redis_lock(client: redis.Redis, key: str) -> None:
    import redis_lock

    lock = redis_lock.Lock(client, key, expire=TTL_S)
    if not lock.acquire(blocking=False):
        raise AssertionError("python-redis-lock not acquired")
    lock.release()


def _pottery(client: redis.Redis, key: str) -> None:
    from pottery import Redlock

    lock = Redlock(key=key, masters={client}, auto_release_time=TTL_S)
    if not lock.acquire(blocking=False):
        raise AssertionError("pottery Redlock not acquired")
    lock.release()


VARIANTS: dict[str, tuple[str, Cycle]] = {
    "limit": ("2 x PING (physical limit)", _limit),
    "celery_lease": ("celery-lease acquire + release", _celery_lease),
    "celery_lease_async": (
        "celery-lease acquire + release written (reply read before the next acquire)",
        _celery_lease_async,
    ),
    "redis_py_lock": ("redis-py Lock", _redis_py),
    "python_redis_lock": ("python-redis-lock Lock", _python_redis_lock),
    "pottery_redlock": ("pottery Redlock (1 master)", _pottery),
}


def _time_cycles(cycle: Cycle, client: redis.Redis, prefix: str, count: int) -> list[float]:
    samples = []
    clock = time.perf_counter_ns
    for i in range(count):
        key = f"{prefix}:{i % 64}"
        started = clock()
        cycle(client, key)
        samples.append((clock() - started) / 1000.0)  # microseconds
    pending.settle_all()  # the asynchronous variant's last reply, outside the timing
    return samples


def run(url: str, quick: bool) -> dict[str, Any]:
    """Benchmark 1 against the Redis at ``url``."""
    cycles, rounds = (150, 2) if quick else (600, 5)
    logging.getLogger("pottery").setLevel(logging.ERROR)  # one master: it warns about quorum
    client = store.client_for(url, 5.0)
    names = list(VARIANTS)
    samples: dict[str, list[float]] = {name: [] for name in names}
    round_medians: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm-up: script loads, imports, the connection
        _time_cycles(VARIANTS[name][1], client, f"bench:cycle:{name}", 50)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            got = _time_cycles(VARIANTS[name][1], client, f"bench:cycle:{name}", cycles)
            samples[name].extend(got)
            round_medians[name].append(sorted(got)[len(got) // 2])
    result: dict[str, Any] = {
        "cycles_per_round": cycles,
        "rounds": rounds,
        "unit": "us",
        "variants": {},
    }
    for name in names:
        result["variants"][name] = {
            "label": VARIANTS[name][0],
            "latency_us": summary(samples[name]),
            "ratio_to_limit": spread(
                m / base
                for m, base in zip(round_medians[name], round_medians["limit"], strict=True)
            ),
            "ratio_to_redis_py_lock": spread(
                m / base
                for m, base in zip(round_medians[name], round_medians["redis_py_lock"], strict=True)
            ),
        }
    return result


def run_same_core(url: str, server_pid: int, quick: bool) -> dict[str, Any]:
    """:func:`run` with this process and the redis-server pinned to one core, then unpinned.

    On a virtual machine a round trip between two cores includes waking the other core; on one
    core it does not, so the fixed Python cost of each variant weighs more in its ratio.
    """
    mine, theirs = os.sched_getaffinity(0), os.sched_getaffinity(server_pid)
    core = {min(mine)}
    os.sched_setaffinity(server_pid, core)
    os.sched_setaffinity(0, core)
    try:
        return run(url, quick)
    finally:
        os.sched_setaffinity(0, mine)
        os.sched_setaffinity(server_pid, theirs)
