"""Benchmark 4: how fast ``LeaseLost`` reaches a task body, per pool, per cause, per body.

A trial runs ``bench.hold`` (``lease_ttl`` 1 s, so renewals every 1/3 s) in a real worker
whose lease store is a private redis-server of its own, separate from the broker. Once the
body runs, after a random offset spread over one renewal interval, the benchmark either

- deletes the key from outside (``refused``: the next renewal is refused), and measures the
  wall-clock time from just before the ``DEL`` to the moment the body caught ``LeaseLost``; or
- freezes the lease store with SIGSTOP (``deadline``: renewals go unanswered until the local
  deadline passes), and measures, inside the task and on the deadline clock
  (:func:`celery_lease.base.clock.now`), how late after ``lease.deadline`` the body caught it.

The body either sleeps in one ``time.sleep(limit)`` or spins in a pure-Python loop until
``limit``. Where the pool cannot interrupt the body (a blocking call in the threads pool, a
greenlet that never yields), the figure is what happens instead: the exception lands when the
call returns, or never (``not-raised``: the body ran to its end, ``lease.check()`` raises).
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

import redis
from celery import Celery

from harness.redis_server import RedisServer
from harness.waiting import wait_for

from ._infra import Worker, client_kwargs, summary

POOLS = ("prefork", "solo", "threads", "gevent", "eventlet")
CAUSES = ("refused", "deadline")
BODIES = ("sleep", "busy")
TTL = 1.0  # float seconds: the hold task's lease_ttl (renewed every TTL / 3)
LIMIT = 2.5  # float seconds a body sleeps or spins at most (the loss comes within 1.4 s)
LIMIT_QUICK = 1.8
#: (pool, body) pairs where LeaseLost cannot land inside the body, and what happens instead.
UNINTERRUPTIBLE = {
    ("threads", "sleep"): "threads pool: an asynchronous exception lands when time.sleep returns",
    ("gevent", "busy"): "a greenlet that never yields starves the heartbeat (use lease.check())",
    ("eventlet", "busy"): "a greenthread that never yields starves the heartbeat "
    "(use lease.check())",
}


def trial(
    app: Celery,
    records: redis.Redis,
    lease_store: RedisServer,
    pool: str,
    cause: str,
    body: str,
    rng: random.Random,
    limit: float = LIMIT,
) -> dict[str, Any]:
    """One execution of ``bench.hold`` losing its lease by ``cause``; returns what it saw."""
    trial_id = uuid.uuid4().hex[:12]
    key = f"det:{trial_id}"
    app.tasks["bench.hold"].apply_async((trial_id, body, limit), queue=f"det-{pool}")
    wait_for(lambda: records.hexists(key, "started"), 30.0, 0.002, f"{pool} hold task start")
    lease_key = (records.hget(key, "lease_key") or b"").decode()
    time.sleep(0.05 + rng.random() * TTL / 3)
    store = lease_store.client(**client_kwargs())
    try:
        event_at = time.time()
        if cause == "refused":
            store.delete(lease_key)
        else:
            lease_store.pause()
        wait_for(
            lambda: records.hexists(key, "outcome"),
            limit + 10.0,
            0.002,
            f"{pool} {cause} {body} outcome",
        )
    finally:
        if lease_store.paused:
            lease_store.resume()
        store.close()
    rec = {k.decode(): v.decode() for k, v in records.hgetall(key).items()}
    records.delete(key)
    raised = rec["outcome"] == "raised"
    return {
        "raised": raised,
        "mechanism": rec.get("mechanism", ""),
        "cause_seen": rec.get("cause", ""),
        # refused: wall time from the DEL to LeaseLost caught in the body
        "after_event_s": float(rec["at_wall"]) - event_at,
        # deadline: deadline-clock time from lease.deadline to LeaseLost caught in the body
        "after_deadline_s": float(rec["at_clock"]) - float(rec["deadline"]),
    }


def run(
    app: Celery,
    records: redis.Redis,
    lease_store: RedisServer,
    workers: dict[str, Worker],
    quick: bool,
    seed: int = 4,
) -> dict[str, Any]:
    """Benchmark 4 on one worker per pool; ``repeats`` trials per (pool, cause, body)."""
    repeats, limit = (1, LIMIT_QUICK) if quick else (5, LIMIT)
    rng = random.Random(seed)
    cells: dict[str, Any] = {}
    for pool in POOLS:
        for body in BODIES:
            for cause in CAUSES:
                # Where the body cannot be interrupted every trial lasts the whole body and
                # tells the same story: fewer of them.
                count = min(repeats, 2) if (pool, body) in UNINTERRUPTIBLE else repeats
                trials = [
                    trial(app, records, lease_store, pool, cause, body, rng, limit)
                    for _ in range(count)
                ]
                figure = "after_event_s" if cause == "refused" else "after_deadline_s"
                raised = [t[figure] * 1000 for t in trials if t["raised"]]
                cells[f"{pool}/{cause}/{body}"] = {
                    "pool": pool,
                    "cause": cause,
                    "body": body,
                    "trials": len(trials),
                    "raised": len(raised),
                    "mechanism": trials[0]["mechanism"],
                    "measure": (
                        "ms from the refusal (DEL) to LeaseLost in the body"
                        if cause == "refused"
                        else "ms from the local deadline to LeaseLost in the body"
                    ),
                    "latency_ms": summary(raised) if raised else None,
                    "samples_ms": raised,
                    "causes_seen": sorted({t["cause_seen"] for t in trials}),
                }
    return {
        "ttl_s": TTL,
        "renew_interval_s": TTL / 3,
        "body_limit_s": limit,
        "repeats": repeats,
        "cells": cells,
    }
