"""Deduplication at publish (``lease_dedupe``) against a real Redis and real worker processes:
at most one waiting copy per key, a claim that goes with its message, a disposition on every
result, and the same script on Redis Cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import schedule
from celery.utils import uuid
from click.testing import CliRunner

from celery_lease import LeaseConfigError, LeaseStoreUnavailable, is_skipped, store
from celery_lease.base import signals
from celery_lease.base.keys import claim_key
from celery_lease.ops.cli import lease
from celery_lease.policies.dedupe import claim_lifetime
from harness.topologies import cluster_setup
from tests.apps import dedupe_app
from tests.apps.dedupe_app import open_gate, requeue, runs, skipping, sync
from tests.support.fixtures import BROKERS, WorkerFactory
from tests.support.redis_server import free_port
from tests.support.waiting import wait_for

APP = "tests.apps.dedupe_app"


@pytest.fixture
def client(redis_url: str, worker_factory: WorkerFactory) -> Iterator[redis.Redis]:
    dedupe_app.configure(
        redis_url,
        worker_factory.queue,
        task_always_eager=False,
        lease_on_store_error="retry",
        lease_dedupe_ttl=300.0,
        broker_url=worker_factory.broker_url,
    )
    with redis.Redis.from_url(redis_url) as client:
        yield client


def claim_of(tag: str) -> str:
    return claim_key(sync.lease_key_for((tag,)))


def started(tag: str, count: int = 1) -> bool:
    return sum(r["what"] == "start" for r in runs(tag)) >= count


def test_publishes_of_one_key_while_nothing_runs_send_one_message_and_share_its_result(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    results = [sync.delay("a", n) for n in range(5)]
    assert [r.lease_disposition for r in results] == ["published"] + ["deduplicated"] * 4
    assert {r.id for r in results} == {results[0].id}
    assert client.llen(worker_factory.queue) == 1
    worker_factory(APP)
    open_gate("a")
    assert {r.get(timeout=30) for r in results} == {f"run {results[0].id} (n=0)"}
    assert [r["what"] for r in runs("a")] == ["start", "end"]


def test_without_min_replicas_a_fold_is_one_script_call_a_claim_two_and_none_waits_a_replica(
    client: redis.Redis,
) -> None:
    def calls(name: str) -> int:
        return int(client.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))

    scripts, waits = calls("evalsha"), calls("wait")
    assert [sync.delay("w", n).lease_disposition for n in range(3)] == [
        "published",
        "deduplicated",
        "deduplicated",
    ]
    # The claim, then its confirmation once published (lease_dedupe_ttl is past lease_ttl).
    assert (calls("evalsha") - scripts, calls("wait") - waits) == (4, 0)


@pytest.mark.parametrize("broker_url", BROKERS, indirect=True)
def test_a_publish_while_one_runs_waits_and_later_ones_are_folded_onto_it(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP)
    first = sync.delay("b", 0)
    wait_for(lambda: started("b"), 30, message="the first run did not start")
    waiting = sync.delay("b", 1)
    folded = [sync.delay("b", n) for n in (2, 3)]
    assert waiting.lease_disposition == "published" and waiting.id != first.id
    assert [(r.id, r.lease_disposition) for r in folded] == [(waiting.id, "deduplicated")] * 2
    open_gate("b")
    assert waiting.get(timeout=30) == folded[0].get(timeout=30) == f"run {waiting.id} (n=1)"
    assert [(r["what"], r["id"]) for r in runs("b")] == [
        ("start", first.id),
        ("end", first.id),
        ("start", waiting.id),
        ("end", waiting.id),
    ]
    assert client.exists(claim_of("b")) == 0  # cleared when the waiting copy was granted
    assert sync.delay("b", 4).lease_disposition == "published"


def test_a_revoked_waiting_copy_frees_its_claim_when_the_worker_drops_it(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=1)
    revoked = uuid()  # revoked before it is published: the worker drops it on receipt
    assert dedupe_app.app.control.revoke(revoked, reply=True, timeout=10)
    waiting = sync.apply_async(("c", 1), task_id=revoked)
    assert waiting.lease_disposition == "published"
    wait_for(
        lambda: client.exists(claim_of("c")) == 0,
        30,
        message="the revoked copy's claim was not removed",
    )
    assert waiting.state == "REVOKED" and runs("c") == []
    open_gate("c")
    later = sync.delay("c", 2)
    assert later.lease_disposition == "published" and later.id != waiting.id
    assert later.get(timeout=30) == f"run {later.id} (n=2)"


def test_a_claim_lives_until_the_messages_expires_else_its_countdown_plus_lease_dedupe_ttl(
    client: redis.Redis, redis_url: str, worker_factory: WorkerFactory
) -> None:
    sync.apply_async(("d",), expires=1.5)
    assert 0 < client.pttl(claim_of("d")) <= 1500
    dedupe_app.configure(redis_url, worker_factory.queue, lease_dedupe_ttl=0.5)
    sync.apply_async(("e",), countdown=2.0)
    assert 2000 < client.pttl(claim_of("e")) <= 2500
    wait_for(lambda: client.exists(claim_of("d")) == 0, 5, message="the claim did not lapse")
    assert sync.delay("d").lease_disposition == "published"
    assert claim_lifetime({}, None, 7.0) == 7.0
    assert claim_lifetime({"expires": -3}, None, 7.0) == 0.001


def test_a_store_down_at_publish_publishes_unguarded_or_raises_per_lease_on_store_error(
    client: redis.Redis, redis_url: str, worker_factory: WorkerFactory
) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"
    dedupe_app.configure(redis_url, worker_factory.queue, lease_backend=down)
    result = sync.delay("f")
    assert result.lease_disposition == "unguarded"
    assert client.llen(worker_factory.queue) == 1
    # The claim may have been written, its reply lost: the execution clears it if it names it.
    message = json.loads(client.lindex(worker_factory.queue, 0))
    assert message["headers"]["lease_claimed"] == sync.lease_key_for(("f",))
    dedupe_app.configure(
        redis_url, worker_factory.queue, lease_backend=down, lease_on_store_error="fail"
    )
    with pytest.raises(LeaseStoreUnavailable) as raised:
        sync.delay("f")
    assert raised.value.operation == "publish"
    assert client.llen(worker_factory.queue) == 1


def test_the_holders_self_requeue_is_published_runs_after_it_and_later_publishes_fold_onto_it(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=2)
    first = requeue.delay("g", 0)
    requeued = wait_for(
        lambda: [r for r in runs("g") if r["what"] == "requeued"],
        30,
        message="the holder did not requeue itself",
    )[0]
    assert requeued["disposition"] == "published"
    folded = requeue.delay("g", 5)
    assert (folded.id, folded.lease_disposition) == (requeued["id"], "deduplicated")
    open_gate("g")
    assert first.get(timeout=30) == 0 and folded.get(timeout=30) == 1
    seen = [(r["what"], r.get("step")) for r in runs("g") if r["what"] != "requeued"]
    assert seen == [("start", 0), ("end", 0), ("start", 1), ("end", 1)]


def test_eager_mode_runs_at_once_and_claims_nothing(
    client: redis.Redis, redis_url: str, worker_factory: WorkerFactory
) -> None:
    dedupe_app.configure(redis_url, worker_factory.queue, task_always_eager=True)
    open_gate("h")
    results = [sync.delay("h", n) for n in (0, 1)]
    assert [r.lease_disposition for r in results] == ["published"] * 2
    assert [r.get() for r in results] == [f"run {r.id} (n={n})" for n, r in enumerate(results)]
    assert client.exists(claim_of("h")) == 0


def claimer(task_id: str) -> str:
    return store.holder_json("t", task_id, "host", 1)


def test_the_claim_scripts_run_on_redis_cluster_without_crossslot() -> None:
    with cluster_setup() as cluster:
        url = f"redis://127.0.0.1:{cluster.live()[0].port}/0"
        client = store.client_for(url, 2.0, {"cluster": True})
        keys = [f"lease:{{t:{i}}}" for i in range(6)]  # spread over the primaries
        for key in keys:
            assert store.claim(client, key, "w1", 60_000, claimer("w1")).claimed
            assert store.claim(client, key, "w2", 60_000, claimer("w2")).task_id == "w1"
            assert store.acquire(
                client, key, "a" * 32, 5000, "{}", task_id="w1", claimed=True
            ).granted
            assert store.claim(client, key, "w2", 60_000, claimer("w2")).claimed
            assert store.unclaim(client, key, "w2")


def test_publishes_are_counted_by_disposition_and_a_fold_is_signalled(client: redis.Redis) -> None:
    from prometheus_client import CollectorRegistry

    from celery_lease.ops.metrics import LeaseMetrics

    registry = CollectorRegistry()
    metrics = LeaseMetrics(registry)
    folds: list[dict[str, Any]] = []

    def on_fold(sender: Any, **kw: Any) -> None:
        folds.append({"sender": sender, **kw})

    signals.lease_published.connect(metrics.on_published, weak=False)
    signals.lease_deduplicated.connect(on_fold, weak=False)
    try:
        first = sync.delay("m")
        sync.apply_async(("m",), task_id="asked-for")
    finally:
        signals.lease_published.disconnect(metrics.on_published)
        signals.lease_deduplicated.disconnect(on_fold)
    count = {
        d: registry.get_sample_value(
            "celery_lease_publishes_total", {"task": "dedupe.sync", "disposition": d}
        )
        for d in ("published", "deduplicated")
    }
    assert count == {"published": 1.0, "deduplicated": 1.0}
    [fold] = folds
    assert (fold["sender"], fold["task_id"], fold["requested_task_id"], fold["key"]) == (
        sync,
        first.id,
        "asked-for",
        sync.lease_key_for(("m",)),
    )
    assert 0.0 <= fold["age"] < 10.0


def test_ls_and_doctor_show_a_waiting_copy_with_its_age_and_doctor_fails_one_past_its_lifetime(
    client: redis.Redis,
) -> None:
    waiting = sync.delay("n")
    obj = SimpleNamespace(app=dedupe_app.app)
    listed = CliRunner().invoke(lease, ["ls", "--json"], obj=obj)
    assert listed.exit_code == 0, listed.output
    [shown] = [i for i in json.loads(listed.stdout) if i.get("kind") == "waiting"]
    assert (shown["task"], shown["task_id"], shown["key"]) == (
        "dedupe.sync",
        waiting.id,
        sync.lease_key_for(("n",)),
    )
    assert 0.0 <= shown["age"] < 10.0 and shown["lifetime"] == 300.0
    table = CliRunner().invoke(lease, ["ls", "--wide"], obj=obj).output
    assert "1 waiting copy" in table and waiting.id in table
    client.persist(claim_of("n"))  # a claim that can no longer lapse
    done = CliRunner().invoke(lease, ["doctor"], obj=obj)
    assert any(
        line.startswith("FAIL") and waiting.id in line and "no expiry" in line
        for line in done.output.splitlines()
    ), done.output


def test_a_publisher_without_a_lease_store_is_refused_at_delay_naming_lease_backend(
    client: redis.Redis, redis_url: str, worker_factory: WorkerFactory
) -> None:
    dedupe_app.configure(
        redis_url,
        worker_factory.queue,
        lease_backend=None,
        broker_url="amqp://guest:guest@127.0.0.1:5672//",
    )
    with pytest.raises(LeaseConfigError, match="lease_backend"):
        sync.delay("o")


def test_a_waiting_copy_skipped_on_a_conflict_removes_its_claim(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=2)  # the waiting copy starts at once
    first = skipping.delay("s")
    wait_for(lambda: started("s"), 30, message="the first run did not start")
    waiting = skipping.delay("s", 1)
    assert waiting.lease_disposition == "published"
    assert is_skipped(waiting.get(timeout=30))
    # The skip marker is stored as the skipped execution ends; its claim goes just after.
    claim = claim_key(skipping.lease_key_for(("s",)))
    wait_for(lambda: client.exists(claim) == 0, 10, message="the skipped copy's claim stayed")
    assert skipping.delay("s", 2).lease_disposition == "published"
    open_gate("s")
    first.get(timeout=30)


def test_a_publish_that_fails_removes_its_claim_before_the_error_reaches_the_caller(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    deleted = int(client.info("commandstats").get("cmdstat_del", {}).get("calls", 0))
    with pytest.raises(TypeError):  # the message cannot be encoded: the broker refuses it
        sync.apply_async(("q",), headers={"unsendable": object()})
    assert client.exists(claim_of("q")) == 0
    assert client.info("commandstats")["cmdstat_del"]["calls"] == deleted + 1  # claimed, removed
    assert client.llen(worker_factory.queue) == 0
    assert sync.delay("q").lease_disposition == "published"


def test_beats_sends_of_a_waiting_key_are_folded_and_a_send_task_publisher_is_not(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    scheduler = Scheduler(dedupe_app.app, lazy=True)
    entry = ScheduleEntry("sync-b", "dedupe.sync", schedule(60.0), args=("bt",), app=dedupe_app.app)
    sent = [scheduler.apply_async(entry, advance=False) for _ in range(3)]
    assert [r.lease_disposition for r in sent] == ["published"] + ["deduplicated"] * 2
    assert {r.id for r in sent} == {sent[0].id}
    # By name only: nothing to decide with, so it is published (and caught at execution).
    dedupe_app.app.send_task("dedupe.sync", ("bt",))
    assert client.llen(worker_factory.queue) == 2


def test_a_waiting_copy_retried_on_a_conflict_keeps_its_claim_and_later_publishes_fold_onto_it(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=2)  # the waiting copy starts at once
    first = sync.delay("r")
    wait_for(lambda: started("r"), 30, message="the first run did not start")
    waiting = sync.delay("r", 1)
    wait_for(lambda: waiting.state == "RETRY", 30, message="the waiting copy was not retried")
    folded = sync.delay("r", 2)
    assert (folded.id, folded.lease_disposition) == (waiting.id, "deduplicated")
    open_gate("r")
    assert first.get(timeout=30) == f"run {first.id} (n=0)"
    assert folded.get(timeout=30) == f"run {waiting.id} (n=1)"
    assert [(r["what"], r["id"]) for r in runs("r")] == [
        ("start", first.id),
        ("end", first.id),
        ("start", waiting.id),
        ("end", waiting.id),
    ]
