"""Benchmark 2: task throughput through a real worker, plain ``Task`` vs the singleton bases.

Per pool (solo, prefork), per round, per variant (in an order rotated each round):

1. publish ``n`` tasks with distinct arguments into a holding queue the worker does not read
   (the publishing time per task is recorded: celery-singleton and celery-once lock there);
2. ``RENAME`` the holding list onto the worker's queue, so the worker finds the whole batch at
   once and never waits for the publisher;
3. the throughput is ``(n - 1)`` over the time from the start of task 0's body to the end of
   task ``n - 1``'s body, both recorded by the tasks themselves.

Every variant runs through the same worker, broker and Redis, one after the other, so each
round yields ratios to plain ``Task`` measured under the same machine load.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis
from celery import Celery

from ._infra import Worker, spread, wait_for

VARIANTS = ("plain", "leased", "singleton", "once")
LABELS = {
    "plain": "celery Task (plain)",
    "leased": "celery-lease LeasedTask",
    "singleton": "celery-singleton Singleton",
    "once": "celery-once QueueOnce",
}
POOLS = ("solo", "prefork")


def run_batch(
    app: Celery, records: redis.Redis, worker: Worker, variant: str, n: int
) -> dict[str, float]:
    """Push ``n`` tasks of ``variant`` through ``worker`` and time them.

    Returns:
        ``throughput`` (tasks per second), ``publish_us`` (microseconds per published task).
    """
    run = uuid.uuid4().hex[:12]
    hold_queue = f"bench-hold-{run}"
    task = app.tasks[f"bench.{variant}"]
    started = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for i in range(n):
            task.apply_async((run, i, n), queue=hold_queue, producer=producer)
    publish_us = (time.perf_counter() - started) / n * 1e6
    target_queue = worker.queues[0]
    records.rename(hold_queue, target_queue)
    wait_for(lambda: records.exists(f"tp:{run}:last"), 30.0 + n / 20, 0.005,
             lambda: f"{variant} batch on {worker.pool}:\n{worker.log_tail()}")
    first = float(records.get(f"tp:{run}:first") or 0)
    last = float(records.get(f"tp:{run}:last") or 0)
    records.delete(f"tp:{run}:first", f"tp:{run}:last")
    return {"throughput": (n - 1) / (last - first), "publish_us": publish_us}


def measure_pool(
    app: Celery, records: redis.Redis, worker: Worker, n: int, rounds: int
) -> dict[str, Any]:
    """All variants through one worker for ``rounds`` rounds; ratios are taken per round."""
    for variant in VARIANTS:  # warm-up: imports, script loads, connection pools
        run_batch(app, records, worker, variant, max(20, n // 10))
    per_round: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for variant in order:
            per_round[variant].append(run_batch(app, records, worker, variant, n))
    result: dict[str, Any] = {"pool": worker.pool, "concurrency": worker.concurrency,
                              "tasks_per_batch": n, "rounds": rounds, "variants": {}}
    for variant in VARIANTS:
        rows = per_round[variant]
        ratios = [row["throughput"] / base["throughput"]
                  for row, base in zip(rows, per_round["plain"], strict=True)]
        result["variants"][variant] = {
            "label": LABELS[variant],
            "throughput": spread(row["throughput"] for row in rows),
            "ratio_to_plain": spread(ratios),
            "publish_us": spread(row["publish_us"] for row in rows),
        }
    return result


def run(
    app: Celery, records: redis.Redis, workers: dict[str, Worker], quick: bool
) -> dict[str, Any]:
    """Benchmark 2 on the solo and prefork workers in ``workers``."""
    n, rounds = (150, 1) if quick else (1500, 3)
    return {"pools": {pool: measure_pool(app, records, workers[pool], n, rounds)
                      for pool in POOLS}}
