"""``lease_limit=N``: up to N executions per key at once, on real workers of each pool, with
holders SIGKILLed mid-run, and each slot renewed and lost on its own."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_lease import (
    LeaseConfigError,
    LeaseConflict,
    LeasedTask,
    LeaseLost,
    hold,
    is_skipped,
    store,
)
from celery_lease.base import signals
from harness.redis_server import RedisServer
from harness.topologies import MASTER_NAME, cluster_setup, sentinel_setup
from harness.waiting import wait_for
from harness.workers import CeleryWorker
from tests.support.rig import Rig

APP = "tests.apps.limit_app"


@pytest.fixture
def rig(
    request: pytest.FixtureRequest,
    broker: RedisServer,
    broker_url: str,
    redis_url: str,
    tmp_path: Path,
) -> Iterator[Rig]:
    """A rig (broker, a lease store of its own) for the pool given by ``indirect``; its
    Celery broker is RabbitMQ when ``broker_url`` is (the rig's own Redis otherwise)."""
    rabbitmq = broker_url if broker_url != redis_url else None
    made = Rig(broker, request.param, tmp_path, broker_url=rabbitmq)
    yield made
    made.close()


def _worker(rig: Rig, concurrency: int, **env: str) -> CeleryWorker:
    worker = CeleryWorker(
        APP,
        pool=rig.pool,
        concurrency=concurrency,
        queue=rig.queue,
        env=rig.env(**env),
        log_dir=rig.log_dir,
    )
    rig.workers.append(worker)
    worker.start().wait_ready(60)
    return worker


@pytest.mark.parametrize(
    ("rig", "concurrency", "broker_url"),
    [
        ("prefork", 6, "redis"),
        ("threads", 10, "redis"),
        ("gevent", 10, "redis"),
        ("threads", 10, "rabbitmq"),
    ],
    indirect=["rig", "broker_url"],
)
def test_ten_contending_executions_at_limit_three_never_run_more_than_three(
    rig: Rig, concurrency: int
) -> None:
    _worker(rig, concurrency)
    tag = f"ten-{rig.queue}"  # the journal is the module's: a tag of this rig's own
    results = [rig.send("limit.retry", tag, 0.6, "chunks") for _ in range(10)]
    assert [r.get(timeout=60) for r in results] == [tag] * 10  # each ran, none used a retry
    starts = rig.journal(tag, "start")
    assert len(starts) == 10 and len(rig.journal(tag, "end")) == 10
    assert max(s["running"] for s in starts) == 3  # three at once, never more
    fences = [s["fence"] for s in starts]
    assert len(set(fences)) == 10 and {s["limit"] for s in starts} == {3}
    assert rig.journal(tag, "lost") == []
    wait_for(lambda: store.read_slots(rig.leases, starts[0]["key"]) is None, 10)


@pytest.mark.parametrize("rig", ["threads"], indirect=True)
def test_a_callable_limit_gives_each_tenant_its_own_n(rig: Rig) -> None:
    _worker(rig, 12)
    sent = [rig.send("limit.tenant", tenant, 1.5) for tenant in ["small", "big"] * 6]
    outcomes = [r.get(timeout=30) for r in sent]
    ran = {t: sum(1 for o in outcomes if o == t) for t in ("small", "big")}
    assert ran == {"small": 2, "big": 4}
    assert sum(1 for o in outcomes if is_skipped(o)) == 6


@pytest.mark.parametrize("rig", ["threads"], indirect=True)
def test_a_refused_slot_renewal_raises_lease_lost_in_that_execution_only(rig: Rig) -> None:
    _worker(rig, 4)
    sent = [rig.send("limit.skip", "ren", 3.0, "chunks") for _ in range(3)]
    starts = rig.wait_event("ren", "start", count=3)
    victim = starts[0]
    assert rig.leases.hdel(victim["key"], victim["token"]) == 1  # an operator's revoke
    lost = rig.wait_event("ren", "lost")
    assert [e["cause"] for e in lost] == ["refused"] and lost[0]["token"] == victim["token"]
    rig.wait_event("ren", "end", count=2)
    for result in sent:
        result.get(timeout=20, propagate=False)
    assert sorted(e["token"] for e in rig.journal("ren", "end")) == sorted(
        s["token"] for s in starts[1:]
    )
    assert len(rig.journal("ren", "lost")) == 1


def _holder_child(url: str, report: int) -> None:
    """In a forked child: take one slot, report its fencing token, then wait to be killed."""
    try:
        with hold("crash", url=url, ttl=0.3, limit=3, timeout=10.0) as lease:
            os.write(report, f"{lease.fencing_token}\n".encode())
            while True:
                time.sleep(1)
    finally:
        os._exit(0)


def test_after_a_hundred_sigkilled_holders_the_key_still_grants_exactly_n(redis_url: str) -> None:
    client = store.client_for(redis_url, 0.05, {})
    key = hold("crash", url=redis_url).key
    fences: list[int] = []
    most = 0
    for _ in range(100):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            _holder_child(redis_url, write)
        os.close(write)
        with os.fdopen(read) as lines:
            fences.append(int(lines.readline()))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        slots = store.read_slots(client, key)
        most = max(most, len(slots[1]) if slots else 0)
    assert most == 3 and fences == sorted(set(fences))  # at most N, fencing tokens increasing
    wait_for(lambda: store.read_slots(client, key) in (None, (3, [])), 5)
    held = [hold("crash", url=redis_url, ttl=5.0, limit=3) for _ in range(3)]
    for h in held:
        h.__enter__()
    with pytest.raises(LeaseConflict):
        hold("crash", url=redis_url, ttl=5.0, limit=3).__enter__()
    # Nothing piled up: the three live slots and the limit, the crashed ones deleted.
    assert client.hlen(key) == 4
    for h in held:
        h.__exit__(None, None, None)
    assert client.exists(key) == 0


# --- settings, eager mode -----------------------------------------------------------------


def _body() -> int:
    return 7


def _app(redis_url: str) -> Celery:
    app = Celery("limits", set_as_current=False)
    app.conf.update(lease_backend=redis_url, task_always_eager=True, lease_ttl=5.0)
    app.finalize()  # tasks are registered (and checked) as they are decorated
    return app


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3"])
def test_a_limit_that_is_not_a_whole_number_of_executions_is_refused_at_decoration(
    redis_url: str, bad: Any
) -> None:
    app = _app(redis_url)
    with pytest.raises(LeaseConfigError, match=r"lease_limit=.* must be a whole number"):
        app.task(shared=False, base=LeasedTask, name="bad.limit", lease_limit=bad)(_body)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("lease_on_conflict", "preempt"),
        ("lease_cooldown", 5.0),
    ],
)
def test_a_limit_with_a_setting_that_keeps_one_holder_is_refused_at_decoration(
    redis_url: str, option: str, value: Any
) -> None:
    app = _app(redis_url)
    with pytest.raises(
        LeaseConfigError,
        match=rf"lease_limit=3 .* cannot be combined with "
        rf".*{option}",
    ):
        app.task(shared=False, base=LeasedTask, name="bad.combo", lease_limit=3, **{option: value})(
            _body
        )


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("lease_on_conflict", "preempt"),
        ("lease_cooldown", 5.0),
    ],
)
def test_an_app_setting_that_keeps_one_holder_given_after_registration_is_refused_at_its_run(
    redis_url: str, setting: str, value: Any
) -> None:
    app = _app(redis_url)
    ran: list[int] = []

    def body() -> None:
        ran.append(1)

    task = app.task(shared=False, base=LeasedTask, name="late.combo", lease_limit=3)(body)
    app.conf[setting] = value  # a configuration loaded after the tasks were registered
    type(task).forget_lease_settings()
    # Neither dropped in silence (a cooldown no slot writes, a "preempt" that skips) nor run:
    # refused before the body, naming the setting and the fix.
    with pytest.raises(
        LeaseConfigError, match=rf"lease_limit=3 .* cannot be combined with .*{setting}"
    ):
        task.apply().get()
    assert ran == []


def test_a_limit_of_one_with_any_policy_is_the_plain_lease(redis_url: str) -> None:
    app = _app(redis_url)
    task = app.task(
        shared=False, base=LeasedTask, name="plain.one", lease_limit=1, lease_on_conflict="queue"
    )(_body)
    assert task.apply().get() == 7


def test_eager_calls_take_a_slot_like_a_worker_and_skip_when_all_are_held(redis_url: str) -> None:
    app = _app(redis_url)

    @app.task(
        shared=False, base=LeasedTask, name="eager.limited", lease_limit=lambda n: n, bind=True
    )
    def limited(self: Any, n: int) -> int:
        return self.lease.limit  # type: ignore[no-any-return]

    seen: list[tuple[str, int]] = []

    def note(signal: str) -> Callable[..., None]:
        def receiver(sender: Any = None, fencing_token: int = 0, **_: Any) -> None:
            seen.append((signal, fencing_token))

        return receiver

    on_acquired, on_released = note("acquired"), note("released")
    signals.lease_acquired.connect(on_acquired)
    signals.lease_released.connect(on_released)
    try:
        assert limited.apply((2,)).get() == 2
    finally:
        signals.lease_acquired.disconnect(on_acquired)
        signals.lease_released.disconnect(on_released)
    assert [s for s, _ in seen] == ["acquired", "released"] and seen[0][1] == seen[1][1] > 0
    client = store.client_for(redis_url, 0.5, {})
    key = limited.lease_key_for((2,))
    assert client.exists(key) == 0  # released
    holder = store.holder_json("other", "x", "h", 1)
    for _ in range(2):
        assert store.acquire_slot(client, key, os.urandom(16).hex(), 5000, holder, limit=2).granted
    assert is_skipped(limited.apply((2,)).get())
    with pytest.raises(LeaseConfigError, match="lease_limit callable returned 0"):
        limited.apply((0,)).get()


def test_ls_shows_used_of_n_and_each_holder_of_a_limited_key(redis_url: str) -> None:
    from tests.test_cli import _env
    from tests.test_cli import celery_lease as lease_cli

    # TTL 300 s: no renewal pass (every 100 s) can reorder the stored deadlines mid-test, and
    # the two grants are a few ms apart, so the holder `release` names is the first one taken.
    held = [hold("report", url=redis_url, ttl=300.0, limit=3) for _ in range(2)]
    leases = []
    for h in held:
        leases.append(h.__enter__())
        time.sleep(0.005)  # distinct stored deadlines (millisecond resolution)
    try:
        env = _env(redis_url, "q-limit")
        listed = json.loads(lease_cli(env, "ls", "--json").stdout)
        slots = [i for i in listed if i.get("key") == held[0].key]
        assert sorted(i["fencing_token"] for i in slots) == sorted(
            lease.fencing_token for lease in leases
        )
        assert {(i["used"], i["limit"], i["foreign"]) for i in slots} == {(2, 3, "")}
        table = lease_cli(env, "ls", "--wide").stdout
        assert "SLOTS" in table and table.count("2/3") == 2
        doctor = lease_cli(env, "doctor").stdout
        assert held[0].key not in doctor  # a hash of slots is no unknown holder
        first = leases[0]  # the first-ending holder, the one `show` and `release` name
        released = lease_cli(env, "release", held[0].key, "--yes")
        assert released.returncode == 0, released.stderr
        slots = store.read_slots(store.client_for(redis_url, 1.0, {}), held[0].key)
        assert slots is not None and [s.holder.token for s in slots[1]] == [
            lease.token for lease in leases if lease is not first
        ]
    finally:
        for h in held:
            with contextlib.suppress(LeaseLost):  # the revoked one learns it at its release
                h.__exit__(None, None, None)


def test_slots_on_a_redis_cluster_are_taken_renewed_and_released_on_their_keys_primary() -> None:
    with cluster_setup() as setup:
        client = store.client_for(
            f"redis://127.0.0.1:{setup.live()[0].port}/0", 1.0, {"cluster": True}
        )
        key = "lease:{limited:1}"  # the slot hash and its fencing counter share the hash tag
        holder = store.holder_json("t", "id", "h", 1)
        toks = [os.urandom(16).hex() for _ in range(4)]
        got = [store.acquire_slot(client, key, t, 2000, holder, limit=3) for t in toks]
        assert [g.granted for g in got] == [True, True, True, False]
        # The heartbeat's path on a cluster: lease/renew-1.lua per lease, grouped by primary.
        assert store.renew_many(client, [(key, t, 60_000) for t in toks], slots=range(4)) == [
            1,
            1,
            1,
            -1,
        ]
        assert store.release_slot(client, key, toks[0]) is True
        assert store.acquire_slot(client, key, toks[3], 2000, holder, limit=3).granted
        slots = store.read_slots(client, key)
        assert slots is not None and slots[0] == 3 and len(slots[1]) == 3


def test_slots_through_sentinel_are_confirmed_on_the_primary_and_wait_for_a_replica() -> None:
    with sentinel_setup() as setup:
        client = store.client_for(setup.sentinel_url, 1.0, {"master_name": MASTER_NAME})
        key = "lease:{limited:2}"
        holder = store.holder_json("t", "id", "h", 1)
        toks = [os.urandom(16).hex() for _ in range(3)]
        # A grant counts once the sentinels confirm its node, and with WAIT once a replica has it.
        assert store.acquire_slot(client, key, toks[0], 5000, holder, limit=2).granted
        assert store.acquire_slot(client, key, toks[1], 5000, holder, 1, limit=2).granted
        assert not store.acquire_slot(client, key, toks[2], 5000, holder, limit=2).granted
        assert store.renew_many(client, [(key, t, 5000) for t in toks], 1, slots=range(3)) == [
            1,
            1,
            -1,
        ]
        assert store.release_slot(client, key, toks[0]) is True


def test_plain_leases_and_slots_are_renewed_in_one_call_each_by_its_own_script(
    redis_url: str,
) -> None:
    client = store.client_for(redis_url, 1.0, {})
    holder = store.holder_json("t", "id", "h", 1)
    plain, slot, gone = (os.urandom(16).hex() for _ in range(3))
    assert store.acquire(client, "lease:{plain}", plain, 2000, holder).granted
    assert store.acquire_slot(client, "lease:{slots}", slot, 2000, holder, limit=3).granted
    leases = [
        ("lease:{plain}", plain, 60_000),
        ("lease:{slots}", slot, 60_000),
        ("lease:{slots}", gone, 60_000),
        ("lease:{slots}", plain, 30_000),
    ]
    assert store.renew_many(client, leases, slots=[1, 2, 3]) == [1, 1, -1, -1]
    assert client.pttl("lease:{plain}") > 59_000 and client.pttl("lease:{slots}") > 59_000


def test_an_exit_that_interrupts_taking_a_slot_frees_that_slot_at_once(redis_url: str) -> None:
    client = store.client_for(redis_url, 1.0, {})

    def interrupt(**_: Any) -> None:
        raise KeyboardInterrupt  # lands after the grant, inside lifecycle.take

    kept = hold("interrupted", url=redis_url, ttl=30.0, limit=2)
    kept.__enter__()
    signals.lease_acquired.connect(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            hold("interrupted", url=redis_url, ttl=30.0, limit=2).__enter__()
    finally:
        signals.lease_acquired.disconnect(interrupt)
    slots = store.read_slots(client, kept.key)
    assert slots is not None and [s.holder.token for s in slots[1]] == [kept.lease.token]
    kept.__exit__(None, None, None)


def test_a_hold_waiting_for_a_slot_is_woken_by_a_slots_release(redis_url: str) -> None:
    first, second = (hold("woken", url=redis_url, ttl=30.0, limit=2) for _ in range(2))
    first.__enter__()
    second.__enter__()
    got: list[float] = []

    def wait() -> None:
        with hold("woken", url=redis_url, ttl=30.0, limit=2, timeout=10.0):
            got.append(time.monotonic())

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)  # the waiter is blocked on the key's wake list by now (not an assertion)
    released = time.monotonic()
    first.__exit__(None, None, None)
    waiter.join(10)
    second.__exit__(None, None, None)
    assert got and got[0] - released < 2.0  # woken by the release, not by a 30 s expiry


@pytest.mark.parametrize("rig", ["threads"], indirect=True)
def test_with_lease_dedupe_a_limited_key_keeps_one_waiting_copy_whose_grant_clears_its_claim(
    rig: Rig,
) -> None:
    publisher = Celery(
        "publisher", broker=rig.broker.url(), backend=rig.broker.url(), set_as_current=False
    )
    publisher.conf.update(
        lease_backend=rig.store.url(), task_default_queue=rig.queue, lease_ttl=rig.ttl
    )

    @publisher.task(
        shared=False,
        bind=True,
        base=LeasedTask,
        name="limit.dedupe",
        lease_key=("tag",),
        lease_limit=2,
        lease_dedupe=True,
    )
    def limited_dedupe(self: Any, tag: str, seconds: float, mode: str = "sleep") -> str:
        raise AssertionError("runs on the worker")

    publisher.finalize()
    sent = [limited_dedupe.apply_async(("dd", 0.3)) for _ in range(3)]  # no worker yet
    assert [r.lease_disposition for r in sent] == ["published", "deduplicated", "deduplicated"]
    assert {r.id for r in sent} == {sent[0].id}
    _worker(rig, 4)
    assert sent[0].get(timeout=30) == "dd"
    again = limited_dedupe.apply_async(("dd", 0.3))  # the claim was cleared by the grant
    assert again.lease_disposition == "published" and again.get(timeout=30) == "dd"


def _started_at_a_release(rig: Rig, tag: str, first: int = 2, within: float = 0.5) -> None:
    """Every start after the ``first`` began within ``within`` seconds after an end."""
    starts, ends = rig.journal(tag, "start"), rig.journal(tag, "end")
    for start in sorted(starts, key=lambda e: e["t"])[first:]:
        gaps = [start["t"] - end["t"] for end in ends if end["t"] <= start["t"] + 0.05]
        assert gaps and min(gaps) < within, (start, ends)


@pytest.mark.parametrize("rig", ["threads"], indirect=True)
@pytest.mark.parametrize("name", ["limit.queue", "limit.retry_line"])
def test_with_limit_two_every_waiting_duplicate_runs_at_a_release_never_more_than_two(
    rig: Rig, name: str
) -> None:
    _worker(rig, 8)
    tag = name.replace(".", "-")
    sent = [rig.send(name, tag, 0.4, n) for n in range(6)]
    assert [r.get(timeout=60) for r in sent] == [tag] * 6  # each ran; retry used none
    starts = rig.journal(tag, "start")
    assert len(starts) == 6 and max(s["running"] for s in starts) == 2
    assert len({s["fence"] for s in starts}) == 6 and rig.journal(tag, "lost") == []
    _started_at_a_release(rig, tag)  # handed a slot at once, not a renew interval later
    wait_for(lambda: rig.leases.exists(starts[0]["key"], f"{starts[0]['key']}:line") == 0, 10)


@pytest.mark.parametrize("rig", ["threads"], indirect=True)
def test_with_limit_two_coalesce_runs_one_more_after_a_release_with_the_latest_arguments(
    rig: Rig,
) -> None:
    from celery_lease import follow, is_coalesced

    _worker(rig, 8)
    tag = "coalesce-two"
    running = [rig.send("limit.coalesce", tag, 3.0, n) for n in (1, 2)]
    rig.wait_event(tag, "start", count=2)
    # One at a time: a pool of 8 threads may start copies sent together in any order, and
    # "the latest" is the last to be parked, not the last sent.
    markers = [rig.send("limit.coalesce", tag, 0.2, n).get(timeout=30) for n in (3, 4, 5)]
    assert all(is_coalesced(m) for m in markers) and len({m["into"] for m in markers}) == 1
    assert follow(markers[0], timeout=30, app=rig.app) == tag
    assert [r.get(timeout=30) for r in running] == [tag, tag]
    starts = rig.journal(tag, "start")
    assert sorted(s["seq"] for s in starts) == [1, 2, 5]  # one more run, the latest arguments
    assert max(s["running"] for s in starts) == 2
    _started_at_a_release(rig, tag)


@pytest.mark.parametrize("rig", ["threads"], indirect=True)
def test_a_slot_handed_by_a_worker_killed_before_its_publish_is_published_by_a_live_sweep_once(
    rig: Rig,
) -> None:
    doomed = _worker(rig, 4, KILL_BEFORE_HANDOFF_PUBLISH="1")
    tag = "lost-publish"
    rig.send("limit.queue", tag, 0.5, 0)
    rig.send("limit.queue", tag, 30.0, 1)  # dies with its worker: its slot lapses at its TTL
    key = rig.wait_event(tag, "start", count=2)[0]["key"]
    waiting = rig.send("limit.queue", tag, 0.2, 2)
    wait_for(lambda: rig.leases.llen(f"{key}:line") == 1, 20, message="never parked")
    assert doomed.wait(30) == -signal.SIGKILL  # released seq 0's slot, reserved it, died
    assert rig.leases.llen(f"{key}:line") == 0 and rig.leases.hexists(key, f"r:{waiting.id}")
    killed_at = time.time()
    _worker(rig, 4)  # a live worker: its sweep publishes the reserved run once past due
    assert waiting.get(timeout=60) == tag
    started = [s for s in rig.journal(tag, "start") if s.get("seq") == 2]
    print(
        f"a lost slot publish: published by the sweep {started[0]['t'] - killed_at:.1f}s "
        "after the releaser died (lease_ttl=6)"
    )
    # Taken by the copy the sweep published: a tombstone, which refuses any other copy of it.
    assert str(rig.leases.hget(key, f"r:{waiting.id}")).endswith(":ran'")  # b'<ms>:ran'
    assert len(started) == 1 and max(s["running"] for s in rig.journal(tag, "start")) <= 2
