"""Benchmark 6: no growth over many leased executions (prefork and threads pools).

Per pool, ``n`` executions of ``bench.leased`` (distinct arguments, so ``n`` distinct leases
taken and released) go through one worker. The worker's process tree is measured after a
warm-up batch (connections open, scripts loaded) and again after the ``n`` executions:
resident memory (sum over the main process and its pool children), open sockets, threads.

Publishing ``n`` tasks through Celery would take longer than running them, so one message is
published with Celery into a holding list and ``n`` copies of it are written straight into the
worker's queue, each with its own task id, delivery tag and arguments (the Redis transport's
envelope: JSON with a base64 body).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any

import psutil
import redis
from celery import Celery

from harness.waiting import wait_for

from ._infra import Worker

POOLS = ("prefork", "threads")
N_FULL = 100_000
N_QUICK = 2_000
WARM_UP = 1_000
_CHUNK = 2_000


def _tree(worker: Worker) -> list[psutil.Process]:
    if worker.process is None:
        raise RuntimeError(f"{worker!r} is not running")
    main = psutil.Process(worker.process.pid)
    return [main, *main.children(recursive=True)]


def snapshot(worker: Worker) -> dict[str, float]:
    """RSS (MiB), open sockets and threads of the worker's process tree, and its processes."""
    rss = sockets = threads = 0
    procs = _tree(worker)
    for proc in procs:
        try:
            rss += proc.memory_info().rss
            sockets += len(proc.net_connections(kind="all"))
            threads += proc.num_threads()
        except psutil.NoSuchProcess:
            continue
    return {"rss_mib": rss / 2**20, "sockets": sockets, "threads": threads, "processes": len(procs)}


def _template(app: Celery, records: redis.Redis, run: str) -> dict[str, Any]:
    hold = f"bench-soak-template-{run}"
    app.tasks["bench.leased"].apply_async((run, -1, 0), queue=hold)
    raw = records.lpop(hold)
    if raw is None:
        raise RuntimeError("the template message was not published")
    message: dict[str, Any] = json.loads(raw)
    return message


def _copies(template: dict[str, Any], run: str, start: int, stop: int, n: int) -> list[bytes]:
    out = []
    body = json.loads(base64.b64decode(template["body"]))
    for i in range(start, stop):
        task_id = str(uuid.uuid4())
        body[0] = [run, i, n]
        msg = {
            **template,
            "body": base64.b64encode(json.dumps(body).encode()).decode(),
            "headers": {
                **template["headers"],
                "id": task_id,
                "root_id": task_id,
                "argsrepr": repr((run, i, n)),
            },
            "properties": {
                **template["properties"],
                "correlation_id": task_id,
                "delivery_tag": str(uuid.uuid4()),
            },
        }
        out.append(json.dumps(msg).encode())
    return out


def push(app: Celery, records: redis.Redis, queue: str, n: int) -> str:
    """Write ``n`` ``bench.leased`` messages (task ``n - 1`` marks the end) onto ``queue``."""
    run = uuid.uuid4().hex[:12]
    template = _template(app, records, run)
    for start in range(0, n, _CHUNK):
        records.lpush(queue, *_copies(template, run, start, min(start + _CHUNK, n), n))
    return run


def soak_pool(app: Celery, records: redis.Redis, worker: Worker, n: int) -> dict[str, Any]:
    """Warm up, measure, run ``n`` executions, measure again."""
    queue = worker.queues[-1]
    warm = push(app, records, queue, WARM_UP)
    wait_for(lambda: records.exists(f"tp:{warm}:last"), 120, 0.05, worker.log_tail)
    time.sleep(1.5)  # pending release replies read, heartbeat idle
    start = snapshot(worker)
    started = time.perf_counter()
    run = push(app, records, queue, n)
    wait_for(lambda: records.exists(f"tp:{run}:last"), 60 + n / 50, 0.2, worker.log_tail)
    elapsed = time.perf_counter() - started
    time.sleep(1.5)
    end = snapshot(worker)
    records.delete(f"tp:{warm}:first", f"tp:{warm}:last", f"tp:{run}:first", f"tp:{run}:last")
    return {
        "pool": worker.pool,
        "concurrency": worker.concurrency,
        "executions": n,
        "seconds": elapsed,
        "start": start,
        "end": end,
        "growth": {k: end[k] - start[k] for k in start},
    }


def run(
    app: Celery, records: redis.Redis, workers: dict[str, Worker], quick: bool
) -> dict[str, Any]:
    """Benchmark 6 on the prefork and threads workers in ``workers``."""
    n = N_QUICK if quick else N_FULL
    return {
        "executions": n,
        "pools": {pool: soak_pool(app, records, workers[pool], n) for pool in POOLS},
    }
