"""A lease lost while the library publishes for the body (a retry, with ``lease_dedupe``: a
store call first) never lands in that publish: the message goes out whole, and the loss is
recorded. Real worker processes, a real paused redis-server."""

from __future__ import annotations

import json

import pytest
import redis
from celery import Celery

from harness.waiting import wait_for
from tests.support.fixtures import RedisFactory, WorkerFactory

APP = "tests.apps.retry_publish_app"


@pytest.mark.parametrize("pool", ["solo", "prefork", "threads", "gevent"])
def test_a_loss_during_the_publish_of_a_retry_keeps_the_retry(
    pool: str, redis_url: str, throwaway_redis: RedisFactory, worker_factory: WorkerFactory,
) -> None:
    lease_store = throwaway_redis()
    worker_factory(APP, pool=pool, env={"LEASE_BACKEND": lease_store.url()})
    app = Celery("client", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.task_default_queue = worker_factory.queue
    results = redis.Redis.from_url(redis_url)

    def events() -> list[dict[str, object]]:
        return [json.loads(e) for e in results.lrange("journal", 0, -1)]

    first = app.send_task("retry_late", ("a",))
    wait_for(lambda: any(e["event"] == "start" for e in events()), 30)
    lease_store.pause()
    try:
        results.set("paused:a", 1, ex=60)
        # The retry's claim waits for the paused store while the lease's deadline passes: the
        # heartbeat declares the loss and delivers it to the execution.
        wait_for(lambda: any(e["event"] == "lost" for e in events()), 30)
    finally:
        lease_store.resume()
    # Before, the loss landed in the retry's publish, which Celery's retry turns into
    # Reject(requeue=False): the message was dropped and the job never ran again.
    assert first.get(timeout=30) == 1
    seen = events()
    assert [e.get("retries") for e in seen if e["event"] == "start"] == [0, 1]
    assert [e["cause"] for e in seen if e["event"] == "lost"] == ["deadline"]
    names = [e["event"] for e in seen]
    assert names.index("retrying") < names.index("lost")  # lost while the retry published
    # The loss was kept out of the publish; the body was not told mid-retry.
    assert not [e for e in seen if e["event"] == "raised"]

