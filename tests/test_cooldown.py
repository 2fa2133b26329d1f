"""``lease_cooldown``: after a successful execution the key stays taken for the cooldown, on
the store's clock; a copy that starts meanwhile meets the task's conflict policy. Run by real
workers, by ``apply()`` and in eager mode, and seen and ended from ``celery lease``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_lease import is_skipped
from tests.apps import cooldown_app
from tests.apps.cooldown_app import LONG, SHORT, any_ending, once, requeue, retried, runs
from tests.support.fixtures import BROKERS, WorkerFactory
from tests.support.workers import BROKER_URL_ENV, QUEUE_ENV, REPO_ROOT, RESULT_BACKEND_ENV

APP = "tests.apps.cooldown_app"


def _tag() -> str:
    return uuid.uuid4().hex[:10]


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        BROKER_URL_ENV: url,
        RESULT_BACKEND_ENV: url,
        QUEUE_ENV: "unused",
        "PYTHONPATH": str(REPO_ROOT),
    }
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "lease", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=REPO_ROOT,
    )


@pytest.fixture
def client_app(redis_url: str, worker_factory: WorkerFactory) -> Iterator[Any]:
    """The app pointed at the test's store and the worker's queue, for publishing."""
    cooldown_app.configure(
        redis_url, task_default_queue=worker_factory.queue, broker_url=worker_factory.broker_url
    )
    yield cooldown_app.app
    cooldown_app.app.conf.task_default_queue = "celery"


def test_a_copy_within_the_cooldown_is_skipped_with_its_end_listed_and_released_early(
    redis_url: str, worker_factory: WorkerFactory, client_app: Any
) -> None:
    worker_factory(APP, env={})
    tag = _tag()
    assert once.delay(tag).get(timeout=30) == "ran"
    marker = once.delay(tag).get(timeout=30)
    assert is_skipped(marker)
    first = runs(tag)[0]
    # The record is written at the release, after the run started: LONG past the start, and
    # not much more (the end of a tiny body). The start is this host's clock in microseconds,
    # the end the store's in milliseconds: a tiny body can end within the same millisecond.
    assert first["at"] + LONG - 0.002 < marker["cooldown_until"] < first["at"] + LONG + 10
    assert len(runs(tag)) == 1

    listed = _cli(redis_url, "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    [info] = [i for i in json.loads(listed.stdout) if i["task"] == "cool.once"]
    assert info["cooldown_until"] == marker["cooldown_until"]
    assert 0 < info["ttl"] <= LONG
    table = _cli(redis_url, "ls")
    assert "cool.once (cooldown)" in table.stdout

    ended = _cli(redis_url, "release", info["key"], "--yes")
    assert ended.returncode == 0, ended.stdout + ended.stderr
    assert "a cooldown after task cool.once" in ended.stdout
    assert once.delay(tag).get(timeout=30) == "ran"
    again = runs(tag)
    assert len(again) == 2 and again[1]["fence"] > again[0]["fence"]


def test_a_failure_leaves_no_cooldown_unless_lease_cooldown_after_is_any(
    worker_factory: WorkerFactory, client_app: Any
) -> None:
    worker_factory(APP, env={})
    tag = _tag()
    with pytest.raises(RuntimeError):
        once.delay(tag, fail=True).get(timeout=30)
    assert once.delay(tag).get(timeout=30) == "ran"  # at once: the failure left no cooldown
    with pytest.raises(RuntimeError):
        any_ending.delay(f"any-{tag}", fail=True).get(timeout=30)
    assert is_skipped(any_ending.delay(f"any-{tag}").get(timeout=30))
    assert len(runs(tag)) == 2 and len(runs(f"any-{tag}")) == 1


@pytest.mark.parametrize("broker_url", BROKERS, indirect=True)
def test_a_copy_retried_from_the_cooldown_starts_only_once_it_is_over_on_the_stores_clock(
    worker_factory: WorkerFactory, client_app: Any
) -> None:
    worker_factory(APP, pool="threads", concurrency=2, env={})
    tag = _tag()
    assert retried.delay(tag).get(timeout=30) == "ran"
    assert retried.delay(tag).get(timeout=30) == "ran"  # retried until the window is over
    first, second = runs(tag)
    assert second["at"] >= first["at"] + SHORT
    assert second["fence"] > first["fence"]


@pytest.fixture
def in_process(redis_url: str) -> Iterator[None]:
    cooldown_app.configure(redis_url)
    yield
    cooldown_app.app.conf.task_always_eager = False


@pytest.mark.parametrize("mode", ["apply", "eager"])
def test_apply_and_eager_mode_keep_the_cooldown_like_a_worker(
    mode: str, redis_url: str, in_process: None
) -> None:
    cooldown_app.app.conf.task_always_eager = mode == "eager"

    def call(tag: str, fail: bool = False) -> Any:
        result = once.apply((tag, fail)) if mode == "apply" else once.delay(tag, fail)
        return result.get(propagate=False)

    tag = _tag()
    assert isinstance(call(tag, fail=True), RuntimeError)
    assert call(tag) == "ran"  # the failure left no cooldown
    marker = call(tag)
    assert is_skipped(marker) and marker["cooldown_until"] > runs(tag)[1]["at"] + LONG - 1
    assert len(runs(tag)) == 2
    ttl = redis.Redis.from_url(redis_url).pttl(once.lease_key_for((tag,)))
    assert (LONG - 10) * 1000 < ttl <= LONG * 1000


def test_a_message_the_execution_published_for_its_own_key_meets_its_cooldown_as_a_copy(
    redis_url: str, in_process: None
) -> None:
    cooldown_app.app.conf.task_always_eager = True
    tag = _tag()
    assert requeue.delay(tag).get() == "ran"
    assert is_skipped(cooldown_app.published.pop(tag).get())
    assert len(runs(tag)) == 1
