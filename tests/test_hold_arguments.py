"""``hold()``'s ``on_conflict``, ``blocking`` and ``timeout``: each argument does what it says
in every combination given, or the combination is refused naming the fix."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from collections.abc import Iterator

import pytest

from celery_lease import LeaseConfigError, LeaseConflict, hold, hold_async


@pytest.fixture
def held_for_a_moment(redis_url: str) -> Iterator[threading.Event]:
    """Another thread holds ``"invoice:3"`` until the test sets the event it yields (and at
    most 10 s); the test then waits for its release."""
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with hold("invoice:3", url=redis_url, ttl=30.0):
            holding.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert holding.wait(10)
    yield release
    release.set()
    t.join(10)


def _release_soon(release: threading.Event) -> None:
    threading.Timer(0.2, release.set).start()


@pytest.mark.parametrize(
    "waiting",
    [
        {"timeout": 4.0},
        {"blocking": True},
        {"on_conflict": "wait"},
        {"blocking": True, "timeout": 4.0},
        {"on_conflict": "wait", "timeout": 4.0},
    ],
)
def test_timeout_or_blocking_true_waits_for_the_release(
    redis_url: str, held_for_a_moment: threading.Event, waiting: dict
) -> None:
    started = time.monotonic()
    _release_soon(held_for_a_moment)
    with hold("invoice:3", url=redis_url, ttl=5.0, **waiting) as lease:
        assert lease.fencing_token > 0
    assert 0.2 <= time.monotonic() - started < 4.0


@pytest.mark.parametrize(
    "at_once",
    [
        {},
        {"blocking": False},
        {"on_conflict": "raise"},
        {"on_conflict": "raise", "blocking": False},
    ],
)
def test_nothing_or_blocking_false_answers_at_once(
    redis_url: str, held_for_a_moment: threading.Event, at_once: dict
) -> None:
    started = time.monotonic()
    with pytest.raises(LeaseConflict):
        with hold("invoice:3", url=redis_url, **at_once):
            pytest.fail("entered a held block")
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize(
    ("given", "fix"),
    [
        ({"on_conflict": "raise", "timeout": 4.0}, "timeout=4.0 would do nothing. Fix: to wait"),
        (
            {"on_conflict": "raise", "blocking": True},
            "blocking=True would do nothing. Fix: to wait",
        ),
        ({"blocking": False, "timeout": 4.0}, "timeout=4.0 would do nothing.*Fix: drop one"),
        ({"on_conflict": "queue"}, "on_conflict='queue'.*not one of 'raise', 'wait'"),
        ({"timeout": -1.0}, "timeout=-1.0.*must be None"),
    ],
)
def test_a_combination_in_which_an_argument_would_do_nothing_is_refused(
    given: dict, fix: str
) -> None:
    with pytest.raises(LeaseConfigError, match=fix):
        hold("invoice:3", url="redis://localhost:1/0", **given)
    with pytest.raises(LeaseConfigError, match=fix):
        hold_async("invoice:3", url="redis://localhost:1/0", **given)


def test_acquire_reads_like_a_lock(redis_url: str, held_for_a_moment: threading.Event) -> None:
    lock = hold("invoice:3", url=redis_url)  # answers at once by itself
    assert lock.acquire() is False
    assert lock.acquire(blocking=False) is False
    with pytest.raises(LeaseConfigError, match="blocking=False answers at once"):
        lock.acquire(blocking=False, timeout=1.0)
    started = time.monotonic()
    assert lock.acquire(timeout=0.2) is False  # waited, then gave up
    assert time.monotonic() - started >= 0.2
    _release_soon(held_for_a_moment)
    assert lock.acquire(blocking=True) is True
    assert lock.release() is True


def test_the_old_wait_with_blocking_false_spelling_still_answers_at_once_with_a_warning(
    redis_url: str, held_for_a_moment: threading.Event
) -> None:
    with pytest.warns(DeprecationWarning, match="will be refused in a later release") as seen:
        old = hold("invoice:3", url=redis_url, on_conflict="wait", blocking=False)
    with pytest.warns(DeprecationWarning) as seen_async:
        hold_async("invoice:3", url=redis_url, on_conflict="wait", blocking=False)
    assert {seen[0].filename, seen_async[0].filename} == {__file__}  # points at the caller
    assert old.acquire() is False

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the copies re-read the resolved options: no warning

        @old
        def decorated() -> None:
            pass

        with pytest.raises(LeaseConflict):
            decorated()  # at once, as the old spelling did


def test_hold_async_timeout_waits_for_the_release(
    redis_url: str, held_for_a_moment: threading.Event
) -> None:
    async def main() -> int:
        async with hold_async("invoice:3", url=redis_url, timeout=4.0) as lease:
            return lease.fencing_token

    _release_soon(held_for_a_moment)
    assert asyncio.run(main()) > 0
