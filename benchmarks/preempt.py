"""How fast a preempted body learns it: ``python -m benchmarks.preempt [--trials N]``.

Per pool (prefork, threads, gevent), a real worker runs ``pre.work`` of ``tests/apps/
preempt_app.py`` (``lease_on_conflict="preempt"``, ``lease_ttl`` 30 s, so a renewal, the
fallback, would come only every 10 s). Once a first execution's body runs (it sleeps in 10 ms
steps, which every pool can interrupt), a second one with the same key is sent; the figure is
the wall-clock time from the newcomer's start (Celery's ``task_prerun``, before its acquire:
the refused acquire, the take-over and the notice are all in it) to the moment the old body
caught ``LeaseLost(cause="preempted")``, both stamped with ``time.time()`` on this one
machine. The lease store, broker and results are one private
redis-server. Prints one JSON object: per pool, the median, p99, min and max in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from harness import REPO_ROOT
from harness.redis_server import RedisServer
from harness.waiting import wait_for
from harness.workers import CeleryWorker

from ._infra import summary

POOLS = ("prefork", "threads", "gevent")
APP = "tests.apps.preempt_app"


def measure(pool: str, trials: int, url: str, log_dir: Path) -> list[float]:
    """``trials`` preemptions on a ``pool`` worker; the notice's latency of each, seconds."""
    queue = f"preempt-{pool}-{uuid.uuid4().hex[:6]}"
    env = {
        "TEST_BROKER_URL": url,
        "TEST_RESULT_BACKEND": url,
        "TEST_QUEUE": queue,
        "PYTHONPATH": str(REPO_ROOT),
    }
    os.environ.update(env)
    from tests.apps import preempt_app

    preempt_app.app.conf.update(
        broker_url=url, result_backend=url, lease_backend=url, task_default_queue=queue
    )
    worker = CeleryWorker(
        APP,
        pool=pool,
        concurrency=2 if pool != "gevent" else 4,
        queue=queue,
        env={**os.environ, **env},
        log_dir=log_dir,
        cwd=REPO_ROOT,
    )
    worker.start()
    latencies = []
    try:
        worker.wait_ready(60)
        for _ in range(trials):
            tag = uuid.uuid4().hex[:10]
            old = preempt_app.work.delay(tag, "old")
            wait_for(
                lambda t=tag: [r for r in preempt_app.runs(t) if r["what"] == "start"],
                30,
                0.005,
                "the first body's start",
            )
            preempt_app.work.delay(tag, "new", 0.05).get(timeout=30)
            old.get(timeout=30, propagate=False)
            seen = {(r["run"], r["what"]): r["at"] for r in preempt_app.runs(tag)}
            latencies.append(seen["old", "lost"] - seen["new", "prerun"])
    finally:
        worker.stop()
    return latencies


def main(argv: list[str] | None = None) -> int:
    """Measure every pool; print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="preemptions per pool")
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {}
    with RedisServer() as server, tempfile.TemporaryDirectory() as logs:
        for pool in POOLS:
            values = measure(pool, args.trials, server.url(0), Path(logs))
            figures[pool] = {
                k: v if k == "n" else round(v * 1000, 1) for k, v in summary(values).items()
            }
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
