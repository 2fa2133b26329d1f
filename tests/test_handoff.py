"""``lease_on_conflict="coalesce"`` and ``"queue"`` on real workers: duplicates are parked in
Redis and acknowledged, the holder's release hands the key to the next run, a dead holder's
waiting runs are published by the sweep of a live worker."""

from __future__ import annotations

import itertools
import json
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.result import AsyncResult

from celery_lease import LeaseConflict, LeaseLost, follow, is_coalesced, store
from celery_lease.policies.handoff import publish
from celery_lease.store import handoff as stored
from tests.apps import handoff_app
from tests.apps.handoff_app import coalesced, queued, queued_retrying, retried, runs
from tests.support.fixtures import BROKERS, WorkerFactory
from tests.support.waiting import wait_for

APP = "tests.apps.handoff_app"


@pytest.fixture
def app(redis_url: str, worker_factory: WorkerFactory) -> Iterator[Any]:
    handoff_app.configure(
        redis_url, task_default_queue=worker_factory.queue, broker_url=worker_factory.broker_url
    )
    yield handoff_app.app


def _started(tag: str) -> list[dict[str, Any]]:
    return [r for r in runs(tag) if r["what"] == "start"]


def _never_two_running(tag: str) -> None:
    """Every run ended before the next one started (by the store's clock)."""
    spans: dict[str, list[float]] = {}
    for r in runs(tag):
        if r["what"] in ("start", "end"):
            spans.setdefault(f"{r['id']}:{r['n']}", []).append(r["t"])
    ordered = sorted(spans.values())
    for (_, end), (start, _) in itertools.pairwise(ordered):
        assert end <= start, f"two ran at once: {runs(tag)}"


def _handover_gaps(tag: str) -> list[float]:
    """Seconds from each run's end to the next run's start (store clock): the hand-over."""
    marks = [r for r in runs(tag) if r["what"] in ("start", "end")]
    return [
        round(b["t"] - a["t"], 4)
        for a, b in itertools.pairwise(marks)
        if a["what"] == "end" and b["what"] == "start"
    ]


def _waiting_state(url: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        lines = list(client.scan_iter("lease:*:line"))
        pending = [k for k in client.scan_iter("lease:*:reserved") if client.hget(k, "id")]
        return lines + pending
    finally:
        client.close()


@pytest.mark.parametrize("broker_url", BROKERS, indirect=True)
def test_coalesce_runs_one_pending_run_after_the_holder_with_the_latest_arguments(
    app: Any, redis_url: str, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=4)
    holder = coalesced.delay("c", 0, 3.0)
    wait_for(lambda: _started("c"), 20, message="the holder never started")
    duplicates = []
    for n in range(1, 6):  # one at a time: the arrival order (what "latest" means) is known
        duplicates.append(coalesced.delay("c", n))
        wait_for(lambda n=n: len([r for r in runs("c") if r["what"] == "accepted"]) == n, 20)
    markers = [d.get(timeout=20) for d in duplicates]
    assert all(is_coalesced(m) for m in markers)
    assert len({m["into"] for m in markers}) == 1  # one pending run covers them all
    assert holder.get(timeout=20) == 0
    assert [follow(d, timeout=20) for d in duplicates] == [5] * 5  # the latest arguments won
    wait_for(lambda: len([r for r in runs("c") if r["what"] == "end"]) == 2, 20)
    assert [r["n"] for r in _started("c")] == [0, 5]  # never one per duplicate
    _never_two_running("c")
    accepted = [r["t"] for r in runs("c") if r["what"] == "accepted"]
    assert len(accepted) == 5 and max(accepted) < _started("c")[1]["t"]
    print(f"coalesce: end of the holder to the pending run's start: {_handover_gaps('c')}s")
    wait_for(lambda: _waiting_state(redis_url) == [], 10, message="pending state left behind")


@pytest.mark.parametrize("broker_url", BROKERS, indirect=True)
def test_queue_runs_every_duplicate_in_arrival_order_under_its_own_task_id(
    app: Any, redis_url: str, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=4)
    holder = queued.delay("q", 0, 1.0)
    wait_for(lambda: _started("q"), 20, message="the holder never started")
    waiters = []
    for n in range(1, 5):  # one at a time, so the arrival order is the sending order
        waiters.append(queued.delay("q", n, 0.1))
        wait_for(lambda n=n: len([r for r in runs("q") if r["what"] == "accepted"]) == n, 20)
    assert holder.get(timeout=20) == 0
    assert [w.get(timeout=30) for w in waiters] == [1, 2, 3, 4]  # the real results
    starts = _started("q")
    assert [r["n"] for r in starts] == [0, 1, 2, 3, 4]
    assert [r["id"] for r in starts[1:]] == [w.id for w in waiters]
    _never_two_running("q")
    print(f"queue: end of each run to the next waiter's start: {_handover_gaps('q')}s")
    wait_for(lambda: _waiting_state(redis_url) == [], 10, message="a line was left behind")


def test_a_duplicate_past_lease_queue_max_fails_with_lease_conflict(
    app: Any, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=2, env={"LEASE_QUEUE_MAX": "1"})
    queued.delay("full", 0, 2.0)
    wait_for(lambda: _started("full"), 20, message="the holder never started")
    first = queued.delay("full", 1)
    wait_for(lambda: any(r["what"] == "accepted" for r in runs("full")), 20)
    with pytest.raises(LeaseConflict, match=r"1 runs already wait in its line"):
        queued.delay("full", 2).get(timeout=20)
    assert first.get(timeout=20) == 1


def test_a_waiter_older_than_lease_queue_timeout_fails_saying_how_long_it_waited(
    app: Any, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=2, env={"LEASE_QUEUE_TIMEOUT": "0.5"})
    queued.delay("late", 0, 2.0)
    wait_for(lambda: _started("late"), 20, message="the holder never started")
    waiter = queued.delay("late", 1)
    with pytest.raises(LeaseConflict, match=r"waited \d+\.\ds in the line"):
        waiter.get(timeout=20)
    assert [r["n"] for r in _started("late")] == [0]


@pytest.mark.parametrize("policy", ["coalesce", "queue"])
def test_a_killed_holders_waiting_run_is_published_by_a_live_worker_after_its_ttl(
    policy: str, app: Any, redis_url: str, worker_factory: WorkerFactory
) -> None:
    task = coalesced if policy == "coalesce" else queued
    doomed = worker_factory(APP, pool="solo", env={"LEASE_TTL": "2.0"})
    task.delay("crash", 0, 60.0)
    wait_for(lambda: _started("crash"), 20, message="the holder never started")
    worker_factory(APP, pool="threads", concurrency=2, env={"LEASE_TTL": "2.0"})
    waiter = task.delay("crash", 1)
    wait_for(lambda: any(r["what"] == "accepted" for r in runs("crash")), 20)
    doomed.send_signal(signal.SIGKILL, group=True)
    killed_at = time.time()
    if policy == "coalesce":
        assert follow(waiter, timeout=30) == 1
    else:
        assert waiter.get(timeout=30) == 1
    delay = _started("crash")[-1]["t"] - killed_at
    assert [r["n"] for r in _started("crash")] == [0, 1]
    print(f"{policy}: the waiting run started {delay:.2f}s after its holder was killed")
    wait_for(lambda: _waiting_state(redis_url) == [], 10, message="pending state left behind")


def test_a_coalesced_marker_names_the_pending_run_and_follow_returns_its_result(
    app: Any, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=2)
    coalesced.delay("m", 0, 1.0)
    wait_for(lambda: _started("m"), 20, message="the holder never started")
    marker = coalesced.delay("m", 7).get(timeout=20)
    assert marker["key"].endswith("}") and AsyncResult(marker["into"], app=app).get(timeout=20) == 7
    assert follow(marker, timeout=20, app=app) == 7
    with pytest.raises(TypeError, match="takes the task's result"):
        is_coalesced(AsyncResult(marker["into"], app=app))


def test_a_hand_over_whose_publish_was_lost_is_published_by_the_sweep_once_past_due(
    app: Any, redis_url: str, worker_factory: WorkerFactory
) -> None:
    # The releasing worker died between its release (which reserved the key) and its publish.
    worker_factory(APP, pool="threads", concurrency=2, env={"LEASE_TTL": "2.0"})
    client = store.client_for(redis_url, 2.0)
    key, token = queued.lease_key_for(("lost", 1)), uuid.uuid4().hex
    assert store.acquire(client, key, token, 2000, "{}").granted
    message = json.dumps(
        {
            "task": "ho.queued",
            "args": ["lost", 1],
            "kwargs": {},
            "options": {"queue": app.conf.task_default_queue},
        }
    )
    stored.watch(client, "lease", key, 2000)
    assert stored.park(client, key, "queue", "lost-run", message, 10, 60_000).outcome == "parked"
    handed = stored.release_handing_over(client, key, token, 2000, 60_000, 0).handed
    released_at = time.time()
    assert handed is not None and handed.task_id == "lost-run"  # ...and never published
    assert AsyncResult("lost-run", app=app).get(timeout=30) == 1
    delay = _started("lost")[0]["t"] - released_at
    print(f"a lost publish: the reserved run started {delay:.2f}s after the release")
    assert [r["id"] for r in _started("lost")] == ["lost-run"]


@pytest.mark.parametrize("broker_url", BROKERS, indirect=True)
def test_retry_runs_the_duplicate_at_the_holders_release_not_its_lifetime_and_uses_no_retry(
    app: Any, worker_factory: WorkerFactory
) -> None:
    # lease_ttl=60: Celery's retry at the holder's remaining lifetime would wait a minute.
    worker_factory(APP, pool="threads", concurrency=2, env={"LEASE_TTL": "60.0"})
    holder = retried.delay("r", 0, 1.0)
    wait_for(lambda: _started("r"), 20, message="the holder never started")
    duplicate = retried.delay("r", 1)
    wait_for(lambda: duplicate.state == "RETRY", 20, message=lambda: duplicate.state)
    assert holder.get(timeout=20) == 0
    assert duplicate.get(timeout=30) == 1  # max_retries=0, and it was not exhausted
    gap = _handover_gaps("r")
    assert len(gap) == 1 and gap[0] < 30.0  # long before the holder's lifetime (60 s)
    print(f"retry: end of the holder to the retried copy's start: {gap}s (lease_ttl=60)")


def test_retry_waits_for_a_holder_longer_than_four_ttls_without_failing(
    app: Any, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=2, env={"LEASE_TTL": "0.6"})
    retried.delay("long", 0, 3.0)  # five TTLs, renewed
    wait_for(lambda: _started("long"), 20, message="the holder never started")
    assert retried.delay("long", 1).get(timeout=30) == 1
    assert [r["n"] for r in _started("long")] == [0, 1]


def test_a_pending_run_whose_holder_lost_its_lease_is_handed_over_by_the_sweep(
    app: Any, redis_url: str, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=2, env={"LEASE_TTL": "2.0"})
    coalesced.delay("gone", 0, 1.5)
    wait_for(lambda: _started("gone"), 20, message="the holder never started")
    marker = coalesced.delay("gone", 1).get(timeout=20)
    redis.Redis.from_url(redis_url).delete(coalesced.lease_key_for(("gone", 0)))  # erased
    assert follow(marker, timeout=30, app=app) == 1
    assert [r["n"] for r in _started("gone")] == [0, 1]


def _reserve_by_hand(app: Any, client: Any, tag: str, mode: str) -> tuple[str, stored.Waiting]:
    """Hold ``tag``'s key by hand, park a pending run of ``n=1`` and release, reserving the key
    for it as a ``mode`` release does; the run is not published (the caller publishes it)."""
    key, token = coalesced.lease_key_for((tag, 1)), uuid.uuid4().hex
    assert store.acquire(client, key, token, 2000, "{}").granted
    run_id = f"pending-{tag}"
    message = json.dumps(
        {
            "task": "ho.coalesced",
            "args": [tag, 1],
            "kwargs": {},
            "options": {"queue": app.conf.task_default_queue, "headers": {"lease_handoff": key}},
        }
    )
    stored.watch(client, "lease", key, 2000)
    assert stored.park(client, key, "coalesce", run_id, message, 10, 60_000).task_id == run_id
    handed = stored.release_handing_over(client, key, token, 2000, 60_000, 0, mode=mode).handed
    assert handed is not None and handed.task_id == run_id
    return key, handed


def test_a_coalesce_copy_that_arrives_while_the_key_is_reserved_joins_the_run_it_gets_its_args(
    app: Any, redis_url: str, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=2)
    client = store.client_for(redis_url, 2.0)
    _, handed = _reserve_by_hand(app, client, "join", "coalesce")
    marker = coalesced.delay("join", 2).get(timeout=20)  # the key is reserved: it joins
    assert is_coalesced(marker) and marker["into"] == handed.task_id
    assert _started("join") == []
    # The run, published with the arguments it had at the hand-over (n=1), takes the latest.
    assert json.loads(handed.message)["args"] == ["join", 1]
    publish(app, handed, marker["key"], by="test")
    assert AsyncResult(handed.task_id, app=app).get(timeout=20) == 2
    assert [(r["n"], r["id"]) for r in _started("join")] == [(2, handed.task_id)]
    wait_for(lambda: _waiting_state(redis_url) == [], 10, message="pending state left behind")


def test_a_joined_run_whose_publish_was_lost_is_published_by_the_sweep_with_the_joined_args(
    app: Any, redis_url: str, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=2, env={"LEASE_TTL": "2.0"})
    client = store.client_for(redis_url, 2.0)
    _, handed = _reserve_by_hand(app, client, "swept", "coalesce")
    assert coalesced.delay("swept", 3).get(timeout=20)["into"] == handed.task_id
    assert AsyncResult(handed.task_id, app=app).get(timeout=30) == 3  # never published by hand
    assert [r["n"] for r in _started("swept")] == [3]


def test_a_queue_reservation_is_not_joined_by_a_coalesce_copy(
    app: Any, redis_url: str, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=2)
    client = store.client_for(redis_url, 2.0)
    key, handed = _reserve_by_hand(app, client, "nojoin", "queue")
    marker = coalesced.delay("nojoin", 2).get(timeout=20)
    assert is_coalesced(marker) and marker["into"] != handed.task_id  # a pending run of its own
    publish(app, handed, key, by="test")
    assert AsyncResult(handed.task_id, app=app).get(timeout=20) == 1  # its own arguments
    assert follow(marker, timeout=20, app=app) == 2
    assert [r["n"] for r in _started("nojoin")] == [1, 2]
    _never_two_running("nojoin")


def test_copies_that_keep_arriving_through_the_hand_over_run_at_most_two_bodies(
    app: Any, redis_url: str, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=2)
    holder = coalesced.delay("burst", 0, 1.5)
    wait_for(lambda: _started("burst"), 20, message="the holder never started")
    first = coalesced.delay("burst", 1)  # parked while the holder runs: the pending run
    wait_for(lambda: any(r["what"] == "accepted" for r in runs("burst")), 20)
    # The other thread is kept busy past the holder's end, so the later copies are taken by
    # the holder's thread after its release handed the key over, before the pending run.
    coalesced.delay("busy", 0, 6.0)
    wait_for(lambda: _started("busy"), 20, message="the other thread never got busy")
    later = [coalesced.delay("burst", n) for n in range(2, 11)]
    assert not [r for r in runs("burst") if r["what"] == "end"], "sent too late to test"
    markers = [d.get(timeout=30) for d in [first, *later]]
    assert all(is_coalesced(m) for m in markers)
    assert len({m["into"] for m in markers}) == 1  # all joined the one pending run
    assert holder.get(timeout=20) == 0
    assert [follow(m, timeout=20, app=app) for m in markers] == [10] * 10
    assert [r["n"] for r in _started("burst")] == [0, 10]  # two bodies: the latest arguments
    ended = max(r["t"] for r in runs("burst") if r["what"] == "end" and r["n"] == 0)
    joined = [r for r in runs("burst") if r["what"] == "accepted" and r["t"] > ended]
    assert joined, "no copy arrived after the hand-over: nothing tested"
    print(f"coalesce: {len(joined)} copies joined the pending run after the hand-over")
    _never_two_running("burst")


def test_a_handed_over_run_that_retries_runs_its_retry(
    app: Any, worker_factory: WorkerFactory
) -> None:
    # The retry is published under the run's own task id, with the run's headers: it must be
    # taken for the holder's successor, not for a second copy of the handed-over run.
    worker_factory(APP, pool="threads", concurrency=4)
    holder = queued_retrying.delay("hr", 0, 1.0)
    wait_for(lambda: _started("hr"), 20, message="the holder never started")
    waiting = queued_retrying.delay("hr", 1)
    wait_for(lambda: any(r["what"] == "accepted" for r in runs("hr")), 20)
    assert waiting.get(timeout=30) == 1  # its retry ran to the end
    assert holder.get(timeout=30) == 0
    marks = [r["what"] for r in runs("hr") if r["what"] in ("start", "end")]
    assert marks == ["start", "end"] * 3  # each attempt ended before the next began
    assert [r["n"] for r in _started("hr")] == [0, 1, 1]


def test_a_waiting_run_whose_copy_took_a_free_key_and_ran_is_not_run_again_at_its_turn(
    app: Any, redis_url: str, worker_factory: WorkerFactory
) -> None:
    # A copy of a waiting run (a retry after store errors is sent without the hand-over
    # header) takes a key freed behind the line's back while its element still waits there;
    # its own release then hands the key to that element, which must not run it again.
    worker_factory(APP, pool="threads", concurrency=4)
    holder = queued.delay("tw", 0, 3.0)
    wait_for(lambda: _started("tw"), 20, message="the holder never started")
    waiting = queued.delay("tw", 1)
    wait_for(lambda: len([r for r in runs("tw") if r["what"] == "accepted"]) == 1, 20)
    after = queued.delay("tw", 2)
    wait_for(lambda: len([r for r in runs("tw") if r["what"] == "accepted"]) == 2, 20)
    redis.Redis.from_url(redis_url).delete(queued.lease_key_for(("tw", 0)))  # freed
    queued.apply_async(("tw", 1), task_id=waiting.id)  # the copy: no hand-over header
    assert after.get(timeout=40) == 2  # the line went on past the element of the run that ran
    assert waiting.get(timeout=5) == 1
    assert [r["n"] for r in _started("tw")] == [0, 1, 2]
    with pytest.raises(LeaseLost):
        holder.get(timeout=20)


def test_a_handed_over_grant_no_replica_acknowledged_gives_the_run_its_reservation_back(
    redis_url: str,
) -> None:
    # lease_min_replicas=1 on a server without replicas: the handed-over run's grant is taken
    # back. Its reservation must be put back: a later duplicate does not jump the line, and the
    # run's next copy (lease_on_store_error sends it again) takes the key.
    client = store.client_for(redis_url, 1.0)
    key, holder = f"lease:ho.queued:{{{uuid.uuid4().hex}}}", uuid.uuid4().hex
    assert store.acquire(client, key, holder, 5000, "{}").granted
    assert stored.park(client, key, "queue", "run-1", "{}", 10, 60_000).outcome == "parked"
    got = stored.release_handing_over(client, key, holder, 5000, 60_000, 0)
    assert got.handed is not None and got.handed.task_id == "run-1"
    with pytest.raises(store.NotReplicated, match="taken back"):
        store.acquire(client, key, uuid.uuid4().hex, 5000, "{}", 1, "run-1", True)
    other = store.acquire(client, key, uuid.uuid4().hex, 5000, "{}", 0, "run-2")
    assert not other.granted and other.holder.task_id == "run-1"  # still reserved for run-1
    assert store.acquire(client, key, uuid.uuid4().hex, 5000, "{}", 0, "run-1", True).granted
    assert stored.read_line(client, key) == ([], None)


def test_with_min_replicas_a_park_no_replica_acknowledged_does_not_count_and_keeps_its_place(
    redis_url: str,
) -> None:
    # A park a failover loses is a duplicate acknowledged and never run: with
    # lease_min_replicas it counts only once acknowledged (NotReplicated otherwise: the
    # duplicate is kept by lease_on_store_error), and the copy sent again keeps its place.
    client = store.client_for(redis_url, 1.0)
    key, holder = f"lease:ho.queued:{{{uuid.uuid4().hex}}}", uuid.uuid4().hex
    assert store.acquire(client, key, holder, 5000, "{}").granted
    with pytest.raises(store.NotReplicated, match="the park"):
        stored.park(client, key, "queue", "run-1", "m1", 10, 60_000, min_replicas=1)
    assert stored.park(client, key, "queue", "run-2", "m2", 10, 60_000).length == 2
    again = stored.park(client, key, "queue", "run-1", "m1", 10, 60_000)
    assert (again.outcome, again.length) == ("parked", 1)
    assert [w.task_id for w in stored.read_line(client, key)[0]] == ["run-1", "run-2"]
    client.delete(key)  # free: nothing is written, whatever the replicas
    free = stored.park(client, key, "queue", "run-3", "m3", 10, 60_000, min_replicas=1)
    assert free.outcome == "free"


def test_a_retry_of_a_handed_over_run_whose_lease_was_lost_is_published_as_a_new_attempt(
    app: Any,
) -> None:
    # Its lease lost at its local deadline (renewals unconfirmed) while the store still held
    # its token, the run's release notes it as ran; the retry must not carry the hand-over
    # header, or it would be refused as a second copy of that run.
    from types import SimpleNamespace

    from celery_lease import hold
    from celery_lease.execution import publishing
    from celery_lease.policies import compose
    from celery_lease.policies.handoff import HANDOFF_HEADER

    sent: dict[str, Any] = {}

    def publish_(**options: Any) -> Any:
        sent.update(options)
        return SimpleNamespace(id=options["task_id"])

    task = app.tasks[queued_retrying.name]
    with pytest.raises(LeaseLost), hold(f"retry-lost-{uuid.uuid4().hex}", app=app) as lease:
        lease.mark_lost("deadline", deliver=False)
        task.push_request(id="run-1")
        try:
            publishing._apply_async(
                task,
                compose.publish_steps(task),
                lease,
                ("k", 1),
                {},
                {"task_id": "run-1", "headers": {HANDOFF_HEADER: "key", "other": "kept"}},
                publish_,
            )
        finally:
            task.pop_request()
    assert sent["headers"] == {"other": "kept"}
