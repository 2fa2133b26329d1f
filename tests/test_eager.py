"""Eager mode runs a leased task like a worker does: a successor the holder publishes (a
self-requeue, a replacement, a retry, the next link of a chain) runs after the holder's body
has ended and released its lease, in the same order, with the same result, and no lease left.

Each case runs on a real worker and in eager mode and the two records are compared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import chain

from celery_lease import is_skipped, store
from harness.waiting import wait_for
from tests.apps import successor_app
from tests.apps.successor_app import replaced, requeue, retried, runs, waiting
from tests.support.fixtures import WorkerFactory

APP = "tests.apps.successor_app"


@pytest.fixture
def eager(redis_url: str) -> Iterator[None]:
    # Celery's default task_eager_propagates=False: with True, Celery raises an eager retry
    # (of any task) out of apply() instead of running it.
    successor_app.configure(redis_url, task_always_eager=True, task_eager_propagates=False)
    yield
    successor_app.app.conf.update(task_always_eager=False, task_eager_propagates=False)


def _steps(tag: str) -> list[tuple[str, int]]:
    return [(r["what"], r["step"]) for r in runs(tag)]


def _lease_keys(url: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    return [k for k in client.scan_iter("lease:*") if not k.endswith((b":fence", b":last-run"))]


def _one_after_another(tag: str, count: int) -> None:
    steps = _steps(tag)
    assert steps == [(what, n) for n in range(count) for what in ("start", "end")]
    fences = [r["fence"] for r in runs(tag) if r["what"] == "start"]
    assert all(f is not None for f in fences)  # every step held the lease
    assert fences == sorted(set(fences))  # each its own grant, in order


CASES: dict[str, tuple[Callable[[str], Any], Any, int]] = {
    # name: (call, expected result of the first call, steps run)
    "requeue": (lambda tag: requeue.delay(tag, 0, 3), 0, 4),
    "replace": (lambda tag: replaced.delay(tag, 0, 2), "done at 2", 3),
    "retry": (lambda tag: retried.delay(tag, 3), 2, 3),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_successor_of_the_holder_runs_after_it_in_eager_mode_as_on_a_worker(
    case: str,
    redis_url: str,
    eager: None,
    worker_factory: WorkerFactory,
) -> None:
    call, expected, count = CASES[case]
    assert call(f"eager-{case}").get(timeout=10) == expected
    _one_after_another(f"eager-{case}", count)
    assert _lease_keys(redis_url) == []

    successor_app.app.conf.task_always_eager = False
    successor_app.app.conf.task_default_queue = worker_factory.queue
    worker_factory(APP, pool="threads", concurrency=2)
    first = call(f"worker-{case}")
    assert first.get(timeout=30) == expected
    wait_for(
        lambda: len(_steps(f"worker-{case}")) == 2 * count,
        30,
        message=lambda: str(_steps(f"worker-{case}")),
    )
    _one_after_another(f"worker-{case}", count)
    wait_for(lambda: _lease_keys(redis_url) == [], 10, message="a lease was left behind")


def test_with_apply_a_replacement_and_a_retry_run_after_the_holder(
    redis_url: str,
    eager: None,
) -> None:
    successor_app.app.conf.task_always_eager = False  # apply() alone is eager too
    assert replaced.apply(("apply-replace", 0, 2)).get() == "done at 2"
    _one_after_another("apply-replace", 3)
    assert retried.apply(("apply-retry", 2)).get() == 1
    _one_after_another("apply-retry", 2)
    assert _lease_keys(redis_url) == []


def test_a_chain_of_the_same_key_runs_each_link_in_turn_in_eager_mode(
    redis_url: str,
    eager: None,
) -> None:
    result = chain(
        requeue.si("chain", 0, 0), requeue.si("chain", 1, 1), requeue.si("chain", 2, 2)
    ).delay()
    assert result.get() == 2 and not is_skipped(result.get())
    _one_after_another("chain", 3)
    assert _lease_keys(redis_url) == []


def test_a_self_requeue_a_thousand_deep_needs_no_deep_stack(redis_url: str, eager: None) -> None:
    assert requeue.delay("deep", 0, 999).get() == 0
    assert len(runs("deep")) == 2000
    assert _lease_keys(redis_url) == []


def test_a_conflict_retried_in_eager_mode_waits_for_the_holder_and_uses_no_retry(
    redis_url: str,
    eager: None,
) -> None:
    """The call waits in its thread until the holder is gone (a worker's copy waits in the
    key's line), then runs: no retry is used up, as on a worker."""
    key = waiting.lease_key_for(("held-elsewhere",))
    client = store.client_for(redis_url, 1.0)
    assert store.acquire(
        client, key, "f" * 32, 600, store.holder_json("succ.retry", "other-id", "elsewhere", 1)
    ).granted
    assert waiting.apply(("held-elsewhere",)).get() == 0  # request.retries: none used up
    assert _steps("held-elsewhere") == [("start", 0), ("end", 0)]
