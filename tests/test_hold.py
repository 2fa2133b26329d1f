"""``celery_lease.hold()`` and ``hold_async()`` in one process, against a real Redis."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_lease import (
    LeaseConfigError,
    LeaseConflict,
    LeaseKeyError,
    LeaseLost,
    hold,
    hold_async,
    hold_name,
)
from celery_lease.base.keys import hold_key
from celery_lease.core.heartbeat import heartbeat
from celery_lease.holds.plain import HOLD_TASK_NAME
from celery_lease.ops.inspection import read_lease, scan_leases
from harness.topologies import cluster_setup
from tests.support.rig import measured
from tests.support.threads import run_in_threads
from tests.support.workers import BROKER_URL_ENV, RESULT_BACKEND_ENV

ROOT = Path(__file__).resolve().parent.parent


def test_hold_is_visible_with_its_holder_and_released_at_exit(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    with hold("invoice:42", url=redis_url, ttl=5.0) as lease:
        assert lease.key == "lease:{hold:invoice:42}"
        info = read_lease(client, lease.key)
        assert info is not None
        assert (info.task, info.task_id, info.fencing_token) == (
            HOLD_TASK_NAME,
            threading.current_thread().name,
            lease.fencing_token,
        )
        assert [i.key for i in scan_leases(client, "lease")] == [lease.key]
    assert read_lease(client, lease.key) is None
    assert not lease.lost


def test_conflict_raises_with_the_holder_and_its_time_left(redis_url: str) -> None:
    with hold("report", url=redis_url, ttl=5.0):
        with pytest.raises(LeaseConflict) as caught:
            with hold("report", url=redis_url):
                pytest.fail("entered a held block")
        assert caught.value.holder_task_id == threading.current_thread().name
        assert 4.0 < caught.value.remaining <= 5.0


def test_blocking_false_answers_at_once_even_when_told_to_wait(redis_url: str) -> None:
    with hold("quick", url=redis_url, ttl=5.0):
        with pytest.warns(DeprecationWarning, match="pass blocking=False alone"):
            other = hold("quick", url=redis_url, on_conflict="wait", blocking=False)
        started = time.monotonic()
        assert other.acquire() is False
        assert time.monotonic() - started < 1.0
    assert other.acquire() is True
    assert other.release() is True


def test_wait_gives_up_after_timeout_with_a_conflict(redis_url: str) -> None:
    with hold("slow", url=redis_url, ttl=10.0):
        started = time.monotonic()
        with pytest.raises(LeaseConflict):
            with hold("slow", url=redis_url, on_conflict="wait", timeout=0.3):
                pytest.fail("entered a held block")
        assert 0.3 <= time.monotonic() - started < 2.0


def test_waiter_takes_over_when_the_holder_dies_without_releasing(redis_url: str) -> None:
    first = hold("crashy", url=redis_url, ttl=0.6)
    assert first.acquire()
    lease = first.lease
    assert lease is not None
    heartbeat().remove(lease)  # as if its process died: never renewed, never released
    lease.target.finish()
    started = time.monotonic()
    with hold("crashy", url=redis_url, on_conflict="wait", timeout=5.0) as second:
        assert second.fencing_token > lease.fencing_token
    assert time.monotonic() - started < 0.6 + 1.0


def test_decorator_keeps_the_signature_and_holds_per_call(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)

    @hold("decorated", url=redis_url)
    def add(x: int, y: int = 2) -> int:
        """Add two numbers."""
        assert client.exists(hold_key("lease", "decorated"))
        return x + y

    assert add(1) == 3
    assert add.__name__ == "add"
    assert add.__doc__ == "Add two numbers."
    assert str(inspect.signature(add)) == "(x: 'int', y: 'int' = 2) -> 'int'"
    assert not client.exists(hold_key("lease", "decorated"))

    @hold("decorated-async", url=redis_url)
    async def double(x: int) -> int:
        assert client.exists(hold_key("lease", "decorated-async"))
        return 2 * x

    assert inspect.iscoroutinefunction(double)
    assert asyncio.run(double(4)) == 8


def test_no_redis_url_is_a_config_error_naming_the_fix() -> None:
    app = Celery("no-redis", broker="amqp://guest@localhost//", set_as_current=False)
    with pytest.raises(LeaseConfigError, match=r"pass url='redis://"):
        with hold("x", app=app):
            pytest.fail("entered without a store")


def test_decorator_reads_the_app_settings_at_the_first_call(redis_url: str) -> None:
    app = Celery("late", set_as_current=False)

    @hold("late-configured", app=app)
    def job() -> bool:
        return True

    app.conf.lease_backend = redis_url  # configured after the decorator ran
    assert job() is True


def test_store_comes_from_the_current_app_settings(redis_url: str) -> None:
    app = Celery("current", set_as_current=True)
    app.conf.lease_backend = redis_url
    app.conf.lease_ttl = 7.0
    with hold("from-app") as lease:
        assert lease.ttl == 7.0
        assert redis.Redis.from_url(redis_url).exists(lease.key)


@pytest.mark.parametrize("name", ["a{b", "a}b", "tab\there", "", "nul\x00"])
def test_names_with_braces_or_control_characters_are_refused(redis_url: str, name: str) -> None:
    with pytest.raises(LeaseKeyError, match="hold name"):
        hold(name, url=redis_url)


def test_hold_name_encodes_values_by_type_and_order_of_keywords() -> None:
    assert hold_name("inv", 1) != hold_name("inv", "1") != hold_name("inv", True)
    assert hold_name("inv", 1) != hold_name("inv", 1.0)
    assert hold_name("inv", (1, 2)) == hold_name("inv", [1, 2])
    assert hold_name("inv", a=1, b=2) == hold_name("inv", b=2, a=1)
    assert hold_name("inv", {3, 1, 2}).startswith("inv:")
    with pytest.raises(LeaseKeyError, match=r"hold_name\('inv'\): value 1 of type object"):
        hold_name("inv", 1, object())


def test_hold_inside_a_task_records_the_task_as_holder(redis_url: str) -> None:
    app = Celery("in-task", set_as_current=False)
    app.conf.update(lease_backend=redis_url, task_always_eager=True)
    client = redis.Redis.from_url(redis_url)

    @app.task(shared=False, name="proj.close_day")
    def close_day() -> tuple[str, str]:
        with hold("day", app=app) as lease:
            info = read_lease(client, lease.key)
            assert info is not None
            return info.task, info.task_id

    result = close_day.apply(task_id="t-1")
    assert result.get() == ("proj.close_day", "t-1")


def test_nested_and_threaded_holds_share_the_heartbeat_round_trip(redis_url: str) -> None:
    beat = heartbeat()
    stop = threading.Event()
    entered = threading.Barrier(5)

    def hold_in_thread(i: int) -> None:
        with hold(f"shared-{i}", url=redis_url, ttl=0.9):
            entered.wait(5)
            stop.wait(5)

    threads = [threading.Thread(target=hold_in_thread, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    with hold("outer", url=redis_url, ttl=0.9), hold("inner", url=redis_url, ttl=0.9):
        entered.wait(5)
        before = beat.passes
        time.sleep(1.2)  # four renewal intervals of 0.3 s
        passes = beat.passes - before
    stop.set()
    for t in threads:
        t.join(5)
    # Six leases renewed every 0.3 s: one round trip per interval for all, not six.
    assert 2 <= passes <= 6


def test_waiting_holds_are_woken_by_the_release_within_milliseconds(redis_url: str) -> None:
    """The release wakes the waiter (TTL 30 s: the expiry fallback would take seconds)."""
    delays: list[float] = []

    def holder(holding: threading.Event, released_at: list[float]) -> None:
        with hold("handoff", url=redis_url, ttl=30.0):
            holding.set()
            time.sleep(0.02)  # let the waiter reach its BLPOP (if not, it finds the key free)
            released_at.append(time.perf_counter())

    for _ in range(40):
        holding, released_at = threading.Event(), []
        t = threading.Thread(target=holder, args=(holding, released_at))
        t.start()
        holding.wait(5)
        with hold("handoff", url=redis_url, ttl=30.0, on_conflict="wait", timeout=10.0):
            delays.append(time.perf_counter() - released_at[0])
        t.join(5)
    median, worst = statistics.median(delays), max(delays)
    measured("hold wake after release (median)", "threads", median)
    measured("hold wake after release (max)", "threads", worst)
    assert worst < 1.0, delays  # never the fallback (at the holder's expiry, 30 s away)


def test_many_threads_contending_never_hold_at_once(redis_url: str) -> None:
    inside = 0
    overlaps = 0
    fences: list[int] = []
    lock = threading.Lock()
    deadline = time.monotonic() + 2.0

    def contend() -> None:
        nonlocal inside, overlaps
        while time.monotonic() < deadline:
            with hold(
                "contended", url=redis_url, ttl=2.0, on_conflict="wait", timeout=10.0
            ) as lease:
                with lock:
                    inside += 1
                    overlaps += inside > 1
                    fences.append(lease.fencing_token)
                time.sleep(0.001)
                with lock:
                    inside -= 1

    assert run_in_threads(contend, 16) == []
    assert overlaps == 0
    assert len(fences) > 50
    assert all(a < b for a, b in itertools.pairwise(fences))
    measured("hold handoffs in 2 s, 16 threads", "threads", float(len(fences)), unit="")


def test_hold_async_loss_surfaces_as_lease_lost_and_external_cancel_stays(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)

    async def lost() -> str:
        try:
            async with hold_async("async-lost", url=redis_url, ttl=0.6) as lease:
                client.delete(lease.key)
                await asyncio.sleep(5)
        except LeaseLost as exc:
            return exc.cause
        return "not lost"

    async def cancelled() -> bool:
        async def body() -> None:
            async with hold_async("async-cancel", url=redis_url, ttl=0.6):
                await asyncio.sleep(5)

        task = asyncio.ensure_future(body())
        await asyncio.sleep(0.2)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return not client.exists(hold_key("lease", "async-cancel"))
        return False

    assert asyncio.run(lost()) == "refused"
    assert asyncio.run(cancelled()) is True


def test_hold_async_conflict_and_wait(redis_url: str) -> None:
    async def main() -> tuple[bool, int, int]:
        async with hold_async("async-wait", url=redis_url, ttl=5.0) as first:
            try:
                async with hold_async("async-wait", url=redis_url):
                    pass
                conflict = False
            except LeaseConflict:
                conflict = True
            waiter = asyncio.ensure_future(_take_when_free(redis_url))
            await asyncio.sleep(0.1)
        return conflict, first.fencing_token, await waiter

    conflict, first, second = asyncio.run(main())
    assert conflict and second > first


async def _take_when_free(url: str) -> Any:
    async with hold_async("async-wait", url=url, on_conflict="wait", timeout=5.0) as lease:
        return lease.fencing_token


def test_celery_lease_ls_lists_a_hold_with_its_holder(redis_url: str) -> None:
    env = {
        **os.environ,
        BROKER_URL_ENV: redis_url,
        RESULT_BACKEND_ENV: redis_url,
        "PYTHONPATH": str(ROOT),
    }
    with hold("listed", url=redis_url, ttl=30.0) as lease:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.apps.lease_tasks_app",
                "lease",
                "ls",
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            cwd=ROOT,
        )
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert [(e["key"], e["task"], e["fencing_token"]) for e in listed] == [
        (lease.key, HOLD_TASK_NAME, lease.fencing_token)
    ]


def test_hold_async_external_cancel_at_the_moment_of_loss_stays_a_cancellation(
    redis_url: str,
) -> None:
    async def main() -> str:
        try:
            async with hold_async("async-both", url=redis_url, ttl=5.0) as lease:
                task = asyncio.current_task()
                assert task is not None
                task.cancel()  # someone cancels the task...
                lease.mark_lost("refused")  # ...as the heartbeat delivers a loss
                await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "cancelled"
        except LeaseLost:
            return "lost"
        return "neither"

    assert asyncio.run(main()) == "cancelled"


def test_waiting_hold_is_woken_on_a_redis_cluster() -> None:
    """The lease, its fencing counter and its wake list share one hash tag (one slot)."""
    with cluster_setup() as setup:
        app = Celery("on-cluster", set_as_current=False)
        app.conf.update(
            lease_backend=f"redis://127.0.0.1:{setup.live()[0].port}/0",
            lease_backend_options={"cluster": True},
        )
        holding, release, released_at = threading.Event(), threading.Event(), []

        def holder() -> None:
            with hold("clustered", app=app, ttl=30.0):
                holding.set()
                release.wait(10)
                released_at.append(time.perf_counter())

        t = threading.Thread(target=holder)
        t.start()
        assert holding.wait(10)
        waiter = hold("clustered", app=app, on_conflict="wait", timeout=20.0)
        assert waiter.acquire(blocking=False) is False
        release.set()
        assert waiter.acquire()
        woken = time.perf_counter() - released_at[0]
        assert waiter.release() is True
        t.join(10)
    assert woken < 1.0  # by the release, not at the holder's expiry 30 s away
