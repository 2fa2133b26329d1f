"""A release whose connection broke, sent once more (celery_lease.core.lifecycle, pending, wire).

Real Redis servers (private, restarted, paused, their clients killed). Where a reply must be
lost after the script ran, the real release runs and only its reply is replaced by a
connection error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_lease import store
from celery_lease.base import clock, signals
from celery_lease.base.keys import fence_key
from celery_lease.core import lifecycle
from celery_lease.core.heartbeat import heartbeat
from celery_lease.core.lease import Lease
from celery_lease.settings.config import LeaseSettings, resolve_settings
from celery_lease.store import pending
from harness.redis_server import RedisServer
from harness.waiting import wait_for
from tests.support.fixtures import RedisFactory
from tests.support.received import received
from tests.support.store_calls import NoTarget, lose_first_reply, spy


@pytest.fixture
def server(throwaway_redis: RedisFactory) -> Iterator[RedisServer]:
    yield throwaway_redis()
    for lease in heartbeat().held():  # nothing of a test outlives it
        heartbeat().remove(lease)


def _setup(
    server: RedisServer, ttl: float = 6.0, timeout: float | None = None
) -> tuple[LeaseSettings, redis.Redis]:
    app = Celery("retry", broker="memory://", set_as_current=False)
    app.conf.update(lease_backend=server.url(), lease_ttl=ttl)
    if timeout is not None:
        app.conf.update(lease_store_timeout=timeout)
    settings = resolve_settings(app.conf, {}, "test")
    return settings, store.client_for(settings.url, settings.options.store_timeout)


def _take(settings: LeaseSettings, client: redis.Redis, key: str) -> Lease:
    got = lifecycle.take(
        settings, client, key, lifecycle.HolderInfo("t", key, "h"), NoTarget(), sender="t"
    )
    assert isinstance(got, Lease)
    return got


def _in_threads(run: Callable[[Any], None], args: Iterable[Any]) -> None:
    """``run(arg)`` for each of ``args``, each in a thread of its own, all joined."""
    threads = [threading.Thread(target=run, args=(arg,)) for arg in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.parametrize("wait", [True, False], ids=["release waited for", "reply read later"])
def test_a_holder_whose_store_restarted_is_told_at_release_and_the_next_take_works_at_once(
    server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    wait: bool,
) -> None:
    # After a restart every pooled connection is dead: the release must still reach the store
    # (and learn that the key is gone), and the next acquire must not fail on a dead one.
    settings, client = _setup(server)
    acquires = spy(monkeypatch, store.PLAIN, "acquire")  # the plain key's acquire
    with received(signals.lease_lost) as lost, received(signals.lease_released) as released:
        leases = [_take(settings, client, f"lease:{{r:{i}}}") for i in range(2)]
        server.restart()  # empty: both keys are gone, every connection of the client is dead
        for lease in leases:
            lifecycle.end(lease, sender="t", wait=wait)
        acquires.clear()
        after = _take(settings, client, "lease:{r:after}")
        assert len(acquires) == 1  # no retry was needed
        lifecycle.end(after, sender="t")
    assert sorted((x["key"], x["cause"]) for x in lost) == [
        ("lease:{r:0}", "refused"),
        ("lease:{r:1}", "refused"),
    ]
    expected = [False, False, True] if wait else [None, None, True]
    assert [x["released"] for x in released] == expected


@pytest.mark.parametrize("wait", [True, False], ids=["release waited for", "reply read later"])
def test_threads_releasing_at_once_after_a_restart_all_learn_their_keys_were_gone(
    server: RedisServer,
    wait: bool,
) -> None:
    settings, client = _setup(server)
    n = 16
    leases: list[Lease] = []
    gate = threading.Barrier(n)

    def take(i: int) -> None:
        gate.wait()  # at once: each thread checks a connection of its own out of the free list
        leases.append(_take(settings, client, f"lease:{{c:{i}}}"))

    _in_threads(take, range(n))
    assert len(leases) == n and len(client.__dict__["_lease_idle"][1]) > 1
    answers: dict[str, bool | None] = {}
    server.restart()
    gate = threading.Barrier(n)

    def end(lease: Lease) -> None:
        gate.wait()
        answers[lease.key] = lifecycle.end(lease, sender="t", wait=wait).released

    with received(signals.lease_lost) as lost:
        _in_threads(end, leases)
        pending.settle_all()
    assert sorted(x["key"] for x in lost) == sorted(lease.key for lease in leases)
    assert set(answers.values()) == ({False} if wait else {None})


def test_a_release_after_the_librarys_connections_were_killed_deletes_the_key(
    server: RedisServer,
) -> None:
    settings, client = _setup(server)
    leases = [_take(settings, client, f"lease:{{k:{i}}}") for i in range(2)]
    admin = server.client()
    admin.client_kill_filter(_type="normal", skipme=True)
    with received(signals.lease_lost) as lost:
        assert lifecycle.end(leases[0], sender="t").released is True
        lifecycle.end(leases[1], sender="t", wait=False)
        pending.settle_all()
    assert not lost
    assert admin.exists(leases[0].key, leases[1].key) == 0


@pytest.mark.parametrize("name", ["release", "release_and_wake"])
def test_a_release_whose_reply_was_lost_is_not_a_loss_when_a_waiter_took_the_key_at_once(
    server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    # A hold's release wakes a waiter, which acquires at once: the repeated release then
    # finds a later holder, although the first release ran and the key was this token's to
    # the end.
    settings, client = _setup(server)
    lease = _take(settings, client, "lease:{w}")
    other = redis.Redis.from_url(server.url())
    calls = lose_first_reply(
        monkeypatch, name, lambda: store.acquire(other, "lease:{w}", "b" * 32, 5000, "{}")
    )
    release = getattr(store, name)
    with received(signals.lease_lost) as lost:
        ending = lifecycle.end(lease, sender="t", release=release)
    assert len(calls) == 2
    assert ending.released is True and ending.loss is None, ending
    assert not lost


def test_a_release_whose_reply_was_lost_after_the_fence_counter_lapsed_is_not_a_loss(
    server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The fence counter outlives the grant by an hour, but a lease renewed for longer keeps
    # its key after the counter lapsed; its release must still answer a repeat as the first.
    settings, client = _setup(server)
    lease = _take(settings, client, "lease:{l}")
    admin = server.client()
    admin.delete(fence_key("lease:{l}"))  # as after more than TTL + 1 h of renewals
    calls = lose_first_reply(monkeypatch, "release", lambda: None)
    ending = lifecycle.end(lease, sender="t", release=store.release)
    assert len(calls) == 2
    assert ending.released is True and ending.loss is None, ending


@pytest.mark.parametrize("wait", [True, False], ids=["release waited for", "reply read later"])
def test_a_release_to_a_paused_store_is_not_sent_again(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch, wait: bool
) -> None:
    settings, client = _setup(server, timeout=0.5)
    lease = _take(settings, client, "lease:{p}")
    sent = spy(monkeypatch, store, "release")
    server.pause()
    try:
        started = time.monotonic()
        ending = lifecycle.end(lease, sender="t", wait=wait, release=store.release)
        if not wait:
            pending.settle_all()
        took = time.monotonic() - started
    finally:
        server.resume()
    assert ending.released is None
    assert len(sent) == (1 if wait else 0)
    assert took < 0.5 * 1.8, took


def test_the_heartbeat_declares_a_deadline_on_time_while_a_broken_release_waits_to_be_resent(
    throwaway_redis: RedisFactory,
    server: RedisServer,
) -> None:
    # The heartbeat plans no round trip whose timeout could still run at the earliest
    # deadline; the release it sends again for a connection that broke is one too.
    near = throwaway_redis()
    settings, client = _setup(near, ttl=1.5)  # store timeout 0.25 s
    far_settings, far_client = _setup(server, ttl=30.0)  # store timeout 2 s
    lease = _take(settings, client, "lease:{near}")
    other = _take(far_settings, far_client, "lease:{far}")
    near.pause()  # the near lease is no longer renewed: its deadline stands
    server.restart()  # the far client's idle connection is dead
    server.pause()  # and a fresh one hangs
    try:
        with received(signals.lease_lost) as lost:
            time.sleep(max(lease.deadline - 0.1 - clock.now(), 0.0))
            lifecycle.end(other, sender="t", wait=False)
            found = wait_for(lambda: [x for x in lost if x["key"] == lease.key], 5)
            assert pending.has_pending()  # not sent again yet: no time was left for it
            server.resume()
            # The heartbeat sends it once a round trip fits (no acquire comes to do it), and
            # learns that the restarted store no longer had the key.
            refused = wait_for(lambda: [x for x in lost if x["key"] == other.key], 5)
    finally:
        near.resume()
        server.resume()
        lifecycle.end(lease, sender="t")
        pending.settle_all()
    assert found[0]["cause"] == "deadline"
    assert found[0]["late"] < 0.1, found[0]["late"]
    assert refused[0]["cause"] == "refused"
