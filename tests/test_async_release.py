"""The release written before the result is stored, its reply read later (store.pending).

Real workers (solo and prefork) and a real Redis: a call made the moment the previous one's
result arrived always runs; a process killed right after writing its release still releases.
In process, through a TCP proxy: a release whose reply never comes holds nothing past one TTL
and delays the next acquire by at most the store timeout.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from celery_lease import is_skipped, store
from celery_lease.base import signals
from celery_lease.base.keys import fence_key
from celery_lease.core import lifecycle
from celery_lease.core.heartbeat import heartbeat
from celery_lease.core.lease import Lease
from celery_lease.settings.config import resolve_settings
from celery_lease.store import pending
from harness.proxy import TcpProxy
from harness.redis_server import RedisServer
from harness.waiting import wait_for
from tests.support.received import received
from tests.support.rig import Rig
from tests.support.store_calls import NoTarget

CALLS = 2000


@pytest.fixture(scope="module", params=["solo", "prefork"])
def rig(
    request: pytest.FixtureRequest, broker: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rig]:
    rig = Rig(broker, request.param, tmp_path_factory.mktemp(request.param), ttl=30.0)
    yield rig
    rig.close()


def test_a_call_sent_when_the_previous_result_arrived_is_never_skipped(rig: Rig) -> None:
    rig.worker()
    started = time.monotonic()
    for i in range(CALLS):
        result = rig.send("echo", "same-key", i).get(timeout=30)
        assert not is_skipped(result), f"call {i} of {CALLS} found the key still held"
        assert result == i
    elapsed = time.monotonic() - started
    print(f"\n{rig.pool}: {CALLS} calls in {elapsed:.1f} s")
    wait_for(lambda: rig.lease_keys() == [], 5, message="a lease outlived its execution")


def test_a_process_killed_right_after_writing_its_release_still_releases(rig: Rig) -> None:
    queue = f"{rig.queue}-kill"
    rig.worker(queue=queue, KILL_AFTER_RELEASE_WRITE="1")
    # The earlier test's counters (already noting their releases) are not this execution's.
    earlier = set(rig.leases.scan_iter("lease:*:fence"))
    rig.send("echo", "killed", 0, queue=queue)
    key = wait_for(
        lambda: next((k for k in rig.leases.scan_iter("lease:*:fence") if k not in earlier), None),
        20,
        message=rig.logs,
    )
    # The release script notes the released token beside the fencing counter: the key went
    # because it was released, long before its 30 s TTL could expire it.
    wait_for(
        lambda: b":" in (rig.leases.get(key) or b""),
        10,
        message=lambda: f"not released: {rig.leases.get(key)!r}\n{rig.logs()}",
    )
    assert rig.lease_keys() == []


# -- in process: a reply that never arrives ----------------------------------------------------


@pytest.fixture
def proxied(redis_server: RedisServer, tmp_path: Path) -> Iterator[tuple[TcpProxy, Celery]]:
    with TcpProxy(redis_server.port) as proxy:
        app = Celery("pending", broker="memory://", set_as_current=False)
        app.conf.update(
            lease_backend=f"redis://127.0.0.1:{proxy.port}/0",
            lease_ttl=1.5,
            lease_store_timeout=0.4,
        )
        yield proxy, app
        proxy.heal()
        for lease in heartbeat().held():
            heartbeat().remove(lease)
        pending.settle_all()


def test_a_release_whose_reply_never_arrives_holds_nothing_past_one_ttl(
    proxied: tuple[TcpProxy, Celery],
    redis_server: RedisServer,
) -> None:
    proxy, app = proxied
    settings = resolve_settings(app.conf, {}, "test")
    client = store.client_for(settings.url, settings.options.store_timeout)
    direct = redis_server.client()
    with received(signals.lease_released) as ended:
        got = lifecycle.take(
            settings,
            client,
            "lease:{unanswered}",
            lifecycle.HolderInfo("t", "id", "h"),
            NoTarget(),
            sender="t",
        )
        assert isinstance(got, Lease)
        proxy.blackhole()
        ending = lifecycle.end(got, sender="t", wait=False)
        ended_at = time.monotonic()
        assert ending.released is None and pending.has_pending()
        assert [e["released"] for e in ended] == [None]  # sent as the execution ends
        # The heartbeat gives up on the reply once the store timeout has passed (at its next
        # wake-up, within a second), without waiting for it, and gives the connection back.
        wait_for(
            lambda: not pending.has_pending(),
            0.4 + 1.0 + 1.0,
            message="the unanswered release is still pending",
        )
        # Nothing reached the server: the key lapses with its TTL, never later.
        wait_for(lambda: direct.exists("lease:{unanswered}") == 0, 1.5 + 0.5)
        assert time.monotonic() - ended_at < 1.5 + 0.5


def test_the_next_acquire_waits_for_an_unanswered_release_at_most_the_store_timeout(
    proxied: tuple[TcpProxy, Celery],
    redis_server: RedisServer,
) -> None:
    proxy, app = proxied
    settings = resolve_settings(app.conf, {}, "test")
    client = store.client_for(settings.url, settings.options.store_timeout)
    holder = lifecycle.HolderInfo("t", "id", "h")
    got = lifecycle.take(settings, client, "lease:{first}", holder, NoTarget(), sender="t")
    assert isinstance(got, Lease)
    proxy.blackhole()
    lifecycle.end(got, sender="t", wait=False)
    # The next execution's acquire goes to a store that answers (another client): it is
    # sent once this process gave up on the unanswered reply, not later.
    direct = resolve_settings(app.conf, {"lease_backend": redis_server.url()}, "test")
    other = store.client_for(direct.url, direct.options.store_timeout)
    started = time.monotonic()
    nxt = lifecycle.take(direct, other, "lease:{next}", holder, NoTarget(), sender="t")
    waited = time.monotonic() - started
    assert isinstance(nxt, Lease)
    assert waited < 0.4 + 0.3
    assert not pending.has_pending()
    lifecycle.end(nxt, sender="t", wait=False)
    pending.settle_all()
    assert redis_server.client().exists("lease:{next}") == 0
    assert redis_server.client().get(fence_key("lease:{next}")).endswith(nxt.token.encode())
