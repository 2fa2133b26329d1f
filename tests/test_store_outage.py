"""A lease store outage with a real worker and a stopped private redis-server: an execution
waits it out without using up ``max_retries``, up to ``lease_store_outage_max``, then fails
with ``LeaseStoreUnavailable``."""

from __future__ import annotations

import json

import redis
from celery import Celery

from harness.waiting import wait_for
from tests.support.fixtures import RedisFactory, WorkerFactory


def test_an_outage_longer_than_max_retries_is_waited_out_and_a_longer_one_than_the_bound_fails(
    redis_url: str,
    throwaway_redis: RedisFactory,
    worker_factory: WorkerFactory,
) -> None:
    lease_store = throwaway_redis()
    lease_store.stop()
    # TTL 1.5 s: Celery's own retries (one at most, every 0.5 s renew interval) would give up
    # within a second.
    worker_factory(
        "tests.apps.lease_app", env={"LEASE_BACKEND": lease_store.url(), "LEASE_TTL": "1.5"}
    )
    app = Celery("client", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.task_default_queue = worker_factory.queue
    journal = redis.Redis.from_url(redis_url)
    waited = app.send_task("one_retry", ("a",))
    bounded = app.send_task("short_outage", ("b",))
    # The bounded one gives up once the outage has lasted its 1.5 s.
    wait_for(lambda: bounded.ready(), 30)
    assert bounded.state == "FAILURE"
    assert type(bounded.result).__name__ == "LeaseStoreUnavailable"
    # The other keeps waiting (past the one retry Celery would allow it), and runs once the
    # store answers, its retries not counted.
    assert waited.state == "RETRY"
    lease_store.restart()
    assert waited.get(timeout=60) == 0
    starts = [json.loads(e) for e in journal.lrange("journal", 0, -1)]
    assert [(e["tag"], e["retries"]) for e in starts if e["event"] == "start"] == [("a", 0)]


def test_store_errors_of_one_message_far_apart_are_two_outages() -> None:
    from celery_lease.execution.outage import NEW_OUTAGE_GAP, OUTAGE_HEADER, _outage_start

    now = 10_000.0
    assert _outage_start({OUTAGE_HEADER: [9_000.0, now - 20.0]}, now) == 9_000.0
    assert _outage_start({OUTAGE_HEADER: [9_000.0, now + 5.0]}, now) == 9_000.0  # a clock ahead
    assert _outage_start({OUTAGE_HEADER: [9_000.0, now - NEW_OUTAGE_GAP - 1]}, now) == now
    assert _outage_start({OUTAGE_HEADER: "damaged"}, now) == now
    assert _outage_start({}, now) == now
