"""``lease_dedupe`` through faults at each step of a publish and of a waiting copy, against a
real Redis, real worker processes and a real publisher process killed at the step: the claim
never outlives its message by more than the bound docs/crash-safety.md names, a revoked
waiting copy's claim goes with it, and nothing runs twice."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import redis
from celery.exceptions import TaskRevokedError
from celery.utils import uuid

from celery_lease import store
from celery_lease.base.keys import claim_key
from harness import REPO_ROOT
from tests.apps import dedupe_app
from tests.apps.dedupe_app import open_gate, runs, sync
from tests.support.fixtures import WorkerFactory
from tests.support.waiting import wait_for
from tests.support.workers import BROKER_URL_ENV, QUEUE_ENV, RESULT_BACKEND_ENV

APP = "tests.apps.dedupe_app"
LEASE_TTL = 5.0  # dedupe_app's lease_ttl: the provisional lifetime of a claim
SLACK = 1.0  # how late a key's expiry may be seen on a loaded machine


@pytest.fixture
def client(redis_url: str, worker_factory: WorkerFactory) -> Iterator[redis.Redis]:
    dedupe_app.configure(
        redis_url, worker_factory.queue, task_always_eager=False, lease_dedupe_ttl=300.0
    )
    with redis.Redis.from_url(redis_url) as client:
        yield client


def claim_of(tag: str) -> str:
    return claim_key(sync.lease_key_for((tag,)))


def claimed_by(client: redis.Redis, tag: str) -> str | None:
    found = store.parse_claim(client.get(claim_of(tag)))
    return found.task_id if found else None


def publish_killed_at(step: str, tag: str, redis_url: str, queue: str) -> str:
    """Run a publisher process of ``sync(tag)`` that SIGKILLs itself at ``step``; its task id."""
    task_id = uuid()
    env = {**os.environ, BROKER_URL_ENV: redis_url, RESULT_BACKEND_ENV: redis_url, QUEUE_ENV: queue}
    done = subprocess.run(
        [sys.executable, "-m", "tests.apps.dedupe_publisher", step, tag, task_id],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == -9, done.stderr.decode()
    return task_id


def lapses_within(client: redis.Redis, tag: str, since: float, bound: float) -> float:
    """Wait until ``tag``'s claim is gone; assert it went within ``bound`` s of ``since``."""
    wait_for(lambda: client.exists(claim_of(tag)) == 0, bound + 30, message="no lapse")
    took = time.monotonic() - since
    assert took <= bound + SLACK, f"the claim outlived its bound: {took:.1f} s > {bound} s"
    return took


def test_a_publisher_killed_between_its_claim_and_its_publish_frees_the_key_within_lease_ttl(
    client: redis.Redis, redis_url: str, worker_factory: WorkerFactory
) -> None:
    dead = publish_killed_at("claimed", "k", redis_url, worker_factory.queue)
    since = time.monotonic()  # the claim was written before the kill
    assert claimed_by(client, "k") == dead and client.llen(worker_factory.queue) == 0
    assert 0 < client.pttl(claim_of("k")) <= LEASE_TTL * 1000  # provisional, not 300 s
    lapses_within(client, "k", since, LEASE_TTL)
    worker_factory(APP)
    later = sync.delay("k", 1)
    assert later.lease_disposition == "published" and later.id != dead
    open_gate("k")
    assert later.get(timeout=30) == f"run {later.id} (n=1)"
    assert [(r["what"], r["id"]) for r in runs("k")] == [("start", later.id), ("end", later.id)]


def test_a_publisher_killed_right_after_its_publish_leaves_a_message_that_runs_once(
    client: redis.Redis, redis_url: str, worker_factory: WorkerFactory
) -> None:
    sent = publish_killed_at("published", "p", redis_url, worker_factory.queue)
    since = time.monotonic()
    assert client.llen(worker_factory.queue) == 1 and claimed_by(client, "p") == sent
    folded = sync.delay("p", 1)  # the claim still names the copy on the broker
    assert (folded.id, folded.lease_disposition) == (sent, "deduplicated")
    lapses_within(client, "p", since, LEASE_TTL)  # never confirmed: the provisional lifetime
    worker_factory(APP)
    open_gate("p")
    assert folded.get(timeout=30) == f"run {sent} (n=0)"
    assert [(r["what"], r["id"]) for r in runs("p")] == [("start", sent), ("end", sent)]


def test_a_published_claim_gets_its_full_lifetime_and_a_purged_message_frees_it_at_its_end(
    client: redis.Redis, redis_url: str, worker_factory: WorkerFactory
) -> None:
    dedupe_app.configure(redis_url, worker_factory.queue, lease_dedupe_ttl=7.0)
    lost = sync.delay("g")
    since = time.monotonic()
    assert LEASE_TTL * 1000 < client.pttl(claim_of("g")) <= 7000  # confirmed past lease_ttl
    with dedupe_app.app.connection_for_write() as conn:  # the broker drops the waiting copy
        assert conn.default_channel.queue_purge(worker_factory.queue) == 1
    assert sync.delay("g", 1).id == lost.id  # folded onto the lost copy until the claim ends
    lapses_within(client, "g", since, 7.0)
    worker_factory(APP)
    later = sync.delay("g", 2)
    assert later.lease_disposition == "published"
    open_gate("g")
    assert later.get(timeout=30) == f"run {later.id} (n=2)"
    assert [r["id"] for r in runs("g")] == [later.id, later.id]


def test_a_waiting_copy_revoked_while_it_waits_frees_its_claim_and_fails_its_folded_handles(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    # Without prefetch the waiting copy stays on the broker while the first runs: a revoke then
    # reaches the worker before its message does (one the worker already handed to its pool
    # runs whatever revoke says: Celery's rule, docs/crash-safety.md).
    worker_factory(APP, pool="threads", concurrency=1, extra_args=("--disable-prefetch",))
    first = sync.delay("v", 0)
    wait_for(lambda: len(runs("v")) == 1, 30, message="the first run did not start")
    waiting = sync.delay("v", 1)
    folded = sync.delay("v", 2)
    assert (folded.id, folded.lease_disposition) == (waiting.id, "deduplicated")
    assert dedupe_app.app.control.revoke(waiting.id, reply=True, timeout=10, limit=1)
    open_gate("v")
    assert first.get(timeout=30) == f"run {first.id} (n=0)"
    with pytest.raises(TaskRevokedError):
        folded.get(timeout=30)
    wait_for(lambda: client.exists(claim_of("v")) == 0, 30, message="the claim outlived revoke")
    after = sync.delay("v", 3)
    assert after.lease_disposition == "published" and after.id != waiting.id
    assert after.get(timeout=30) == f"run {after.id} (n=3)"
    assert [r["id"] for r in runs("v") if r["what"] == "start"] == [first.id, after.id]
