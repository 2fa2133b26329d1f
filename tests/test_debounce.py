"""Debounce at publish (``lease_debounce``) against a real Redis and real worker processes: a
burst of publishes of one key runs once, with the latest arguments, no later than the cap
after its first publish, never beside the key's previous run; a lost timer is published again
by a live worker's sweep, a double timer runs once."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult
from click.testing import CliRunner

from celery_lease import LeaseConfigError, LeasedTask
from celery_lease.base import signals
from celery_lease.base.keys import burst_key
from celery_lease.ops.cli import lease
from celery_lease.ops.flower import lease_summary
from celery_lease.policies.debounce import AGAIN_HEADER, DEBOUNCE_HEADER, TIMER_HEADER
from celery_lease.settings.config import resolve_options
from tests.apps import debounce_app
from tests.apps.debounce_app import refresh, runs
from tests.support.events import task_events
from tests.support.fixtures import BROKERS, WorkerFactory
from tests.support.received import received
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_for

APP = "tests.apps.debounce_app"
DELAY, CAP = 0.5, 2.0


@pytest.fixture
def client(redis_url: str, worker_factory: WorkerFactory) -> Iterator[redis.Redis]:
    debounce_app.configure(
        redis_url,
        task_default_queue=worker_factory.queue,
        task_always_eager=False,
        lease_debounce=DELAY,
        lease_debounce_max=CAP,
        broker_url=worker_factory.broker_url,
    )
    with redis.Redis.from_url(redis_url) as client:
        yield client


def _spans(tag: str) -> list[tuple[float, float, Any]]:
    starts = {(r["id"], r["n"]): r["t"] for r in runs(tag) if r["what"] == "start"}
    return sorted(
        (t, next(r["t"] for r in runs(tag) if r["what"] == "end" and (r["id"], r["n"]) == k), k[1])
        for k, t in starts.items()
    )


def _never_two_running(tag: str) -> None:
    for (_, end, _), (start, _, _) in itertools.pairwise(_spans(tag)):
        assert end <= start, f"two runs of {tag} overlapped: {runs(tag)}"


def _now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds + micros / 1e6)


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"lease_debounce": 0}, "lease_debounce=0"),
        ({"lease_debounce": "2"}, "lease_debounce='2'"),
        ({"lease_debounce": True}, "lease_debounce=True"),
        (
            {"lease_debounce": 2.0, "lease_debounce_max": 1.0},
            "lease_debounce_max=1.0 (task t) is below lease_debounce=2.0",
        ),
        (
            {"lease_debounce_max": 5.0},
            "lease_debounce_max=5.0 (task t) has no effect without lease_debounce",
        ),
    ],
)
def test_bad_debounce_settings_are_refused_naming_the_setting_and_the_fix(
    given: dict[str, Any], named: str
) -> None:
    with pytest.raises(LeaseConfigError, match=named.replace("(", r"\(").replace(")", r"\)")):
        resolve_options({}, given, "task t")


def test_debounce_settings_are_checked_when_the_task_is_decorated() -> None:
    app = Celery("decorated", set_as_current=False)
    app.conf.lease_backend = "redis://127.0.0.1:1/0"
    with pytest.raises(LeaseConfigError, match=r"lease_debounce_max=0\.5"):

        @app.task(
            shared=False, base=LeasedTask, name="d.bad", lease_debounce=1.0, lease_debounce_max=0.5
        )
        def bad() -> None: ...

        bad.lease_settings()


def test_the_cap_defaults_to_ten_times_the_quiet_time() -> None:
    debounce = resolve_options({}, {"lease_debounce": 1.5}, "task t").debounce
    assert debounce is not None and (debounce.delay, debounce.cap) == (1.5, 15.0)
    assert resolve_options({}, {}, "task t").debounce is None


def test_a_burst_of_publishes_runs_once_with_the_latest_arguments_and_every_caller_shares_it(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    with received(signals.lease_published) as published:  # what metrics count
        results = [refresh.delay("a", n) for n in range(5)]
    last = _now(client)
    assert [(p["disposition"], p["task_id"]) for p in published] == [
        ("debounced", results[0].id)
    ] * 5
    assert {r.lease_disposition for r in results} == {"debounced"}
    assert len({r.id for r in results}) == 1
    assert client.llen(worker_factory.queue) == 1  # the burst's one timer message
    worker_factory(APP)
    assert [r.get(timeout=30) for r in results] == [4] * 5
    started = [r for r in runs("a") if r["what"] == "start"]
    assert [(r["n"], r["id"]) for r in started] == [(4, results[0].id)]
    assert started[0]["t"] >= last + DELAY - 0.05  # the quiet time after the last publish
    assert client.hget(burst_key(refresh.lease_key_for(("a", 0))), "fired") == b"1"


@pytest.mark.parametrize("broker_url", BROKERS, indirect=True)
def test_a_steady_stream_of_publishes_cannot_put_the_run_off_past_the_cap(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP)
    first = _now(client)
    results = []
    for n in itertools.count():  # every 0.2 s, under the quiet time, for 3.5 s
        results.append(refresh.delay("s", n))
        if _now(client) - first > 3.5:
            break
        wait_for(lambda n=n: _now(client) >= first + 0.2 * (n + 1), 5)
    served = [r.get(timeout=30) for r in results]
    spans = _spans("s")
    assert spans[0][0] <= first + CAP + 1.0  # the first run: by the cap, plus slack
    assert len(spans) >= 2  # the stream went on past the cap: a second burst
    assert served == sorted(served)  # each caller is served by a run with later arguments
    _never_two_running("s")


def test_a_burst_due_while_the_previous_run_holds_the_key_waits_for_its_release(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=4)
    first = refresh.delay("h", 0, 2.5)
    wait_for(lambda: any(r["what"] == "start" for r in runs("h")), 20)
    second = refresh.delay("h", 1)
    assert second.id != first.id  # the first burst ran: a new burst
    assert first.get(timeout=30) == 0 and second.get(timeout=30) == 1
    assert [n for _, _, n in _spans("h")] == [0, 1]
    _never_two_running("h")


def test_a_lost_timer_is_published_again_by_a_live_workers_sweep_and_runs_once(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    result = refresh.delay("l", 7)
    assert client.llen(worker_factory.queue) == 1
    client.delete(worker_factory.queue)  # the timer message is lost
    worker_factory(APP)
    assert result.get(timeout=30) == 7
    assert [n for _, _, n in _spans("l")] == [7]


def test_a_second_timer_of_a_burst_does_nothing(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    result = refresh.delay("d", 3)
    refresh.apply_async(
        ("d", 99), task_id=result.id, headers={DEBOUNCE_HEADER: refresh.lease_key_for(("d", 0))}
    )  # a copy of the timer
    assert client.llen(worker_factory.queue) == 2
    worker_factory(APP)
    assert AsyncResult(result.id, app=debounce_app.app).get(timeout=30) == 3
    wait_for(lambda: client.llen(worker_factory.queue) == 0, 20)
    assert [n for _, _, n in _spans("d")] == [3]


def test_the_original_timer_retried_after_its_copy_from_the_sweep_ran_does_not_run_it_again(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    result = refresh.delay("o", 5)
    key = refresh.lease_key_for(("o", 0))
    [raw] = client.lrange(worker_factory.queue, 0, -1)
    original = json.loads(raw)["headers"][TIMER_HEADER]  # the timer's own id
    client.delete(worker_factory.queue)  # the original is held up: its worker stalled
    worker = worker_factory(APP)  # its sweep publishes the late timer again: that copy runs
    assert result.get(timeout=30) == 5
    # The original comes back as its retry after a store error hid its fire's reply would.
    refresh.apply_async(
        ("o", 99),
        task_id=result.id,
        headers={DEBOUNCE_HEADER: key, TIMER_HEADER: original, AGAIN_HEADER: "1"},
    )
    wait_for(
        lambda: "not run: its burst already ran" in worker.log_text(),
        20,
        message=lambda: worker.log_tail(),
    )
    assert [n for _, _, n in _spans("o")] == [5]


def test_celery_lease_ls_shows_a_waiting_burst_its_publishes_and_when_it_is_due(
    client: redis.Redis,
) -> None:
    debounce_app.configure(
        debounce_app.app.conf.lease_backend, lease_debounce=30.0, lease_debounce_max=60.0
    )
    results = [refresh.delay("ls", n) for n in range(3)]
    obj = SimpleNamespace(app=debounce_app.app)
    listed = CliRunner().invoke(lease, ["ls", "--json"], obj=obj)
    assert listed.exit_code == 0, listed.output
    [shown] = [i for i in json.loads(listed.stdout) if i.get("kind") == "waiting"]
    assert (shown["task"], shown["task_id"], shown["key"], shown["debounced"]) == (
        "db.refresh",
        results[0].id,
        refresh.lease_key_for(("ls", 0)),
        3,
    )
    assert 25.0 < shown["due_in"] <= 30.0 and shown["lifetime"] == 60.0
    table = CliRunner().invoke(lease, ["ls", "--wide"], obj=obj).output
    assert "1 waiting copy" in table and results[0].id in table
    done = CliRunner().invoke(lease, ["doctor"], obj=obj)
    assert not any(
        line.startswith("FAIL") and "burst" in line for line in done.output.splitlines()
    ), done.output


def test_eager_publishes_of_a_burst_run_once_after_the_quiet_time_with_the_latest_arguments(
    client: redis.Redis,
) -> None:
    debounce_app.configure(debounce_app.app.conf.lease_backend, task_always_eager=True)
    try:
        first = _now(client)
        results = [refresh.delay("e", n) for n in range(4)]
        assert len({r.id for r in results}) == 1 and {r.lease_disposition for r in results} == {
            "debounced"
        }
        assert not results[0].ready()  # no run yet: it waits for the quiet time
        assert [r.get(timeout=10) for r in results] == [3] * 4
        [(start, _, n)] = _spans("e")
        assert n == 3 and start >= first + DELAY - 0.05
    finally:
        debounce_app.configure(debounce_app.app.conf.lease_backend, task_always_eager=False)


def test_an_eager_burst_due_while_the_key_is_held_waits_for_the_release(
    client: redis.Redis,
) -> None:
    debounce_app.configure(debounce_app.app.conf.lease_backend, task_always_eager=True)
    try:
        holder = refresh.delay("eh", 0, 1.5)
        wait_for(lambda: any(r["what"] == "start" for r in runs("eh")), 10)  # it started
        follower = refresh.delay("eh", 1)
        assert follower.get(timeout=15) == 1 and holder.get(timeout=15) == 0
        assert [n for _, _, n in _spans("eh")] == [0, 1]
        _never_two_running("eh")
    finally:
        debounce_app.configure(debounce_app.app.conf.lease_backend, task_always_eager=False)


def test_an_early_timer_and_the_fired_burst_send_task_events_flower_shows(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    debounce_app.configure(
        debounce_app.app.conf.lease_backend, lease_debounce=1.0, lease_debounce_max=5.0
    )
    worker_factory(
        APP, env={"LEASE_DEBOUNCE": "1.0", "LEASE_DEBOUNCE_MAX": "5.0"}, extra_args=("-E",)
    )
    with task_events(
        debounce_app.app,
        lambda e: e.get("type", "").startswith("task-lease-debounce"),
        lambda e: e["type"] == "task-lease-debounce-fired",
    ) as seen:
        first = refresh.delay("ev", 1)
        wait_for(
            lambda: (
                _now(client)
                >= float(client.hget(burst_key(refresh.lease_key_for(("ev", 0))), "first")) / 1000
                + 0.5
            ),
            10,
        )
        refresh.delay("ev", 2)  # the due time moves: the timer arrives early
        assert first.get(timeout=30) == 2
    assert [e["type"] for e in seen] == ["task-lease-debounced", "task-lease-debounce-fired"]
    early, fired = seen
    assert {e["uuid"] for e in seen} == {first.id}
    assert 0.0 < early["lease_due_in"] <= 1.0 and fired["lease_triggers"] == 2
    assert fired["lease_waited"] >= 1.4
    assert (
        lease_summary(SimpleNamespace(**{**fired, "state": "SUCCESS"})) == "debounced (2 publishes)"
    )
    assert lease_summary(SimpleNamespace(**early)) == "debounced (waiting)"


def test_the_burst_scripts_and_the_sweep_note_run_on_redis_cluster_without_crossslot() -> None:
    from celery_lease import store
    from celery_lease.store import debounce as stored
    from celery_lease.store import handoff as stored_handoff
    from harness.topologies import cluster_setup

    with cluster_setup() as cluster:
        url = f"redis://127.0.0.1:{cluster.live()[0].port}/0"
        cluster_client = store.client_for(url, 2.0, {"cluster": True})
        for key in [f"lease:{{db:{i}}}" for i in range(6)]:  # spread over the primaries
            started = stored.trigger(
                cluster_client, key, "b1", 30, 1000, '{"n": 1}', "{}", 1000, 9000
            )
            assert started.started and started.task_id == "b1"
            stored_handoff.watch(cluster_client, "lease", key, 2000, keep_earlier=True)
            joined = stored.trigger(
                cluster_client, key, "b2", 30, 1000, '{"n": 2}', "{}", 1000, 9000
            )
            assert (joined.started, joined.task_id, joined.count) == (False, "b1", 2)
            assert stored.look(cluster_client, key, 60_000).again_in is not None
            wait_for(
                lambda key=key: stored.fire(cluster_client, key, "b1", 1000).outcome == "fire", 5
            )
            assert stored.read_burst(cluster_client, key) is None  # a tombstone now
            assert stored.fire(cluster_client, key, "b1", 1000).outcome == "stale"


def test_arguments_the_json_serializer_takes_reach_the_run_as_the_worker_would_get_them(
    client: redis.Redis,
) -> None:
    debounce_app.configure(
        debounce_app.app.conf.lease_backend,
        task_always_eager=True,
        lease_debounce=0.05,
        lease_debounce_max=0.5,
    )
    try:
        import datetime
        import decimal
        import uuid as uuid_module

        values = [
            uuid_module.UUID(int=7),
            datetime.datetime(2026, 12, 2, 1, 2, 3),
            decimal.Decimal("1.5"),
            {"1": [1, 2]},
        ]
        result = refresh.delay("types", values)
        assert result.get(timeout=10) == values  # kombu's JSON gives the types back
        from kombu.exceptions import EncodeError

        with pytest.raises(EncodeError):  # as without lease_debounce: nothing is recorded
            refresh.delay("types", object())
        assert not client.exists(burst_key(refresh.lease_key_for(("types", 0)))) or client.hget(
            burst_key(refresh.lease_key_for(("types", 0))), "fired"
        )
    finally:
        debounce_app.configure(debounce_app.app.conf.lease_backend, task_always_eager=False)


def test_a_timer_whose_record_the_store_lost_runs_with_the_arguments_it_was_published_with(
    client: redis.Redis, worker_factory: WorkerFactory
) -> None:
    result = refresh.delay("w", 5)
    refresh.delay("w", 6)
    client.delete(burst_key(refresh.lease_key_for(("w", 0))))  # the store lost the record
    worker_factory(APP)
    assert result.get(timeout=30) == 5  # not lost: run as its timer was published
    assert [n for _, _, n in _spans("w")] == [5]


def test_publishes_while_the_store_is_paused_run_once_it_answers_and_end_their_burst(
    client: redis.Redis, redis_url: str, worker_factory: WorkerFactory
) -> None:
    from celery_lease.store import debounce as stored

    with RedisServer() as leases:
        debounce_app.configure(
            redis_url, task_default_queue=worker_factory.queue, lease_backend=leases.url()
        )
        leases.pause()  # the scripts reach the server; their replies come too late
        try:
            first, second = refresh.delay("p", 1), refresh.delay("p", 2)
        finally:
            leases.resume()
        assert (first.lease_disposition, second.lease_disposition) == ("unguarded",) * 2
        worker_factory(APP, env={"LEASE_BACKEND": leases.url()})
        # Each runs once: it fires the burst its late trigger started or joined (with that
        # burst's latest arguments), or, finding none or one fired, runs as published. In
        # which order the server ran the two late triggers decides which arguments won.
        assert {first.get(timeout=30), second.get(timeout=30)} <= {1, 2}
        assert len(_spans("p")) == 2
        with leases.client() as store_client:
            assert stored.read_burst(store_client, refresh.lease_key_for(("p", 0))) is None
    debounce_app.configure(redis_url)


def test_whether_a_task_debounces_is_known_without_a_lease_store_configured() -> None:
    from celery_lease.policies import debounce

    app = Celery(
        "publisher", broker="amqp://guest:guest@127.0.0.1:5672//", set_as_current=False
    )  # no lease_backend, no Redis broker_url

    @app.task(shared=False, base=LeasedTask, name="p.plain")
    def plain() -> None: ...

    @app.task(shared=False, base=LeasedTask, name="p.debounced", lease_debounce=1.0)
    def debounced() -> None: ...

    plain_task, debounced_task = app.tasks[plain.name], app.tasks[debounced.name]
    assert not debounce.enabled(plain_task)  # a plain publish asks nothing of the store
    assert debounce.enabled(debounced_task)
    app.conf.lease_debounce = 2.0
    assert not debounce.enabled(plain_task)  # read once per task class, as every setting is
    plain_task.forget_lease_settings()
    assert debounce.enabled(plain_task)


def test_a_join_written_to_an_old_primary_that_stays_writable_is_no_join() -> None:
    from celery_lease import store
    from celery_lease.store import debounce as stored
    from harness.topologies import MASTER_NAME, SentinelSetup

    with SentinelSetup(replication_proxy=True) as setup:
        sentinel = setup.start()
        sentinel_client = store.client_for(sentinel.sentinel_url, 1.0, {"master_name": MASTER_NAME})
        key = "lease:{db:sentinel}"
        started = stored.trigger(
            sentinel_client, key, "b1", 60_000, 120_000, "{}", "{}", 1000, 60_000
        )  # its pool: the primary
        assert started.started
        old = sentinel.primary_port()
        with sentinel.sentinels[0].client() as admin:
            admin.execute_command("SENTINEL FAILOVER", MASTER_NAME)
        sentinel.wait_failover(old)
        # Joined on the old primary, the caller would wait on a burst lost with that node's
        # writes: the sentinels do not confirm it, so the join does not count (published at
        # once by the caller).
        with pytest.raises(store.PrimaryUnconfirmed):
            stored.trigger(sentinel_client, key, "b2", 60_000, 120_000, "{}", "{}", 1000, 60_000)


def test_a_start_or_a_fire_answered_by_an_old_primary_that_stays_writable_does_not_count() -> None:
    from celery_lease import store
    from celery_lease.store import debounce as stored
    from harness.topologies import MASTER_NAME, SentinelSetup

    with SentinelSetup(replication_proxy=True) as setup:
        sentinel = setup.start()
        options = {"master_name": MASTER_NAME}
        starter = store.client_for(sentinel.sentinel_url, 1.0, options)  # two pools, both
        timer = store.client_for(sentinel.sentinel_url, 1.5, options)  # on the primary
        key, other = "lease:{db:sentinel}", "lease:{db:other}"
        assert stored.trigger(timer, key, "b1", 60_000, 120_000, "{}", "{}", 1000, 60_000).started
        assert starter.ping()
        old = sentinel.primary_port()
        with sentinel.sentinels[0].client() as admin:
            admin.execute_command("SENTINEL FAILOVER", MASTER_NAME)
        sentinel.wait_failover(old)
        # A burst started on the old primary is lost with its writes; on the new one another
        # publish starts another burst, and this timer would be dropped as stale.
        with pytest.raises(store.PrimaryUnconfirmed):
            stored.trigger(starter, other, "b2", 60_000, 120_000, "{}", "{}", 1000, 60_000)
        # A fire there leaves its tombstone there only: a second timer would run it again.
        with pytest.raises(store.PrimaryUnconfirmed):
            stored.fire(timer, key, "b1", 60_000, now=True, timer="t-1")
        # Retried as the same timer again, on the primary the sentinels name: it runs once.
        assert stored.fire(timer, key, "b1", 60_000, now=True, again=True, timer="t-1").outcome in (
            "fire",
            "missing",
        )
        assert stored.fire(timer, key, "b1", 60_000, now=True, timer="t-2").outcome == "stale"


def test_with_min_replicas_a_start_or_a_fire_no_replica_acknowledged_does_not_count() -> None:
    from celery_lease import store
    from celery_lease.store import debounce as stored
    from harness.topologies import MASTER_NAME, SentinelSetup

    with SentinelSetup(replication_proxy=True) as setup:
        sentinel = setup.start()
        proxy = sentinel.replication_proxy
        assert proxy is not None
        client = store.client_for(sentinel.sentinel_url, 1.0, {"master_name": MASTER_NAME})
        key = "lease:{db:replicated}"
        start = (client, key, "b1", 60_000, 120_000, "{}", "{}", 1000, 60_000)
        proxy.blackhole()  # the replica hears nothing: a failover now would lose the burst
        with pytest.raises(store.NotReplicated):
            stored.trigger(*start, min_replicas=1)
        proxy.heal()
        # The unreplicated start stayed on the primary (its caller published at once): the
        # next publish joins it, and that join is acknowledged now.
        joined = stored.trigger(*start, min_replicas=1)
        assert (joined.started, joined.task_id, joined.count) == (False, "b1", 2)
        proxy.blackhole()
        with pytest.raises(store.NotReplicated):
            stored.fire(client, key, "b1", 60_000, now=True, timer="t-1", min_replicas=1)
        proxy.heal()
        # Retried as the same timer again: it fires from its tombstone, replicated this time.
        assert (
            stored.fire(
                client, key, "b1", 60_000, now=True, again=True, timer="t-1", min_replicas=1
            ).outcome
            == "fire"
        )
