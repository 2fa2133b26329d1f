"""Benchmark 7: the whole trip, publisher included: one producer publishes while one solo worker
consumes, for plain ``Task``, ``LeasedTask`` and its peers, which lock in the publisher.

Two workloads, each per round, per variant (in an order rotated each round), through the same
solo worker, broker and Redis:

- ``distinct``: ``n`` tasks with distinct keys and a trivial body (every call runs);
- ``bursts``: ``keys`` keys x ``copies`` requests each, interleaved (key 0, 1, ... then again),
  each body sleeping 2 ms: a duplicate-heavy load, where the peers refuse a duplicate when it
  is published, ``LeasedTask`` runs back-to-back calls one after the other (none overlaps in
  one solo worker, and none may be skipped), and publish-time dedupe variants publish nothing
  for a key that has a copy waiting.

A batch's time runs from the first publish to the moment the benchmark reads the worker's
report (a last task, run after every body published before it: the solo worker runs its queue
in order); its CPU is the benchmark process's (the publisher, which blocks on the report) plus
the worker's plus the broker's redis-server's, over that time. Ratios are taken to plain
``Task`` in the same round; each batch's bodies are counted in the worker (per key), so a
variant that skipped a call it must run is reported.

``python -m benchmarks.e2e [--quick]`` runs it alone (its own redis-server and worker).

``python -m benchmarks.e2e --concurrent`` is the variant with a concurrent worker (threads,
``-c 4``, :data:`CONCURRENCY`) instead of the solo one, where copies of one key can overlap:
there ``LeasedTask`` skips a copy that starts while another runs and ``"coalesce"`` folds it
into the key's pending run. Its workloads are the bursts twice: ``bursts`` interleaved as
above, and ``bursts_grouped``, each key's requests published back to back (a burst of
triggers for one key at once), 20 keys x 10, each body 100 ms (:data:`GROUPED_SLEEP_MS`). A
batch ends once the worker's queue is empty and it holds no message but the report (the
report polls for it: a concurrent worker does not run its queue in order). Not part of
``python -m benchmarks``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from ._infra import Worker, client_kwargs, context_switches, process_cpu, spread

#: Variants that run every call they are sent (no publish-time refusal).
RUN_EVERY_CALL = ("plain", "leased", "leased_sync", "leased_coalesce")
LABELS = {
    "plain": "celery Task (plain)",
    "leased": "celery-lease LeasedTask",
    "leased_sync": "celery-lease LeasedTask, release waited for",
    "singleton": "celery-singleton Singleton",
    "once": "celery-once QueueOnce",
    "leased_dedupe": "celery-lease, lease_dedupe=True",
    "leased_coalesce": 'celery-lease, lease_on_conflict="coalesce"',
}
QUEUE = "e2e-solo"
CONCURRENT_QUEUE = "e2e-concurrent"
#: The concurrent variant's worker: pool and concurrency.
CONCURRENCY = ("threads", 4)
BURST_SLEEP_MS = 2.0
#: The body of the concurrent variant's grouped bursts, milliseconds: long enough that a key's
#: ten back-to-back copies are all taken while its first copy runs. A duplicate that finds its
#: key held costs the worker a few ms of CPU (the conflict, the park or the stored marker):
#: with 20 ms bodies on 2 shared cores a burst outlasted its first run (coalesce: up to 4
#: bodies per key); 2 ms bodies rarely overlap at all.
GROUPED_SLEEP_MS = 100.0


def workloads(quick: bool, concurrent: bool = False) -> dict[str, dict[str, Any]]:
    """Workload name -> its calls: ``keys`` x ``copies``, the body's sleep in milliseconds,
    and (``grouped``) whether each key's copies are published back to back."""
    if concurrent:
        bursts = workloads(quick)["bursts"]
        return {
            "bursts": bursts,
            "bursts_grouped": {
                "keys": max(bursts["keys"] // 5, 4),
                "copies": 10,
                "sleep_ms": GROUPED_SLEEP_MS,
                "grouped": True,
            },
        }
    if quick:
        return {
            "distinct": {"keys": 150, "copies": 1, "sleep_ms": 0.0},
            "bursts": {"keys": 20, "copies": 5, "sleep_ms": BURST_SLEEP_MS},
        }
    return {
        "distinct": {"keys": 1500, "copies": 1, "sleep_ms": 0.0},
        "bursts": {"keys": 100, "copies": 10, "sleep_ms": BURST_SLEEP_MS},
    }


def run_batch(
    app: Celery,
    records: redis.Redis,
    worker: Worker,
    redis_pid: int | None,
    variant: str,
    work: dict[str, Any],
) -> dict[str, float]:
    """Publish one workload's calls of ``variant`` while ``worker`` consumes them; returns
    ``seconds``, the CPU seconds of publisher, worker and Redis, and the bodies run."""
    run = uuid.uuid4().hex[:12]
    task = app.tasks[f"bench.e2e_{variant}"]
    me, consumer = os.getpid(), worker.process.pid if worker.process is not None else None

    def cpu() -> tuple[float, float, float]:
        # The benchmark's own process alone: the worker and redis-server may be its children.
        return (process_cpu(me, children=False), process_cpu(consumer), process_cpu(redis_pid))

    queue = worker.queues[0]
    if work.get("grouped"):
        order = [key for key in range(work["keys"]) for _ in range(work["copies"])]
    else:
        order = [key for _ in range(work["copies"]) for key in range(work["keys"])]
    cpu0, switches0 = cpu(), context_switches(consumer)
    started = time.perf_counter()
    published = 0
    with app.producer_or_acquire() as producer:
        for key in order:
            task_id = uuid.uuid4().hex
            sent = task.apply_async(
                (run, str(key), work["sleep_ms"]), queue=queue, producer=producer, task_id=task_id
            )
            # A refused duplicate: None (celery-once, graceful), or the result of the
            # copy already queued (celery-singleton).
            published += sent is not None and sent.id == task_id
        report_args = (run, queue) if worker.concurrency > 1 else (run,)
        app.tasks["bench.e2e_report"].apply_async(report_args, queue=queue, producer=producer)
    # BLPOP blocks in the kernel: the publisher's CPU while it waits stays near zero. One
    # second at a time: the records client times out after five.
    deadline = started + 60 + work["keys"] * work["copies"] / 20
    found = None
    while found is None and time.perf_counter() < deadline:
        found = records.blpop([f"e2e:{run}:done"], 1)
    seconds = time.perf_counter() - started
    if found is None:
        raise RuntimeError(f"e2e {variant}: no report from the worker\n{worker.log_tail()}")
    cpu1, switches1 = cpu(), context_switches(consumer)
    report = json.loads(found[1])
    return {
        "seconds": seconds,
        "publisher_cpu": cpu1[0] - cpu0[0],
        "worker_cpu": cpu1[1] - cpu0[1],
        "redis_cpu": cpu1[2] - cpu0[2],
        "cpu": sum(cpu1) - sum(cpu0),
        "calls": work["keys"] * work["copies"],
        "worker_waits": switches1[0] - switches0[0],
        "worker_preemptions": switches1[1] - switches0[1],
        "published": published,
        "bodies": report["bodies"],
        "max_bodies_per_key": report["max_per_key"],
    }


def available(app: Celery) -> tuple[list[str], dict[str, str]]:
    """The variants the app registered, and a note for each one it could not."""
    from .app import E2E_VARIANTS, e2e_rejected

    names = [v for v in E2E_VARIANTS if f"bench.e2e_{v}" in app.tasks]
    skipped = {v: e2e_rejected(v) or "not registered" for v in E2E_VARIANTS if v not in names}
    return names, skipped


def measure(
    app: Celery,
    records: redis.Redis,
    worker: Worker,
    redis_pid: int | None,
    work: dict[str, Any],
    rounds: int,
) -> dict[str, Any]:
    """Every variant through one workload for ``rounds`` rounds; ratios taken per round."""
    variants, _ = available(app)
    warm = dict(work, keys=max(10, work["keys"] // 10))
    for variant in variants:  # imports, script loads, connection pools
        run_batch(app, records, worker, redis_pid, variant, warm)
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for r in range(rounds):
        for variant in variants[r % len(variants) :] + variants[: r % len(variants)]:
            rows[variant].append(run_batch(app, records, worker, redis_pid, variant, work))
    result: dict[str, Any] = {**work, "rounds": rounds, "variants": {}}
    calls = work["keys"] * work["copies"]
    for variant in variants:
        mine = rows[variant]

        def ratio(field: str, mine: list[dict[str, float]] = mine) -> dict[str, float]:
            return spread(a[field] / b[field] for a, b in zip(mine, rows["plain"], strict=True))

        result["variants"][variant] = {
            "label": LABELS.get(variant, variant),
            "seconds": spread(row["seconds"] for row in mine),
            "time_ratio_to_plain": ratio("seconds"),
            "cpu_ratio_to_plain": ratio("cpu"),
            **{
                f"{part}_cpu_us_per_call": spread(row[f"{part}_cpu"] / calls * 1e6 for row in mine)
                for part in ("publisher", "worker", "redis")
            },
            # The worker's context switches per call: waits (voluntary) and preemptions.
            **{
                f"worker_{kind}_per_call": spread(row[f"worker_{kind}"] / calls for row in mine)
                for kind in ("waits", "preemptions")
            },
            "published": spread(row["published"] for row in mine),
            "bodies": spread(row["bodies"] for row in mine),
            "max_bodies_per_key": max(row["max_bodies_per_key"] for row in mine),
            # Every call a variant must run did run (back-to-back calls never skipped; with a
            # concurrent worker, overlapping copies of a leased key are skipped or coalesced).
            "every_call_ran": all(row["bodies"] == calls for row in mine)
            if variant in RUN_EVERY_CALL and (worker.concurrency == 1 or variant == "plain")
            else None,
        }
    return result


def run(
    app: Celery,
    records: redis.Redis,
    worker: Worker,
    redis_pid: int | None,
    quick: bool,
    rounds: int | None = None,
) -> dict[str, Any]:
    """Benchmark 7 on the solo ``worker`` (consuming :data:`QUEUE`), or the concurrent
    variant's (:data:`CONCURRENT_QUEUE`); ``redis_pid`` is the broker's redis-server, whose
    CPU is counted; ``rounds`` (int) defaults to 1 with ``quick``, else 5."""
    rounds = rounds or (1 if quick else 5)
    concurrent = worker.concurrency > 1
    _, skipped = available(app)
    for variant, why in skipped.items():
        print(
            f"  e2e: {variant} skipped (the installed celery_lease refuses its options: {why})",
            file=sys.stderr,
            flush=True,
        )
    pool = f"{worker.pool} (-c {worker.concurrency})" if concurrent else worker.pool
    return {
        "pool": pool,
        "skipped": skipped,
        "workloads": {
            name: measure(app, records, worker, redis_pid, work, rounds)
            for name, work in workloads(quick, concurrent).items()
        },
    }


def start_worker(
    env: dict[str, str], log_dir: Path, records: redis.Redis, concurrent: bool = False
) -> Worker:
    """The benchmark's own solo worker, consuming :data:`QUEUE` only; with ``concurrent``,
    the :data:`CONCURRENCY` worker consuming :data:`CONCURRENT_QUEUE`."""
    pool, concurrency = CONCURRENCY if concurrent else ("solo", 1)
    worker = Worker(
        pool, concurrency, [CONCURRENT_QUEUE if concurrent else QUEUE], env, log_dir, records
    )
    worker.start()
    return worker


def main(argv: list[str] | None = None) -> int:
    """Run benchmark 7 alone: ``python -m benchmarks.e2e [--quick] [--out FILE]``."""
    from harness.redis_server import RedisServer

    from . import report
    from .app import make_app

    parser = argparse.ArgumentParser(prog="python -m benchmarks.e2e")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--concurrent",
        action="store_true",
        help=f"a {CONCURRENCY[0]} worker with -c {CONCURRENCY[1]}, bursts only",
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5, quick 1)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="celery-lease-e2e-"))
    with RedisServer() as broker:
        records = broker.client(**client_kwargs())
        worker = start_worker({"BENCH_BROKER": broker.url()}, log_dir, records, args.concurrent)
        try:
            worker.wait_ready()
            result = run(
                make_app(broker.url()), records, worker, broker.pid, args.quick, args.rounds
            )
        finally:
            worker.stop()
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(report.e2e_markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
