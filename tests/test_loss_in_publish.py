"""A lease lost while the library publishes for the body (a retry, a self-requeue, with
``lease_dedupe``: a store call first) never lands in that publish: the message goes out whole,
and the loss is recorded, or raised to the body once the message is out. Real worker processes,
a real paused redis-server."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult

from harness.waiting import wait_for
from tests.support.fixtures import RedisFactory, WorkerFactory

APP = "tests.apps.retry_publish_app"
Events = Callable[[], list[dict[str, object]]]


def _lose_while_publishing(
    task: str,
    tag: str,
    pool: str,
    redis_url: str,
    throwaway_redis: RedisFactory,
    worker_factory: WorkerFactory,
) -> tuple[AsyncResult, Events]:
    """Run ``task`` on a ``pool`` worker, pause its lease store once it started, and let it
    publish (the publish's store call waits for the paused store) until the heartbeat declared
    its loss; then resume the store. Returns its result and the journal reader."""
    lease_store = throwaway_redis()
    worker_factory(APP, pool=pool, env={"LEASE_BACKEND": lease_store.url()})
    app = Celery("client", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.task_default_queue = worker_factory.queue
    results = redis.Redis.from_url(redis_url)

    def events() -> list[dict[str, object]]:
        return [json.loads(e) for e in results.lrange("journal", 0, -1)]

    first = app.send_task(task, (tag,))
    wait_for(lambda: any(e["event"] == "start" for e in events()), 30)
    lease_store.pause()
    try:
        results.set(f"paused:{tag}", 1, ex=60)
        # The publish's claim waits for the paused store while the lease's deadline passes:
        # the heartbeat declares the loss and delivers it to the execution.
        wait_for(lambda: any(e["event"] == "lost" for e in events()), 30)
    finally:
        lease_store.resume()
    return first, events


@pytest.mark.parametrize("pool", ["solo", "prefork", "threads", "gevent"])
def test_a_loss_during_the_publish_of_a_retry_keeps_the_retry(
    pool: str,
    redis_url: str,
    throwaway_redis: RedisFactory,
    worker_factory: WorkerFactory,
) -> None:
    first, events = _lose_while_publishing(
        "retry_late", "a", pool, redis_url, throwaway_redis, worker_factory
    )
    # Before, the loss landed in the retry's publish, which Celery's retry turns into
    # Reject(requeue=False): the message was dropped and the job never ran again.
    assert first.get(timeout=30) == 1
    seen = events()
    assert [e.get("retries") for e in seen if e["event"] == "start"] == [0, 1]
    assert [e["cause"] for e in seen if e["event"] == "lost"] == ["deadline"]
    names = [e["event"] for e in seen]
    assert names.index("retrying") < names.index("lost")  # lost while the retry published
    # The loss was kept out of the publish; the body was not told mid-retry.
    assert "raised" not in names


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_a_loss_during_a_self_requeue_is_raised_once_the_message_is_out(
    pool: str,
    redis_url: str,
    throwaway_redis: RedisFactory,
    worker_factory: WorkerFactory,
) -> None:
    first, events = _lose_while_publishing(
        "requeue_late", "b", pool, redis_url, throwaway_redis, worker_factory
    )
    # The body is told (LeaseLost from its delay()), after the message went out: step 1 runs.
    # Before, the loss landed in the publish's claim: no message, and step 1 never ran.
    wait_for(lambda: [e.get("step") for e in events() if e["event"] == "start"] == [0, 1], 30)
    wait_for(first.ready, 30)
    assert first.state == "FAILURE" and type(first.result).__name__ == "LeaseLost"
    names = [e["event"] for e in events()]
    assert names.index("requeueing") < names.index("lost") < names.index("raised")
    assert "requeued" not in names
