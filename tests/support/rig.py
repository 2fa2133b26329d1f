"""A rig for fault tests: a broker server, a separate lease store, workers of one pool.

The lease store is its own server so a test can pause, restart or kill it without touching
the broker, the result backend, or the journal the test app writes to.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

from celery import Celery

from harness.redis_server import RedisServer
from harness.waiting import wait_for
from harness.workers import CeleryWorker

APP = "tests.apps.lease_app"
POOLS = ["prefork", "solo", "threads", "gevent", "eventlet"]
#: The ``hold`` task's mode per pool: the threads pool cannot interrupt time.sleep, so its
#: tasks sleep in short chunks instead (``sleep`` everywhere else).
MODE = {"threads": "chunks"}
CONCURRENCY = {"prefork": 2, "solo": 1, "threads": 4, "gevent": 4, "eventlet": 4}

#: Figures the fault tests measured, printed at the end of the session (see conftest).
MEASURED: list[tuple[str, str, float, str]] = []  # (what, pool, value, unit)


class Rig:
    """Servers, workers and a client app for one pool.

    ``broker`` holds the results and the journal, and is the Celery broker unless
    ``broker_url`` names another (a RabbitMQ vhost).
    """

    def __init__(
        self,
        broker: RedisServer,
        pool: str,
        log_dir: Path,
        ttl: float = 1.5,
        broker_url: str | None = None,
    ) -> None:
        self.broker = broker
        self.broker_url = broker_url or broker.url()
        self.pool = pool
        self.ttl = ttl
        self.log_dir = log_dir
        self.store = RedisServer().start()
        self.queue = f"q-{uuid.uuid4().hex[:8]}"
        self.db = broker.client()
        self.leases = self.store.client()
        self.app = Celery(
            "client", broker=self.broker_url, backend=broker.url(), set_as_current=False
        )
        self.app.conf.task_default_queue = self.queue
        self.workers: list[CeleryWorker] = []

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "TEST_BROKER_URL": self.broker_url,
            "TEST_RESULT_BACKEND": self.broker.url(),
            "TEST_QUEUE": self.queue,
            "LEASE_BACKEND": self.store.url(),
            "LEASE_TTL": str(self.ttl),
            **extra,
        }

    def worker(
        self,
        pool: str | None = None,
        queue: str | None = None,
        concurrency: int | None = None,
        **env: str,
    ) -> CeleryWorker:
        pool = pool or self.pool
        worker = CeleryWorker(
            APP,
            pool=pool,
            concurrency=concurrency or CONCURRENCY[pool],
            queue=queue or self.queue,
            env=self.env(**env),
            log_dir=self.log_dir,
        )
        self.workers.append(worker)
        worker.start().wait_ready(60)
        return worker

    def send(self, name: str, *args: Any, queue: str | None = None, **options: Any) -> Any:
        return self.app.send_task(name, args, queue=queue or self.queue, **options)

    def journal(self, tag: str | None = None, event: str | None = None) -> list[dict[str, Any]]:
        entries = [json.loads(raw) for raw in self.db.lrange("journal", 0, -1)]
        return [
            e
            for e in entries
            if (tag is None or e.get("tag") == tag) and (event is None or e["event"] == event)
        ]

    def wait_event(
        self, tag: str, event: str, count: int = 1, timeout: float = 20.0
    ) -> list[dict[str, Any]]:
        return wait_for(
            lambda: found if len(found := self.journal(tag, event)) >= count else None,
            timeout,
            message=lambda: f"no {count}x {event} for {tag}:\n{self.logs()}",
        )

    def lease_keys(self) -> list[str]:
        return [k.decode() for k in self.leases.scan_iter("lease:*") if not k.endswith(b":fence")]

    def logs(self) -> str:
        return "\n".join(f"--- {w!r}\n{w.log_tail(30)}" for w in self.workers)

    def holder_pid(self, key: str) -> int:
        raw = self.leases.get(key)
        assert raw is not None, f"{key} is not held"
        return int(json.loads(raw.decode().split(":", 2)[2])["pid"])

    def reset(self) -> None:
        """Between tests: empty the journal and the lease store, wake the store."""
        if not self.store.running:
            self.store.start()
        self.store.resume()
        self.db.delete("journal")
        self.leases.flushall()

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
        self.store.close()


def stop_process(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def resume_process(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


def measured(name: str, pool: str, value: float, unit: str = "s") -> None:
    """Keep a figure for the end-of-session summary: ``value`` in ``unit`` (``"s"``: float
    seconds; ``""``: a count)."""
    MEASURED.append((name, pool, value, unit))
