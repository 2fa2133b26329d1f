"""A lease store outage with a real worker and a stopped private redis-server: an execution
waits it out without using up ``max_retries``, up to ``lease_store_outage_max``, then fails
with ``LeaseStoreUnavailable``; the worker's log says when the outage began and ended, once
each, and logs an ERROR only for what it gave up."""

from __future__ import annotations

import itertools
import json
import logging
import re
import threading
import time

import pytest
import redis
from celery import Celery

from harness.waiting import wait_for
from tests.support.fixtures import RedisFactory, WorkerFactory


def test_an_outage_longer_than_max_retries_is_waited_out_and_a_longer_one_than_the_bound_fails(
    redis_url: str,
    throwaway_redis: RedisFactory,
    worker_factory: WorkerFactory,
) -> None:
    lease_store = throwaway_redis()
    lease_store.stop()
    # TTL 1.5 s: Celery's own retries (one at most, every 0.5 s renew interval) would give up
    # within a second.
    worker_factory(
        "tests.apps.lease_app", env={"LEASE_BACKEND": lease_store.url(), "LEASE_TTL": "1.5"}
    )
    app = Celery("client", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.task_default_queue = worker_factory.queue
    journal = redis.Redis.from_url(redis_url)
    waited = app.send_task("one_retry", ("a",))
    bounded = app.send_task("short_outage", ("b",))
    # The bounded one gives up once the outage has lasted its 1.5 s.
    wait_for(lambda: bounded.ready(), 30)
    assert bounded.state == "FAILURE"
    assert type(bounded.result).__name__ == "LeaseStoreUnavailable"
    # The other keeps waiting (past the one retry Celery would allow it), and runs once the
    # store answers, its retries not counted.
    assert waited.state == "RETRY"
    lease_store.restart()
    assert waited.get(timeout=60) == 0
    starts = [json.loads(e) for e in journal.lrange("journal", 0, -1)]
    assert [(e["tag"], e["retries"]) for e in starts if e["event"] == "start"] == [("a", 0)]


def test_store_errors_of_one_message_far_apart_are_two_outages() -> None:
    from celery_lease.execution.outage import NEW_OUTAGE_GAP, OUTAGE_HEADER, _outage_start

    now = 10_000.0
    assert _outage_start({OUTAGE_HEADER: [9_000.0, now - 20.0]}, now) == 9_000.0
    assert _outage_start({OUTAGE_HEADER: [9_000.0, now + 5.0]}, now) == 9_000.0  # a clock ahead
    assert _outage_start({OUTAGE_HEADER: [9_000.0, now - NEW_OUTAGE_GAP - 1]}, now) == now
    assert _outage_start({OUTAGE_HEADER: "damaged"}, now) == now
    assert _outage_start({}, now) == now


def test_an_outage_is_logged_once_as_it_begins_and_once_as_it_ends_with_its_length(
    redis_url: str,
    throwaway_redis: RedisFactory,
    worker_factory: WorkerFactory,
) -> None:
    lease_store = throwaway_redis()
    # The sweep thread (a coalesce task) and the retried tasks all meet the outage.
    worker = worker_factory(
        "tests.apps.lease_app",
        env={"LEASE_BACKEND": lease_store.url(), "LEASE_TTL": "1.5", "LEASE_APP_SWEEP": "1"},
    )
    app = Celery("client", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.task_default_queue = worker_factory.queue
    lease_store.stop()
    stopped = time.monotonic()
    waiting = [app.send_task("one_retry", (f"w{i}",)) for i in range(3)]
    given_up = app.send_task("short_outage", ("b",))  # lease_store_outage_max=1.5
    # Each waiting task retries several times (Celery logs each retry at INFO).
    wait_for(lambda: worker.log_text().count("one_retry[") >= 12, 60, message=worker.log_tail)
    wait_for(lambda: given_up.ready(), 30)
    wait_for(lambda: time.monotonic() - stopped >= 5.0, 10)
    restarting = time.monotonic()
    lease_store.restart()
    assert [w.get(timeout=60) for w in waiting] == [0, 0, 0]
    answered = time.monotonic()
    log = worker.log_text()

    assert log.count(f"lease store {lease_store.url()} is unreachable (seen by") == 1, log
    back = re.findall(
        r"is reachable again after (\d+\.\d)s \((\d+) failed calls, the last (\d+\.\d)s ago\)", log
    )
    assert len(back) == 1, log
    # From the first failed call (within a sweep pass of the stop) to the first answer.
    assert restarting - stopped - 2.0 <= float(back[0][0]) <= answered - stopped, back
    assert int(back[0][1]) >= 12  # the sweep's passes and the tasks' acquires
    assert float(back[0][2]) <= answered - restarting + 1.0  # the sweep tried every 0.5 s
    assert "still unreachable" not in log  # the first reminder is due after 30 s
    assert "lease sweep" not in log and "interrupted acquire" not in log
    # ERROR only for the task given up: our line and Celery's own, naming its id.
    errors = [line for line in log.splitlines() if "ERROR/" in line or "CRITICAL/" in line]
    assert errors and all(given_up.id in line for line in errors), errors
    assert sum("fails: the lease store has not answered for" in line for line in errors) == 1


def test_reminders_back_off_and_threads_reporting_at_once_log_an_outage_once(
    throwaway_redis: RedisFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from celery_lease.store import health

    # The schedule shrunk a hundredfold (30 s, then gaps of 60, 120, ... capped): 0.3 s, then
    # gaps of 0.6 s and 1.2 s, capped at 1.2 s.
    monkeypatch.setattr(health, "FIRST_REMINDER", 0.3)
    monkeypatch.setattr(health, "MAX_REMINDER_GAP", 1.2)
    lease_store = throwaway_redis()
    client = lease_store.client(socket_timeout=0.5)
    lease_store.stop()
    state = health.Reachability(lease_store.url())
    caplog.set_level(logging.WARNING, logger="celery_lease")
    until = time.monotonic() + 3.0

    def report() -> None:
        while time.monotonic() < until:
            try:
                client.ping()
            except redis.RedisError as exc:
                state.failed(exc, "ping")
            time.sleep(0.005)

    threads = [threading.Thread(target=report) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lease_store.restart()
    client.ping()
    state.answered()
    state.answered()  # a second answer: nothing more to say

    lines = [r.getMessage() for r in caplog.records]
    assert sum(" is unreachable (seen by ping: ConnectionError" in m for m in lines) == 1, lines
    reminders = [
        float(m.group(1))
        for line in lines
        if (m := re.search(r"still unreachable after ([\d.]+)s", line))
    ]
    # Due at 0.3, 0.9, 2.1 s (the third gap capped at 1.2 s): each one a gap after the last.
    assert len(reminders) in (2, 3), lines
    gaps = [b - a for a, b in itertools.pairwise([0.0, *reminders])]
    for gap, due in zip(gaps, (0.3, 0.6, 1.2)[: len(gaps)], strict=True):
        assert due - 0.1 <= gap <= due + 0.5, reminders
    (back,) = [m for m in lines if "is reachable again after" in m]
    lasted = re.search(r"after ([\d.]+)s", back)
    assert lasted is not None and float(lasted.group(1)) >= 3.0 - 0.1, back


def test_a_lease_held_through_an_outage_shorter_than_its_ttl_is_kept_and_logged_once_each_way(
    redis_url: str,
    throwaway_redis: RedisFactory,
    worker_factory: WorkerFactory,
) -> None:
    # Kept on disk, so the key held is still there after the restart, with its expiry time.
    lease_store = throwaway_redis({"appendonly": "yes", "appendfsync": "always"})
    # TTL 9 s, renewed every 3 s: a renewal fails within 3 s of the stop, then is tried again
    # every second; the store is back well before the deadline.
    worker = worker_factory(
        "tests.apps.lease_app",
        pool="prefork",
        env={"LEASE_BACKEND": lease_store.url(), "LEASE_TTL": "9"},
    )
    app = Celery("client", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.task_default_queue = worker_factory.queue
    journal = redis.Redis.from_url(redis_url)

    def events() -> list[dict[str, object]]:
        return [json.loads(e) for e in journal.lrange("journal", 0, -1)]

    held = app.send_task("hold", ("kept", 20.0))
    wait_for(lambda: any(e["event"] == "start" for e in events()), 60, message=worker.log_tail)
    lease_store.stop()
    stopped = time.monotonic()
    unreachable = f"lease store {lease_store.url()} is unreachable (seen by renewal of"
    wait_for(lambda: unreachable in worker.log_text(), 30, message=worker.log_tail)
    noticed = time.monotonic()
    wait_for(lambda: time.monotonic() - noticed >= 2.5, 10)  # two tries more, at least
    restarting = time.monotonic()
    lease_store.restart()
    assert held.get(timeout=60) == "kept"
    log = worker.log_text()

    assert [e["event"] for e in events()] == ["start", "step", "end"]  # no loss
    # One line each way from the pool process that holds the lease (the main process's sweep
    # reports what it sees on its own); no line per try.
    holder = [line for line in log.splitlines() if "/ForkPoolWorker-1]" in line]
    down = [line for line in holder if " is unreachable (seen by" in line]
    assert len(down) == 1 and unreachable in down[0], log
    back = [line for line in holder if "is reachable again after" in line]
    assert len(back) == 1, log
    found = re.search(r"after (\d+\.\d)s \((\d+) failed calls", back[0])
    assert found is not None, back
    # From the first failed renewal (after the stop) to the first answer (after the restart).
    assert restarting - noticed <= float(found.group(1)) <= time.monotonic() - stopped, back
    assert int(found.group(2)) >= 2, back  # tried again every second (3 s / 3)
    assert "lease renewal failed" not in log and "still unreachable" not in log, log


def test_a_failure_long_after_the_previous_one_with_no_call_between_begins_a_new_outage(
    throwaway_redis: RedisFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from celery_lease.store import health

    monkeypatch.setattr(health, "NEW_OUTAGE_AFTER", 2.0)  # 30 s, shrunk
    lease_store = throwaway_redis()
    client = lease_store.client(socket_timeout=0.5)
    lease_store.stop()
    state = health.Reachability(lease_store.url())
    caplog.set_level(logging.WARNING, logger="celery_lease")

    def fail() -> float:
        with pytest.raises(redis.RedisError) as caught:
            client.ping()
        assert state.failed(caught.value, "ping")
        return time.monotonic()

    fail()
    previous = fail()  # at once: the same outage
    wait_for(lambda: time.monotonic() - previous >= 2.5, 10)  # quiet longer than the rule's 2 s
    renewed = fail()
    lease_store.restart()
    client.ping()
    state.answered()
    answered = time.monotonic()

    lines = [r.getMessage() for r in caplog.records]
    starts = [m for m in lines if " is unreachable (seen by ping: " in m]
    assert len(starts) == 2 and "no call in the" not in starts[0], lines
    quiet = re.search(r"this process made no call in the ([\d.]+)s since its previous", starts[1])
    assert quiet is not None and 2.4 <= float(quiet.group(1)) <= renewed - previous + 0.1, lines
    assert not any("still unreachable" in m for m in lines), lines
    # The end of the second one, counted from its own first failure: one failed call.
    (back,) = [m for m in lines if "is reachable again after" in m]
    lasted = re.search(r"after ([\d.]+)s \(1 failed calls", back)
    assert lasted is not None and float(lasted.group(1)) <= answered - renewed + 0.1, back


def test_a_lease_lost_in_an_outage_is_logged_as_lost_and_its_release_not_as_expiring(
    redis_url: str,
    throwaway_redis: RedisFactory,
    worker_factory: WorkerFactory,
) -> None:
    lease_store = throwaway_redis()
    worker = worker_factory(
        "tests.apps.lease_app",
        pool="prefork",
        env={"LEASE_BACKEND": lease_store.url(), "LEASE_TTL": "3"},
    )
    app = Celery("client", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.task_default_queue = worker_factory.queue
    journal = redis.Redis.from_url(redis_url)
    held = app.send_task("hold", ("lost", 60.0))
    wait_for(lambda: journal.llen("journal") >= 1, 60, message=worker.log_tail)
    lease_store.stop()  # for longer than the TTL: the deadline passes, the release fails
    wait_for(lambda: held.ready(), 60, message=worker.log_tail)
    assert held.state == "FAILURE" and type(held.result).__name__ == "LeaseLost"
    log = worker.log_text()

    holder = [line for line in log.splitlines() if "/ForkPoolWorker-1]" in line]
    assert sum(" is unreachable (seen by renewal of" in line for line in holder) == 1, log
    assert (
        sum("lease lost: key=lease:{hold:" in line and "cause=deadline" in line for line in holder)
        == 1
    ), log
    # The key had lapsed: nothing said to expire later; the failed try is DEBUG, as each
    # failed renewal is.
    assert "expires within" not in log and "lease renewal failed" not in log, log
