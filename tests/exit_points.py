"""Exits (any ``BaseException``) at every point of taking and ending a lease leave no lease held
by nobody: what may have been granted is released, nothing stays registered, the exit goes on.

Real Redis. The exit is injected at every line celery-lease runs (:mod:`tests.support.exits`),
or raised by a real signal while the acquire's reply is held back by a proxy, or by a real
time limit in a real worker.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_lease import current_lease, hold, store
from celery_lease.base.keys import fence_key
from celery_lease.core import lifecycle
from celery_lease.core.heartbeat import heartbeat
from celery_lease.core.lease import Lease
from celery_lease.execution.task import LeasedTask
from celery_lease.settings.config import LeaseSettings, resolve_settings
from celery_lease.store import pending
from harness.proxy import TcpProxy
from harness.redis_server import RedisServer
from tests.support.exits import Exit, every_exit, untraced
from tests.support.fixtures import ProxyFactory
from tests.support.rig import CONCURRENCY, Rig
from tests.support.store_calls import NoTarget
from tests.support.waiting import wait_for

HOLDER = lifecycle.HolderInfo("t", "id", "h")


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    app = Celery("exits", broker="memory://", set_as_current=False)
    app.conf.update(lease_backend=redis_url, lease_ttl=6.0)
    yield app
    for lease in heartbeat().held():  # nothing of a test outlives it
        heartbeat().remove(lease)


@pytest.fixture
def direct(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def settings_and_client(app: Celery) -> tuple[LeaseSettings, Any]:
    settings = resolve_settings(app.conf, {}, "test")
    return settings, store.client_for(settings.url, settings.options.store_timeout)


def registered(key: str) -> list[Lease]:
    return [lease for lease in heartbeat().held() if lease.key == key]


def no_lease_left(direct: redis.Redis, key: str, where: str) -> None:
    """The key is gone on the server (a written release's reply may still be unread) and
    nothing renews a lease of it."""
    wait_for(
        lambda: direct.exists(key) == 0,
        2.0,
        message=lambda: f"exit at {where}: {key} still held: {direct.get(key)!r}",
    )
    assert registered(key) == [], f"exit at {where}: still renewed"


def test_an_exit_anywhere_in_take_releases_what_it_may_have_been_granted(
    app: Celery,
    direct: redis.Redis,
) -> None:
    settings, client = settings_and_client(app)
    key = "lease:{exit:take}"
    targets: list[NoTarget] = []

    def run() -> object:
        targets.append(NoTarget())
        return lifecycle.take(settings, client, key, HOLDER, targets[-1], sender="t")

    def check(where: str) -> None:
        no_lease_left(direct, key, where)
        assert targets[-1].finished, f"exit at {where}: the target was left armed"
        again = lifecycle.take(settings, client, key, HOLDER, NoTarget(), sender="t")
        assert isinstance(again, Lease), f"exit at {where}: the next take was refused"
        lifecycle.end(again, sender="t")

    def finished(got: object) -> None:
        assert isinstance(got, Lease)
        lifecycle.end(got, sender="t")

    places = every_exit(run, check, finished)
    # Among them: after the acquire was written and before its reply was read.
    assert any("wire.py" in p and "(call after a call)" in p for p in places), places
    assert any("heartbeat.py" in p for p in places), places


def test_an_exit_in_a_take_that_meets_a_holder_never_touches_the_holders_lease(
    app: Celery,
    direct: redis.Redis,
) -> None:
    settings, client = settings_and_client(app)
    key = "lease:{exit:held}"
    holder = lifecycle.take(settings, client, key, HOLDER, NoTarget(), sender="t")
    assert isinstance(holder, Lease)
    held = direct.get(key)

    def check(where: str) -> None:
        assert direct.get(key) == held, f"exit at {where}: the holder's lease was touched"
        assert registered(key) == [holder]

    def finished(got: object) -> None:
        assert isinstance(got, store.AcquireResult) and not got.granted

    every_exit(
        lambda: lifecycle.take(settings, client, key, HOLDER, NoTarget(), sender="t"),
        check,
        finished,
    )
    assert lifecycle.end(holder, sender="t").released


@pytest.mark.parametrize("wait", [True, False], ids=["waiting", "written"])
def test_an_exit_anywhere_in_end_still_releases_and_unregisters(
    app: Celery,
    direct: redis.Redis,
    wait: bool,
) -> None:
    settings, client = settings_and_client(app)
    key = "lease:{exit:end}"
    leases: list[Lease] = []

    def run() -> object:
        leases.append(untraced(lambda: _taken(settings, client, key)))
        return lifecycle.end(leases[-1], sender="t", wait=wait)

    def check(where: str) -> None:
        assert leases[-1].retired, f"exit at {where}: the lease is still renewed"
        no_lease_left(direct, key, where)

    places = every_exit(run, check, lambda ending: None)
    # "(pid ": end's check that the lease is this process's (process.pid(), right after
    # retire() returned): an exit between the unregistration and the release.
    for step in ["(pid ", "(retire ", "(remove ", "(_send_release " if wait else "(write "]:
        assert any(step in p for p in places), (step, places)
    pending.settle_all()


class Body:
    """What the leased task below ran."""

    runs: list[str] = []


def test_an_exit_anywhere_in_a_leased_task_leaves_no_lease_and_the_next_copy_runs(
    app: Celery,
    direct: redis.Redis,
) -> None:
    @app.task(base=LeasedTask, name="exits.job", lease_key=("tag",), shared=False)
    def job(tag: str) -> str:
        Body.runs.append(tag)
        return tag

    key = job.lease_key_for(("x",))

    def check(where: str) -> None:
        no_lease_left(direct, key, where)
        # Not even one that lands right after the lease was made the context's current one.
        assert current_lease() is None, f"exit at {where}: current_lease() still names it"
        Body.runs.clear()
        assert job.apply(("x",)).get() == "x", f"exit at {where}: the next copy did not run"
        assert Body.runs == ["x"], f"exit at {where}: the next copy was skipped"

    def finished(result: object) -> None:
        assert result.get() == "x"  # type: ignore[attr-defined]

    places = every_exit(lambda: job.apply(("x",)), check, finished)
    assert any("task.py" in p for p in places), places
    no_lease_left(direct, key, "the end")


@pytest.mark.parametrize("form", ["with", "acquire"])
def test_an_exit_anywhere_in_a_hold_leaves_no_lease_and_the_next_hold_takes_it(
    redis_url: str,
    direct: redis.Redis,
    form: str,
) -> None:
    def run() -> object:
        h = hold("exit-hold", url=redis_url, ttl=6.0)
        if form == "with":
            with h as lease:
                return lease.fencing_token
        assert h.acquire()
        return h.release()

    key = hold("exit-hold", url=redis_url).key

    def check(where: str) -> None:
        no_lease_left(direct, key, where)
        with hold("exit-hold", url=redis_url, ttl=6.0, blocking=False):
            pass

    places = every_exit(run, check, lambda returned: None)
    assert any("plain.py" in p for p in places), places
    no_lease_left(direct, key, "the end")


def test_a_signal_while_the_acquires_reply_is_in_flight_releases_the_grant(
    app: Celery,
    direct: redis.Redis,
    tcp_proxy: ProxyFactory,
    redis_url: str,
) -> None:
    """A real signal handler raises while take() waits for a reply the proxy holds back (0.6 s
    of delay, a store timeout of 1.5 s): the server ran the acquire (the fencing counter
    grew), and the release sent after the exit deleted the key once the replies flowed."""
    port = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"]
    proxy = tcp_proxy(port)
    app.conf.lease_backend = f"redis://127.0.0.1:{proxy.port}/0"
    app.conf.lease_store_timeout = 1.5
    settings, client = settings_and_client(app)
    key = "lease:{exit:signal}"
    lifecycle.end(_taken(settings, client, key), sender="t")  # the script is cached, warm
    fence = fence_counter(direct, key)

    def time_limit(signum: int, frame: Any) -> None:
        raise Exit("time limit")

    previous = signal.signal(signal.SIGALRM, time_limit)
    proxy.hold_replies()
    healing = threading.Timer(0.6, proxy.heal)
    healing.start()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(Exit):
            lifecycle.take(settings, client, key, HOLDER, NoTarget(), sender="t")
        assert fence_counter(direct, key) > fence  # granted on the server
        no_lease_left(direct, key, "the signal")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        healing.join()
    lifecycle.end(_taken(settings, client, key), sender="t")


def fence_counter(direct: redis.Redis, key: str) -> int:
    """The key's fencing counter: it grows at every grant."""
    found = re.match(rb"\d+", direct.get(fence_key(key)) or b"0")
    assert found is not None
    return int(found.group())


def _taken(settings: Any, client: Any, key: str) -> Lease:
    got = lifecycle.take(settings, client, key, HOLDER, NoTarget(), sender="t")
    assert isinstance(got, Lease)
    return got


@pytest.mark.parametrize(
    ("pool", "limit"), [("prefork", "soft_time_limit"), ("gevent", "time_limit")]
)
def test_a_time_limit_while_the_acquires_reply_is_in_flight_leaves_the_next_copy_free_to_run(
    broker: RedisServer,
    tmp_path: Path,
    pool: str,
    limit: str,
) -> None:
    """A real worker: the store's replies are held back (1 s past the grant) while the task's
    0.5 s limit fires in the acquire (SoftTimeLimitExceeded on prefork, gevent's Timeout on
    gevent). The server granted the lease; the exit released it, so the next copy runs at
    once instead of being skipped for the lease's 20 s TTL."""
    rig = Rig(broker, pool, tmp_path)
    tag = f"limit-{pool}"  # the journal lives on the module's broker
    try:
        with TcpProxy(rig.store.port) as proxy:
            rig.worker(LEASE_BACKEND=f"redis://127.0.0.1:{proxy.port}/0", LEASE_TTL="20")
            # The script cached and every process's connection made: copies that overlap,
            # so each child of the pool runs one (a connection made once the replies are
            # held would never send the acquire).
            warm = [
                rig.send("hold", f"warm{n}-{tag}", 0.5, "sleep") for n in range(CONCURRENCY[pool])
            ]
            assert [w.get(timeout=20) for w in warm] == [
                f"warm{n}-{tag}" for n in range(CONCURRENCY[pool])
            ]
            for counter in rig.leases.scan_iter("lease:{hold:*:fence"):
                rig.leases.delete(counter)  # the warm-ups': the wait below is for the next
            proxy.hold_replies()
            limited = rig.send("hold", tag, 0.1, "sleep", **{limit: 0.5})
            # The acquire ran on the server (the fencing counter exists); its reply is held
            # 1 s more, the limit fires meanwhile (the store timeout is 2 s).
            wait_for(lambda: list(rig.leases.scan_iter("lease:{hold:*:fence")), 20.0)
            healing = threading.Timer(1.0, proxy.heal)
            healing.start()
            with pytest.raises(Exception, match="TimeLimitExceeded"):
                limited.get(timeout=20)
            healing.join()
            assert rig.journal(tag, "start") == [], rig.logs()
            wait_for(
                lambda: rig.lease_keys() == [],
                5.0,
                message=lambda: f"left: {rig.lease_keys()}\n{rig.logs()}",
            )
            assert rig.send("hold", tag, 0.1, "sleep").get(timeout=20) == tag
            assert len(rig.journal(tag, "end")) == 1
    finally:
        rig.close()
