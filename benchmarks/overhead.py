"""Benchmark 2: task throughput through a real worker, plain ``Task`` vs the singleton bases.

Per pool (solo, prefork), per round, per variant (in an order rotated each round):

1. publish ``n`` tasks with distinct arguments into a holding queue the worker does not read
   (the publishing time per task is recorded: celery-singleton and celery-once lock there);
2. ``RENAME`` the holding list onto the worker's queue, so the worker finds the whole batch at
   once and never waits for the publisher;
3. the throughput is ``(n - 1)`` over the time from the start of task 0's body to the end of
   task ``n - 1``'s body, both recorded by the tasks themselves; the worker's CPU time (main
   process and pool children) over the batch, per task, is a second figure that other load on
   the machine disturbs less.

Every variant runs through the same worker, broker and Redis, one after the other, so each
round yields ratios to plain ``Task`` measured under the same machine load. The ``floor``
variant (plain ``Task`` whose body makes two ``PING`` round trips) is the physical limit for a
lease taken when the execution starts and released synchronously; ``floor1`` (one ``PING``)
the limit when only the acquire is waited for (``LeasedTask``'s release is written before the
result is stored and its reply read later; ``leased_sync`` waits for it).
celery-singleton and celery-once lock when the task is published and unlock in the worker, so
part of their cost is in ``publish_us``, outside the worker's throughput.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis
from celery import Celery

from harness.waiting import wait_for

from ._infra import Worker, process_cpu, spread

VARIANTS = ("plain", "floor1", "floor", "leased", "leased_sync", "singleton", "once")
LABELS = {
    "plain": "celery Task (plain)",
    "floor1": "plain + 1 x PING in the body (floor, one round trip)",
    "floor": "plain + 2 x PING in the body (floor, two round trips)",
    "leased": "celery-lease LeasedTask (release reply read later)",
    "leased_sync": "celery-lease LeasedTask, release waited for",
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
    cpu0 = _worker_cpu(worker)
    records.rename(hold_queue, target_queue)
    wait_for(
        lambda: records.exists(f"tp:{run}:last"),
        30.0 + n / 20,
        0.005,
        lambda: f"{variant} batch on {worker.pool}:\n{worker.log_tail()}",
    )
    cpu = _worker_cpu(worker) - cpu0
    first = float(records.get(f"tp:{run}:first") or 0)
    last = float(records.get(f"tp:{run}:last") or 0)
    records.delete(f"tp:{run}:first", f"tp:{run}:last")
    return {
        "throughput": (n - 1) / (last - first),
        "publish_us": publish_us,
        "worker_cpu_us": cpu / n * 1e6,
    }


def _worker_cpu(worker: Worker) -> float:
    """Float seconds of CPU used so far by the worker and its pool processes."""
    return process_cpu(worker.process.pid if worker.process is not None else None)


def measure_pool(
    app: Celery, records: redis.Redis, worker: Worker, n: int, rounds: int
) -> dict[str, Any]:
    """All variants through one worker for ``rounds`` rounds; ratios are taken per round."""
    for variant in VARIANTS:  # warm-up: imports, script loads, connection pools
        run_batch(app, records, worker, variant, max(20, n // 10))
    per_round: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for variant in order:
            per_round[variant].append(run_batch(app, records, worker, variant, n))
    result: dict[str, Any] = {
        "pool": worker.pool,
        "concurrency": worker.concurrency,
        "tasks_per_batch": n,
        "rounds": rounds,
        "variants": {},
    }
    for variant in VARIANTS:
        rows = per_round[variant]

        def ratios(base: str, rows: list[dict[str, float]] = rows) -> dict[str, float]:
            return spread(
                row["throughput"] / ref["throughput"]
                for row, ref in zip(rows, per_round[base], strict=True)
            )

        result["variants"][variant] = {
            "label": LABELS[variant],
            "throughput": spread(row["throughput"] for row in rows),
            "ratio_to_plain": ratios("plain"),
            "ratio_to_floor": ratios("floor"),
            "publish_us": spread(row["publish_us"] for row in rows),
            "worker_cpu_us_per_task": spread(row["worker_cpu_us"] for row in rows),
        }
    return result


def run(
    app: Celery, records: redis.Redis, workers: dict[str, Worker], quick: bool
) -> dict[str, Any]:
    """Benchmark 2 on the solo and prefork workers in ``workers``."""
    n, rounds = (150, 1) if quick else (500, 6)
    return {"pools": {pool: measure_pool(app, records, workers[pool], n, rounds) for pool in POOLS}}
