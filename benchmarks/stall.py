"""Benchmark 5: how long a job stalls after its holder is SIGKILLed, against the TTL.

In a prefork worker (two children), ``bench.stall_<ms>`` runs as ``holder`` (it sleeps while
holding the lease), then the same call runs as ``dup``: it finds the lease held and retries
after the lease's remaining lifetime (``lease_on_conflict="retry"``). After a random offset
spread over one renewal interval the holder's pool child is SIGKILLed (no ``finally``, no
release). The stall is the time from the kill to the start of the duplicate's body; it is
bounded by the TTL (the key expires at most one TTL after its last renewal) plus the retry's
scheduling.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
import uuid
from typing import Any

import psutil
import redis
from celery import Celery

from harness.waiting import wait_for

from ._infra import Worker, summary


def _entries(records: redis.Redis, trial: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in records.lrange(f"stall:{trial}", 0, -1)]


def trial(
    app: Celery, records: redis.Redis, worker: Worker, ttl: float, rng: random.Random
) -> float:
    """One crash; returns the stall in float seconds."""
    trial_id = uuid.uuid4().hex[:12]
    task = app.tasks[f"bench.stall_{round(ttl * 1000)}"]
    task.apply_async((trial_id, "holder"), queue="stall")
    started = wait_for(lambda: _entries(records, trial_id), 30.0, 0.005, "stall holder start")
    holder_pid = int(started[0]["pid"])
    if worker.process is None or holder_pid not in {
        p.pid for p in psutil.Process(worker.process.pid).children()
    }:
        raise RuntimeError(f"holder pid {holder_pid} is not a pool child of {worker.name}")
    task.apply_async((trial_id, "dup"), queue="stall")
    time.sleep(0.1 + rng.random() * ttl / 3)
    killed_at = time.time()
    os.kill(holder_pid, signal.SIGKILL)
    dup = wait_for(
        lambda: [e for e in _entries(records, trial_id) if e["role"] == "dup"],
        ttl + 15.0,
        0.002,
        "the duplicate's start",
    )
    records.delete(f"stall:{trial_id}")
    return float(dup[0]["at"]) - killed_at


def run(
    app: Celery,
    records: redis.Redis,
    worker: Worker,
    ttls: tuple[float, ...],
    quick: bool,
    seed: int = 5,
) -> dict[str, Any]:
    """Benchmark 5 on the prefork ``worker``, ``repeats`` crashes per TTL."""
    repeats = 1 if quick else 3
    rng = random.Random(seed)
    result: dict[str, Any] = {"repeats": repeats, "pool": worker.pool, "ttls": {}}
    for ttl in ttls:
        stalls = [trial(app, records, worker, ttl, rng) for _ in range(repeats)]
        result["ttls"][f"{ttl:g}"] = {
            "ttl_s": ttl,
            "stall_s": summary(stalls),
            "samples_s": stalls,
            "worst_over_ttl_s": max(stalls) - ttl,
        }
    return result
