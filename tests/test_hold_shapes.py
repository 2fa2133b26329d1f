"""``@hold(...)`` on every shape of callable: held for the real run of its body, two concurrent
runs never overlap, or refused with the fix."""

from __future__ import annotations

import asyncio
import functools
import gc
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from celery_lease import LeaseLost, hold
from celery_lease.base import signals
from celery_lease.base.keys import hold_key
from tests.support.threads import run_in_threads

KEY = hold_key("lease", "shape")


class Runs:
    """Counts the bodies running at once, and checks the lease is held in each."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.lock = threading.Lock()
        self.inside = self.overlaps = self.unheld = self.done = 0

    def step(self) -> None:
        with self.lock:
            self.inside += 1
            self.overlaps += self.inside > 1
        self.unheld += not self.client.exists(KEY)
        time.sleep(0.05)
        with self.lock:
            self.inside -= 1
            self.done += 1


def _shapes(url: str, runs: Runs) -> dict[str, Callable[[], Any]]:
    """One decorated callable per shape, each calling ``runs.step()`` in its body; a call
    returns what the body returns (a generator's run is consumed by ``list``)."""
    held = hold("shape", url=url, ttl=5.0, timeout=10.0)

    @held
    def function() -> None:
        runs.step()

    class Methods:
        @held
        def method(self) -> None:
            runs.step()

        @held
        @classmethod
        def klass(cls) -> None:
            runs.step()

        @held
        @staticmethod
        def static() -> None:
            runs.step()

    class Callable_:
        def __call__(self, n: int) -> None:
            for _ in range(n):
                runs.step()

    def plain(n: int) -> None:
        for _ in range(n):
            runs.step()

    @held
    def generator() -> Iterator[int]:
        for i in range(3):
            runs.step()
            yield i

    partial = held(functools.partial(plain, 2))
    obj = held(Callable_())
    return {
        "function": function,
        "method": Methods().method,
        "classmethod": Methods.klass,
        "staticmethod": Methods.static,
        "partial": partial,
        "callable object": lambda: obj(2),
        "generator": lambda: list(generator()),
    }


@pytest.mark.parametrize(
    "shape",
    [
        "function",
        "method",
        "classmethod",
        "staticmethod",
        "partial",
        "callable object",
        "generator",
    ],
)
def test_each_shape_is_held_for_its_real_run_and_two_runs_never_overlap(
    redis_url: str, shape: str
) -> None:
    runs = Runs(redis_url)
    assert run_in_threads(_shapes(redis_url, runs)[shape], 2) == []
    assert (runs.unheld, runs.overlaps) == (0, 0)
    assert runs.done >= 2
    assert not runs.client.exists(KEY)


def test_coroutine_shapes_are_held_while_awaited_and_never_overlap(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    held = hold("shape", url=redis_url, ttl=5.0, timeout=10.0)
    inside = overlaps = unheld = 0

    async def body() -> None:
        nonlocal inside, overlaps, unheld
        inside += 1
        overlaps += inside > 1
        unheld += not client.exists(KEY)
        await asyncio.sleep(0.05)
        inside -= 1

    class Service:
        @held
        async def method(self) -> None:
            await body()

        async def __call__(self) -> None:
            await body()

    function = held(body)
    partial = held(functools.partial(body))
    obj = held(Service())

    async def main() -> None:
        coroutine = function()
        assert not client.exists(KEY)  # nothing taken until it is awaited
        await asyncio.gather(
            coroutine,
            function(),
            Service().method(),
            Service().method(),
            partial(),
            partial(),
            obj(),
            obj(),
        )

    asyncio.run(main())
    assert (overlaps, unheld) == (0, 0)
    assert not client.exists(KEY)


def test_a_generator_takes_at_its_first_step_and_releases_when_closed_or_collected(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    cleaned: list[str] = []

    @hold("shape", url=redis_url, ttl=5.0)
    def numbers() -> Iterator[int]:
        try:
            yield from range(10)
        finally:
            cleaned.append("finally")

    gen = numbers()
    assert not client.exists(KEY)  # creating it ran nothing and took nothing
    assert next(gen) == 0
    assert client.exists(KEY)
    gen.close()
    assert not client.exists(KEY) and cleaned == ["finally"]

    gen = numbers()
    assert next(gen) == 0 and client.exists(KEY)
    del gen
    gc.collect()
    assert not client.exists(KEY) and cleaned == ["finally", "finally"]
    assert list(numbers()) == list(range(10)) and not client.exists(KEY)


def test_a_held_generator_passes_sent_and_thrown_values_to_its_body(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)

    @hold("shape", url=redis_url, ttl=5.0)
    def echo() -> Any:
        received = yield "ready"
        while True:
            try:
                received = yield f"got {received}"
            except ValueError as exc:
                received = f"thrown {exc}"

    gen = echo()
    assert next(gen) == "ready"
    assert gen.send(1) == "got 1"
    assert gen.throw(ValueError("x")) == "got thrown x"
    assert client.exists(KEY)
    gen.close()
    assert not client.exists(KEY)


def test_a_loss_while_a_generator_is_suspended_is_raised_in_its_body_at_the_next_step(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    lost = threading.Event()
    seen: list[str] = []

    def on_lost(sender: Any = None, **kwargs: Any) -> None:
        lost.set()

    @hold("shape", url=redis_url, ttl=0.6)
    def steps() -> Iterator[int]:
        try:
            yield 1
            yield 2
        except LeaseLost as exc:
            seen.append(f"body: {exc.cause}")
            raise

    signals.lease_lost.connect(on_lost, weak=False)
    try:
        gen = steps()
        assert next(gen) == 1
        client.delete(KEY)  # taken away while the consumer, not the body, runs
        assert lost.wait(5)  # found by a renewal; the consumer's own code went on
        for _ in range(30):  # the consumer's own code goes on: the loss must not land here
            time.sleep(0.01)
        with pytest.raises(LeaseLost):
            next(gen)
    finally:
        signals.lease_lost.disconnect(on_lost)
    assert seen == ["body: refused"]


def test_an_async_generator_function_is_refused_naming_the_fix(redis_url: str) -> None:
    async def ticks() -> Any:
        yield 1

    with pytest.raises(TypeError, match=r"async with celery_lease.hold_async\('shape'\)"):
        hold("shape", url=redis_url)(ticks)


def test_a_call_that_returns_an_unstarted_coroutine_is_refused_and_released(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)

    async def work() -> int:
        return 1

    @hold("shape", url=redis_url)
    def wrapper() -> Any:
        return work()  # a plain function: its coroutine would run after the call

    with pytest.raises(TypeError, match="decorate the coroutine or generator function itself"):
        wrapper()
    assert not client.exists(KEY)
