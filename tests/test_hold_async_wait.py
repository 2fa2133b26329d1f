"""``hold_async`` waiting on the event loop, and cancelled while taking, waiting or ending."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from celery_lease import hold, hold_async
from celery_lease.base import signals
from celery_lease.base.keys import hold_key
from celery_lease.core.heartbeat import heartbeat
from tests.support.rig import measured

WAITERS = 100


def _blocked(client: redis.Redis) -> int:
    return int(client.info("clients")["blocked_clients"])


async def _until(predicate: Callable[[], object], timeout: float) -> bool:
    """Poll ``predicate`` on the loop (not in a thread) until true or ``timeout`` s pass."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def _run(main: Callable[[], Awaitable[Any]], threads: int = 6) -> Any:
    """``asyncio.run(main())`` with a default executor of ``threads`` threads (2 cores' 6)."""

    async def with_executor() -> Any:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(threads))
        return await main()

    return asyncio.run(with_executor())


def test_a_hundred_waiters_hold_no_executor_thread_and_are_handed_the_lease_in_turn(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    fences: list[int] = []
    inside = overlaps = 0
    probe_worst = 0.0

    async def waiter() -> None:
        nonlocal inside, overlaps
        async with hold_async("crowd", url=redis_url, ttl=10.0, timeout=120.0) as lease:
            inside += 1
            overlaps += inside > 1
            fences.append(lease.fencing_token)
            await asyncio.sleep(0.001)
            inside -= 1

    async def probe(stop: asyncio.Event) -> None:
        """The program's own executor work, while the waiters wait and take turns."""
        nonlocal probe_worst
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            started = time.perf_counter()
            await loop.run_in_executor(None, time.perf_counter)
            probe_worst = max(probe_worst, time.perf_counter() - started)
            await asyncio.sleep(0.01)

    async def main() -> float:
        stop = asyncio.Event()
        async with hold_async("crowd", url=redis_url, ttl=10.0):
            waiters = [asyncio.ensure_future(waiter()) for _ in range(WAITERS)]
            assert await _until(lambda: _blocked(client) == WAITERS, 30.0), _blocked(client)
            probing = asyncio.ensure_future(probe(stop))
            await asyncio.sleep(0.2)  # the probe runs while all hundred wait
            released = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*waiters), 120.0)
        stop.set()
        await probing
        return time.perf_counter() - released

    handoffs = _run(main)
    assert overlaps == 0
    assert len(fences) == WAITERS
    assert all(a < b for a, b in itertools.pairwise(fences))
    # Each turn is one wake-up and one take (no waiting for an expiry or a free thread).
    assert handoffs < WAITERS * 0.1, handoffs
    assert probe_worst < 1.0, probe_worst
    measured("hold_async handoff, 100 waiters (mean)", "asyncio", handoffs / WAITERS)
    measured("run_in_executor beside 100 waiters (max)", "asyncio", probe_worst)


def test_hand_offs_go_on_while_the_programs_own_work_fills_the_default_executor(
    redis_url: str,
) -> None:
    busy = threading.Event()
    entered: list[int] = []

    async def waiter() -> None:
        async with hold_async("busy", url=redis_url, ttl=10.0, timeout=60.0) as lease:
            entered.append(lease.fencing_token)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        occupied = loop.run_in_executor(None, busy.wait, 30)  # the program's one thread, taken
        async with hold_async("busy", url=redis_url, ttl=10.0):
            waiters = [asyncio.ensure_future(waiter()) for _ in range(10)]
            await asyncio.sleep(0.1)
        await asyncio.wait_for(asyncio.gather(*waiters), 20.0)
        busy.set()
        await occupied

    try:
        _run(main, threads=1)
    finally:
        busy.set()
    assert len(entered) == 10


@contextlib.contextmanager
def _held_up(signal: Any) -> Iterator[tuple[threading.Event, threading.Event]]:
    """A receiver of ``signal`` that holds up the executor thread sending it: ``entered`` is set
    when it runs, and it returns once ``go`` is set."""
    entered, go = threading.Event(), threading.Event()

    def receiver(sender: Any = None, **kwargs: Any) -> None:
        entered.set()
        go.wait(10)

    signal.connect(receiver, weak=False)
    try:
        yield entered, go
    finally:
        go.set()
        signal.disconnect(receiver)


@contextlib.contextmanager
def _releases() -> Iterator[list[bool | None]]:
    """The ``released`` of every ``lease_released`` sent meanwhile."""
    seen: list[bool | None] = []

    def receiver(sender: Any = None, released: bool | None = None, **kwargs: Any) -> None:
        seen.append(released)

    signals.lease_released.connect(receiver, weak=False)
    try:
        yield seen
    finally:
        signals.lease_released.disconnect(receiver)


def test_cancelled_while_taking_releases_the_granted_lease_before_raising(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    key = hold_key("lease", "taking")

    async def body() -> None:
        async with hold_async("taking", url=redis_url, ttl=30.0):
            pytest.fail("the body ran in a cancelled task")

    async def main() -> tuple[bool, int]:
        with _releases() as released, _held_up(signals.lease_acquired) as (entered, go):
            task = asyncio.ensure_future(body())
            assert await _until(entered.is_set, 10.0)  # granted; the take has not returned
            task.cancel()
            await asyncio.wait([task], timeout=0.2)
            done_before_take = task.done()
            go.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert released == [True]  # by its token, before the cancellation went on
            return done_before_take, int(client.exists(key))

    assert _run(main) == (False, 0)


def test_cancelled_while_waiting_ends_its_blpop_at_once_and_takes_nothing(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    key = hold_key("lease", "waiting")

    async def main() -> None:
        async with hold_async("waiting", url=redis_url, ttl=30.0) as lease:
            task = asyncio.ensure_future(
                hold_async("waiting", url=redis_url, on_conflict="wait").__aenter__()
            )
            assert await _until(lambda: _blocked(client) == 1, 10.0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 1.0)  # not the 5 s of one BLPOP chunk
            assert await _until(lambda: _blocked(client) == 0, 1.0)  # its connection closed
            assert client.get(key).startswith(lease.token.encode())

    _run(main)


def test_a_waiter_cancelled_in_its_wait_wakes_the_next_when_the_key_is_free(redis_url: str) -> None:
    """The cancelled waiter may have taken a release's wake-up unread: it passes it on."""
    client = redis.Redis.from_url(redis_url)
    dead = hold("turn", url=redis_url, ttl=30.0)
    assert dead.acquire()
    assert dead.lease is not None
    heartbeat().remove(dead.lease)  # as if its process died: never renewed, never released
    dead.lease.target.finish()

    async def second() -> float:
        async with hold_async("turn", url=redis_url, timeout=20.0):
            return time.perf_counter()

    async def main() -> float:
        first = asyncio.ensure_future(
            hold_async("turn", url=redis_url, on_conflict="wait").__aenter__()
        )
        other = asyncio.ensure_future(second())
        assert await _until(lambda: _blocked(client) == 2, 10.0)
        client.delete(hold_key("lease", "turn"))  # freed, and nobody was woken
        cancelled_at = time.perf_counter()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        return await other - cancelled_at

    assert _run(main) < 1.0  # now, not at the end of its own BLPOP 5 s away


def test_a_waiter_cancelled_in_its_wait_wakes_the_next_when_a_slot_is_free(redis_url: str) -> None:
    """With ``limit``, a slot's release wakes one waiter while the other slots stay held: a
    cancelled waiter that took that wake-up unread passes it on as long as a slot is free."""
    client = redis.Redis.from_url(redis_url)
    key = hold_key("lease", "slot-turn")
    live = hold("slot-turn", url=redis_url, ttl=30.0, limit=2)
    dead = hold("slot-turn", url=redis_url, ttl=30.0, limit=2)
    assert live.acquire() and dead.acquire()
    assert dead.lease is not None
    heartbeat().remove(dead.lease)  # as if its process died: never renewed, never released
    dead.lease.target.finish()

    async def second() -> float:
        async with hold_async("slot-turn", url=redis_url, timeout=20.0, limit=2):
            return time.perf_counter()

    async def main() -> float:
        first = asyncio.ensure_future(
            hold_async("slot-turn", url=redis_url, on_conflict="wait", limit=2).__aenter__()
        )
        other = asyncio.ensure_future(second())
        assert await _until(lambda: _blocked(client) == 2, 10.0)
        client.hdel(key, dead.lease.token)  # a slot freed, nobody woken; the other stays held
        cancelled_at = time.perf_counter()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        return await other - cancelled_at

    try:
        assert _run(main) < 1.0  # now, not at the end of its own BLPOP 5 s away
    finally:
        live.release()


def test_cancelled_while_ending_finishes_the_release_before_raising(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    key = hold_key("lease", "ending")
    order: list[str] = []

    async def body() -> None:
        try:
            async with hold_async("ending", url=redis_url, ttl=30.0):
                pass
        except asyncio.CancelledError:
            order.append("cancelled")
            raise

    async def main() -> None:
        with _held_up(signals.lease_released) as (entered, go):
            task = asyncio.ensure_future(body())
            assert await _until(entered.is_set, 10.0)  # the release is under way
            task.cancel()
            await asyncio.wait([task], timeout=0.2)
            order.append("release returns")
            go.set()
            with pytest.raises(asyncio.CancelledError):
                await task

    _run(main)
    assert order == ["release returns", "cancelled"]
    assert not client.exists(key)


def test_a_sync_hold_release_wakes_an_async_waiter(redis_url: str) -> None:
    """Threads and asyncio code share a key: the sync release wakes the async BLPOP."""
    client = redis.Redis.from_url(redis_url)
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with hold("shared", url=redis_url, ttl=30.0):
            holding.set()
            release.wait(10)

    async def main() -> float:
        async with hold_async("shared", url=redis_url, timeout=20.0):
            return time.perf_counter() - released_at

    t = threading.Thread(target=holder)
    t.start()
    assert holding.wait(10)

    async def waiting() -> float:
        nonlocal released_at
        task = asyncio.ensure_future(main())
        assert await _until(lambda: _blocked(client) == 1, 10.0)
        released_at = time.perf_counter()
        release.set()
        return await task

    released_at = 0.0
    woken = _run(waiting)
    t.join(10)
    assert woken < 1.0  # by the release, not at the holder's expiry 30 s away
