"""Behaviour that belongs to one pool or to worker start-up."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator

import pytest

from harness.proxy import TcpProxy
from harness.redis_server import RedisServer
from harness.waiting import wait_for
from harness.workers import CeleryWorker
from tests.support.rig import APP, Rig, measured

MakeRig = Callable[[str], Rig]


@pytest.fixture
def make_rig(
    broker: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], Rig]]:
    rigs: list[Rig] = []

    def make(pool: str) -> Rig:
        rig = Rig(broker, pool, tmp_path_factory.mktemp(pool))
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


def test_threads_pool_two_keys_at_once_each_its_own(make_rig: MakeRig) -> None:
    rig = make_rig("threads")
    rig.worker(concurrency=4)
    rig.send("hold", "k1", 3.0, "chunks")
    rig.send("hold", "k2", 1.0, "chunks")
    k1 = rig.wait_event("k1", "start")[0]
    k2 = rig.wait_event("k2", "start")[0]
    assert k1["key"] != k2["key"] and k1["pid"] == k2["pid"]
    rig.leases.delete(str(k1["key"]))
    assert rig.wait_event("k1", "lost")[0]["cause"] == "refused"
    rig.wait_event("k2", "end")
    assert rig.journal("k2", "lost") == []
    duplicate = rig.send("hold", "k3", 2.0, "chunks")
    rig.wait_event("k3", "start")
    assert rig.send("hold", "k3", 2.0, "chunks").get(timeout=10)["lease_skipped"] is True
    assert duplicate.get(timeout=10) == "k3"
    wait_for(lambda: rig.lease_keys() == [], 5)


@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_starved_green_heartbeat_check_raises_before_anything_else(
    make_rig: MakeRig, pool: str
) -> None:
    rig = make_rig(pool)
    rig.worker()
    rig.send("green_cpu", "cpu", rig.ttl + 1.0)  # spins past the lifetime without yielding
    lost = rig.wait_event("cpu", "lost")[0]
    assert lost["cause"] == "deadline"
    assert rig.journal("cpu", "end") == []


def test_black_holed_store_raises_by_the_local_deadline(make_rig: MakeRig) -> None:
    rig = make_rig("prefork")
    with TcpProxy(rig.store.port) as proxy:
        rig.worker(
            LEASE_BACKEND=f"redis://127.0.0.1:{proxy.port}/0", LEASE_STORE_DIRECT=rig.store.url()
        )
        rig.send("hold", "bh", 30.0, "sleep")
        rig.wait_event("bh", "start")
        proxy.blackhole()
        lost = rig.wait_event("bh", "lost", timeout=10)[0]
        proxy.heal()
    assert lost["cause"] == "deadline"
    late = lost["at"] - lost["deadline"]
    measured("deadline -> LeaseLost, black-holed", "prefork", late)
    assert 0 <= late < 0.25
    # The holder learned of the loss while the server still held its key: the local deadline
    # comes before the expiry on the server, so nobody else could have taken it yet.
    assert lost["server_pttl"] > 0


def test_warm_shutdown_and_soft_time_limit_release_the_lease(make_rig: MakeRig) -> None:
    rig = make_rig("prefork")
    worker = rig.worker()
    result = rig.send("hold", "warm", 1.0, "sleep")
    key = str(rig.wait_event("warm", "start")[0]["key"])
    assert rig.leases.exists(key)
    worker.send_signal(signal.SIGTERM)  # warm shutdown: the running task finishes
    assert result.get(timeout=20) == "warm"
    assert worker.wait(20) is not None
    assert not rig.leases.exists(key)
    worker = rig.worker()
    soft = rig.send("hold", "soft", 30.0, "sleep", soft_time_limit=0.5)
    key = str(rig.wait_event("soft", "start")[0]["key"])
    with pytest.raises(Exception, match="SoftTimeLimitExceeded"):
        soft.get(timeout=20)
    assert not rig.leases.exists(key)


def test_eviction_policy_is_warned_at_start_naming_the_refusing_setting_and_refused_on_request(
    make_rig: MakeRig,
) -> None:
    rig = make_rig("solo")
    rig.leases.config_set("maxmemory-policy", "allkeys-lru")
    worker = rig.worker()
    assert "maxmemory-policy allkeys-lru may evict a live lease" in worker.log_text()
    assert "noeviction" in worker.log_text()
    assert "lease_require_noeviction=True makes the worker refuse" in worker.log_text()
    refusing = CeleryWorker(
        APP,
        pool="solo",
        queue=rig.queue,
        log_dir=rig.log_dir,
        env=rig.env(LEASE_REQUIRE_NOEVICTION="1"),
    )
    refusing.start()
    code = refusing.wait(30)
    assert code not in (None, 0), refusing.log_tail()
    assert "lease_require_noeviction" in refusing.log_text()
    assert "ready." not in refusing.log_text()


def test_missing_backend_refuses_worker_start_naming_the_setting(make_rig: MakeRig) -> None:
    rig = make_rig("solo")
    worker = CeleryWorker(
        "tests.apps.no_backend_app", pool="solo", queue=rig.queue, log_dir=rig.log_dir
    )
    worker.start()
    code = worker.wait(30)
    assert code not in (None, 0), worker.log_tail()
    assert "lease_backend is not set" in worker.log_text()


@pytest.mark.parametrize("pool", ["solo", "threads", "gevent", "eventlet", "prefork"])
def test_the_acquire_goes_out_as_the_pool_accepts_the_request_where_the_task_runs_in_that_process(
    make_rig: MakeRig, pool: str
) -> None:
    """Where the pool runs the task in the process that accepts it, the store grants the lease
    before ``task_prerun`` runs (the acquire's round trip overlaps Celery's own start); in a
    prefork child it is taken when the task runs, after ``task_prerun``."""
    rig = make_rig(pool)
    rig.worker()
    assert rig.send("echo", "warm", 1).get(timeout=20) == 1  # the store has the script now
    result = rig.send("at_prerun", f"accepted-{pool}")
    assert result.get(timeout=20) == f"accepted-{pool}"
    prerun = rig.journal(f"accepted-{pool}", "prerun")[0]
    assert prerun["held_by"] == (None if pool == "prefork" else prerun["task_id"])
    assert rig.journal(f"accepted-{pool}", "start")[0]["key"] == prerun["key"]
    wait_for(lambda: rig.lease_keys() == [], 5)


@pytest.mark.parametrize("pool", ["solo", "threads", "gevent"])
def test_a_request_that_fails_before_its_task_runs_leaves_its_written_acquire_released(
    make_rig: MakeRig, pool: str
) -> None:
    """The task's ``before_start`` hook raises after the acquire was written and granted: the
    request's end releases it, so the key is free at once (not after its 30 s TTL)."""
    rig = make_rig(pool)
    rig.worker(LEASE_TTL="30")
    assert rig.send("echo", "warm", 1).get(timeout=20) == 1  # the store has the script now
    tag = f"fail-{pool}"
    failed = rig.send("at_prerun", tag)
    with pytest.raises(RuntimeError, match="before_start refused"):
        failed.get(timeout=20)
    assert rig.journal(tag, "prerun")[0]["held_by"] is not None  # it was granted
    assert rig.journal(tag, "start") == []
    wait_for(lambda: rig.lease_keys() == [], 5, message=lambda: f"{rig.lease_keys()}\n{rig.logs()}")
