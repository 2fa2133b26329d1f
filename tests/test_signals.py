"""celery-lease signals and log lines, from a real worker: acquired, conflict, renewed, renewal
failed (the store is black-holed for less than a TTL: the outage's lines), lost, released."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from celery import Celery

from celery_lease import LeaseLost, store
from harness.redis_server import RedisServer
from harness.waiting import wait_for
from tests.support.fixtures import ProxyFactory, WorkerFactory
from tests.support.workers import BROKER_URL_ENV, QUEUE_ENV, RESULT_BACKEND_ENV

APP = "tests.apps.ops_app"


def _signals(client: redis.Redis, name: str) -> list[dict[str, Any]]:
    items = [json.loads(x) for x in client.lrange("signals", 0, -1)]
    return [s for s in items if s["signal"] == name]


def test_every_signal_carries_key_token_fencing_token_and_timings(
    redis_server: RedisServer,
    redis_url: str,
    worker_factory: WorkerFactory,
    tcp_proxy: ProxyFactory,
) -> None:
    proxy = tcp_proxy(redis_server.port)
    env = {
        BROKER_URL_ENV: redis_url,
        RESULT_BACKEND_ENV: redis_url,
        QUEUE_ENV: worker_factory.queue,
        "LEASE_TTL": "2.0",
        "RECORD_SIGNALS": "1",
        "LEASE_BACKEND": f"redis://127.0.0.1:{proxy.port}/0",
    }
    worker = worker_factory(APP, pool="threads", concurrency=2, env=env)
    app = Celery("client", broker=redis_url, backend=redis_url)
    app.conf.task_default_queue = worker_factory.queue
    client = redis.Redis.from_url(redis_url)

    holder = app.send_task("ops.hold", ("sig", 30))
    acquired = wait_for(lambda: _signals(client, "lease_acquired"), 15, message=worker.log_tail)[0]
    assert acquired["sender"] == "ops.hold" and acquired["task_id"] == holder.id
    key, token, fence = acquired["key"], acquired["token"], acquired["fencing_token"]
    assert key.startswith("lease:{ops.hold:") and len(token) == 32 and fence > 0
    assert acquired["ttl"] == 2.0 and 0 <= acquired["latency"] < 1

    duplicate = app.send_task("ops.hold", ("sig", 30))
    assert duplicate.get(timeout=15)["lease_skipped"] is True
    conflict = _signals(client, "lease_conflict")[0]
    assert conflict["key"] == key and conflict["task_id"] == duplicate.id
    assert conflict["holder_task_id"] == holder.id and conflict["token"] == token
    assert conflict["fencing_token"] == fence and conflict["policy"] == "skip"
    assert conflict["holder"] == f"{worker.hostname}:{worker.pid}"
    assert 0 < conflict["remaining"] <= 2.0

    renewed = wait_for(lambda: _signals(client, "lease_renewed"), 5)[0]
    assert (renewed["key"], renewed["token"], renewed["fencing_token"]) == (key, token, fence)
    assert 0 <= renewed["latency"] < 0.5 and 0 < renewed["margin"] <= 2.0

    # The store stops answering for less than a TTL: renewals fail, the lease survives.
    proxy.blackhole()
    try:
        failed = wait_for(lambda: _signals(client, "lease_renewal_failed"), 5)[0]
    finally:
        proxy.heal()
    assert (failed["key"], failed["token"], failed["fencing_token"]) == (key, token, fence)
    assert failed["task_id"] == holder.id and "Timeout" in failed["error"]
    assert 0 < failed["time_left"] < 2.0
    count = len(_signals(client, "lease_renewed"))
    wait_for(lambda: len(_signals(client, "lease_renewed")) > count, 5)
    assert not _signals(client, "lease_lost")

    # An operator deletes the lease: the next renewal is refused.
    assert store.revoke(client, key, token)
    with pytest.raises(LeaseLost):
        holder.get(timeout=15)
    lost = wait_for(lambda: _signals(client, "lease_lost"), 5)[0]
    assert (lost["key"], lost["token"], lost["fencing_token"]) == (key, token, fence)
    assert lost["cause"] == "refused" and lost["task_id"] == holder.id and lost["late"] >= 0
    released = wait_for(lambda: _signals(client, "lease_released"), 5)[0]
    assert (released["key"], released["token"], released["fencing_token"]) == (key, token, fence)
    assert released["released"] is False and released["held"] > 1.0

    log = worker.log_text()
    assert f"skipped: task ops.hold[{duplicate.id}] not run, lease {key} held by " in log
    assert f"(task {holder.id}, " in log and f"fencing_token={fence}); result stored" in log
    assert "lease conflict (skip)" not in log  # the generic line is DEBUG for a skip
    # The failed renewals (a timeout: the store unreachable) count in the outage's two lines
    # (the sweep of the same process may see it first), each try at DEBUG only.
    assert (
        log.count(f"{proxy.port}/0 is unreachable (seen by ") == 1
        and log.count(f"{proxy.port}/0 is reachable again after") == 1
        and "renewal failed" not in log
    ), log
    assert (
        f"lease lost: key={key} cause=refused task=ops.hold[{holder.id}] "
        f"fencing_token={fence}" in log
    )
