"""``app.conf.lease_tasks``: leasing tasks of a module the test does not modify
(``tests.apps.thirdparty.tasks``: a plain shared task, and a ``bind=True`` autoretry task)."""

from __future__ import annotations

import inspect
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.beat import ScheduleEntry, Scheduler
from celery.contrib.testing.worker import start_worker

import celery_lease
import tests.apps.thirdparty.tasks  # noqa: F401 - registers its shared tasks on every app
from celery_lease import LeaseConfigError, LeasedTask, apply_lease_tasks, is_skipped
from celery_lease.base.keys import build_key
from celery_lease.execution.lease_tasks import leased_class
from celery_lease.ops.inspection import scan_leases
from celery_lease.ops.testing import use_lease_backend
from tests.support.waiting import wait_for

APP = "tests.apps.lease_tasks_app"


def _client_app(url: str, lease_tasks: dict[str, Any], queue: str = "celery") -> Celery:
    app = Celery("client", broker=url, backend=url, set_as_current=False)
    app.conf.update(lease_tasks=lease_tasks, task_default_queue=queue)
    return app


def test_eager_apply_takes_a_lease_without_changing_the_task_class(redis_url: str) -> None:
    app = _client_app(
        redis_url, {"thirdparty.close_day": {"lease_key": ["day"]}, "thirdparty.sync_*": {}}
    )
    app.finalize()
    task = app.tasks["thirdparty.close_day"]
    cls = type(task)
    assert not isinstance(task, LeasedTask)
    signature = inspect.signature(task.run)
    assert str(signature) == "(day: 'str', note: 'str' = '') -> 'str'"
    seen: list[str] = []

    def on_acquired(sender: Any = None, key: str = "", **_: Any) -> None:
        seen.append(key)

    celery_lease.base.signals.lease_acquired.connect(on_acquired, weak=False)
    try:
        assert task.apply(("2024-01-01",), {"note": "0"}).get() == "closed 2024-01-01"
        assert task("2024-01-02") == "closed 2024-01-02"  # a direct call takes no lease
    finally:
        celery_lease.base.signals.lease_acquired.disconnect(on_acquired)
    # Keyed by `day` only, bound to the real signature (the keyword `note` is left out).
    assert seen == [
        build_key("lease", "thirdparty.close_day", signature, ["day"], ("2024-01-01",), {})
    ]
    assert type(task) is cls and not isinstance(task, LeasedTask)
    result = app.tasks["thirdparty.sync_account"].apply((7,)).get()
    assert result["account_id"] == 7 and result["fencing_token"] > 0


def test_eager_duplicate_while_one_runs_is_skipped(redis_url: str) -> None:
    app = _client_app(redis_url, {"thirdparty.close_day": {"lease_key": ["day"]}})
    app.finalize()
    task = app.tasks["thirdparty.close_day"]
    client = redis.Redis.from_url(redis_url)
    first: list[Any] = []
    t = threading.Thread(target=lambda: first.append(task.apply(("d",), {"note": "1.0"}).get()))
    t.start()
    assert wait_for(lambda: list(scan_leases(client, "lease")), 10)
    assert is_skipped(task.apply(("d",)).get())
    t.join(10)
    assert first == ["closed d"]


def test_an_entry_with_lease_limit_runs_that_many_at_once_per_key(redis_url: str) -> None:
    app = _client_app(redis_url, {"thirdparty.close_day": {"lease_key": ["day"], "lease_limit": 2}})
    app.finalize()
    task = app.tasks["thirdparty.close_day"]
    client = redis.Redis.from_url(redis_url)
    key = build_key(
        "lease", "thirdparty.close_day", inspect.signature(task.run), ["day"], ("d",), {}
    )
    done: list[Any] = []
    slow = [
        threading.Thread(target=lambda: done.append(task.apply(("d",), {"note": "3"}).get()))
        for _ in range(2)
    ]
    for t in slow:
        t.start()
    try:
        # Two slots of the key held at once: both ran beside each other, the third is skipped.
        assert wait_for(lambda: client.hlen(key) == 3, 10)  # 2 slots and the limit
        assert is_skipped(task.apply(("d",)).get())
        assert task.apply(("other day",)).get() == "closed other day"  # another key
    finally:
        for t in slow:
            t.join(10)
    assert done == ["closed d", "closed d"]


def test_an_entry_combining_lease_limit_with_preempt_is_refused_naming_the_fix(
    redis_url: str,
) -> None:
    app = _client_app(
        redis_url,
        {"thirdparty.close_day": {"lease_limit": 3, "lease_on_conflict": "preempt"}},
    )
    with pytest.raises(
        LeaseConfigError,
        match=r"lease_limit=3 \(app.conf.lease_tasks\['thirdparty.close_day'\].*"
        r"preempt.*Fix: lease_on_conflict='queue'",
    ):
        apply_lease_tasks(app)


@pytest.mark.parametrize(
    "setting, match",
    [
        ({"nothing.matches.*": {}}, r"lease_tasks\['nothing.matches.\*'\] matches no registered"),
        ({"thirdparty.close_day": {"lease_tll": 3.0}}, r"lease_tll.*did you mean lease_ttl"),
        ({"thirdparty.close_day": {"lease_key": ["month"]}}, r"'month'.*not a parameter"),
        ({"thirdparty.close_day": {"lease_ttl": -1}}, r"lease_ttl=-1"),
        ({"thirdparty.*": {}, "thirdparty.close_*": {}}, r"matches both"),
    ],
)
def test_bad_entries_are_clear_errors_naming_the_entry(
    redis_url: str, setting: dict[str, Any], match: str
) -> None:
    app = _client_app(redis_url, setting)
    with pytest.raises(LeaseConfigError, match=match):
        apply_lease_tasks(app)


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_worker_leases_the_tasks_and_retries_an_autoretry_task(
    redis_url: str, worker_factory: Any, pool: str
) -> None:
    worker_factory(APP, pool=pool, concurrency=4)
    app = _client_app(redis_url, {}, worker_factory.queue)
    client = redis.Redis.from_url(redis_url)
    slow = app.send_task("thirdparty.close_day", ("2024-02-01",), {"note": "1.5"})

    def held() -> list[Any]:
        return [i for i in scan_leases(client, "lease") if i.task == "thirdparty.close_day"]

    assert wait_for(held, 20)
    # The same day while it runs: skipped (the default policy), another day runs.
    duplicate = app.send_task("thirdparty.close_day", ("2024-02-01",), {"note": "0"})
    other = app.send_task("thirdparty.close_day", ("2024-02-02",))
    assert is_skipped(duplicate.get(timeout=20))
    assert other.get(timeout=20) == "closed 2024-02-02"
    assert slow.get(timeout=20) == "closed 2024-02-01"
    # The autoretry task retries twice under its own class's policy, each try leased.
    result = app.send_task("thirdparty.sync_account", (5,), {"fail_times": 2}).get(timeout=30)
    assert result["retries"] == 2 and result["fencing_token"] > 0
    assert wait_for(lambda: not list(scan_leases(client, "lease")), 10)


def test_worker_refuses_to_start_on_a_pattern_matching_nothing(
    redis_url: str, worker_factory: Any, tmp_path: Path
) -> None:
    worker = worker_factory(
        APP, env={"TEST_LEASE_TASKS": json.dumps({"billing.*": {}})}, ready_timeout=None
    )
    assert worker.wait(60) not in (None, 0)
    assert "lease_tasks['billing.*'] matches no registered task" in worker.log_text()


def test_the_setting_lives_beside_leased_tasks_of_the_same_app(redis_url: str) -> None:
    app = _client_app(redis_url, {"thirdparty.close_day": {}})

    @app.task(shared=False, base=LeasedTask, name="own.task")
    def own() -> bool:
        return celery_lease.current_lease() is not None

    app.finalize()  # LeasedTask checks every lease_* setting name: lease_tasks is known
    assert own.apply().get() is True
    assert apply_lease_tasks(app) == ["thirdparty.close_day"]


# --- every path that first evaluates a task leases it -------------------------------------

NAME = "hc.plain_job"
SETTING = {NAME: {"lease_key": ["x"]}}


def _plain_job(x: int, note: str = "") -> str | None:
    """The body of ``hc.plain_job``: the key of the lease it runs under, None without one."""
    lease = celery_lease.current_lease()
    return lease.key if lease is not None else None


def _expected_key(x: int) -> str:
    return build_key("lease", NAME, inspect.signature(_plain_job), ["x"], (x,), {})


def _plain_app(redis_url: str, order: str) -> tuple[Celery, Any]:
    """An app with ``hc.plain_job`` and the setting naming it, given in ``order``; in memory
    (broker, results), the leases on ``redis_url``; nothing has finalized it unless ``order``
    says so."""
    app = Celery("hc", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(lease_backend=redis_url, task_always_eager=True)
    if order == "setting, then task":
        app.conf.lease_tasks = SETTING
    task = app.task(name=NAME, shared=False)(_plain_job)
    if order == "finalize, then setting":
        app.finalize()
    if order != "setting, then task":
        app.conf.lease_tasks = SETTING
    return app, task


EAGER_PATHS = {
    "apply": lambda app, task: task.apply((7,)).get(),
    "delay, eager": lambda app, task: task.delay(7).get(),
    "apply_async, eager": lambda app, task: task.apply_async((7,)).get(),
    "app.tasks": lambda app, task: app.tasks[NAME].apply((7,)).get(),
}
ORDERS = ["setting, then task", "task, then setting", "finalize, then setting"]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("path", list(EAGER_PATHS))
def test_the_body_runs_under_a_lease_for_its_key_whatever_path_first_evaluates_the_task(
    redis_url: str, path: str, order: str
) -> None:
    app, task = _plain_app(redis_url, order)
    assert app.finalized is (order == "finalize, then setting")
    assert EAGER_PATHS[path](app, task) == _expected_key(7)
    assert task(7) is None  # a direct call takes no lease, as with LeasedTask


def test_first_applies_from_many_threads_at_once_each_take_one_lease(redis_url: str) -> None:
    _, task = _plain_app(redis_url, "task, then setting")
    assert task.name == NAME  # evaluated and bound here: Celery's lazy bind is not thread-safe
    start = threading.Barrier(8)
    results: dict[int, Any] = {}

    def first_apply(x: int) -> None:
        start.wait()
        results[x] = task.apply((x,)).get()

    threads = [threading.Thread(target=first_apply, args=(x,)) for x in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # Wrapped once: a second wrap would take the same key inside the first and be skipped.
    assert results == {x: _expected_key(x) for x in range(8)}


@pytest.mark.parametrize("order", ["setting, then task", "finalize, then setting"])
def test_a_worker_runs_the_body_under_a_lease_for_its_key(redis_url: str, order: str) -> None:
    app, task = _plain_app(redis_url, order)
    app.conf.task_always_eager = False
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
        assert task.delay(7).get(timeout=30) == _expected_key(7)


def test_what_beat_sends_runs_under_a_lease_for_its_key(redis_url: str) -> None:
    app, _ = _plain_app(redis_url, "task, then setting")
    scheduler = Scheduler(app=app, lazy=True)
    entry = ScheduleEntry(name="every-minute", task=NAME, schedule=60.0, args=(7,), app=app)
    assert scheduler.apply_async(entry, advance=False).get() == _expected_key(7)


def test_a_bad_entry_for_the_task_being_run_is_raised_by_its_first_apply(redis_url: str) -> None:
    app = Celery("hc", broker="memory://", set_as_current=False)
    app.conf.update(lease_backend=redis_url, lease_tasks={NAME: {"lease_key": ["y"]}})
    task = app.task(name=NAME, shared=False)(_plain_job)
    with pytest.raises(LeaseConfigError, match=r"'y' \(app.conf.lease_tasks\['hc.plain_job'\]"):
        task.apply((7,))


def test_use_lease_backend_points_a_task_leased_by_the_setting_at_the_test_store(
    redis_url: str, throwaway_redis: Any
) -> None:
    app, task = _plain_app(redis_url, "task, then setting")
    assert task.apply((7,)).get() == _expected_key(7)  # its settings resolved on redis_url
    other = throwaway_redis().url()
    seen: list[int] = []

    def on_acquired(sender: Any = None, key: str = "", **_: Any) -> None:
        seen.append(redis.Redis.from_url(other).pttl(key))

    with use_lease_backend(app, other):
        celery_lease.base.signals.lease_acquired.connect(on_acquired, weak=False)
        try:
            assert task.apply((7,)).get() == _expected_key(7)
        finally:
            celery_lease.base.signals.lease_acquired.disconnect(on_acquired)
    assert len(seen) == 1 and seen[0] > 0  # the lease was taken on the test store


def test_lease_options_on_a_task_that_takes_no_lease_are_refused_at_finalize_and_first_apply(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery("stray", broker="memory://", set_as_current=False)
    app.conf.lease_backend = redis_url
    task = app.task(name="stray.sync", shared=False, lease_key=("x",), lease_ttl=10.0)(_plain_job)
    fix = (
        r"task stray.sync has lease option\(s\) lease_key, lease_ttl but takes no lease .*"
        r"base=LeasedTask .*or name it in app.conf.lease_tasks"
    )
    with caplog.at_level("ERROR", logger="celery_lease"):
        app.finalize()
    assert any(r.name == "celery_lease" and "stray.sync" in r.getMessage() for r in caplog.records)
    with pytest.raises(LeaseConfigError, match=fix):
        task.apply((7,))
    with pytest.raises(LeaseConfigError, match=fix):
        apply_lease_tasks(app)
    # A misspelt one is named in the same error, so that adding the base is the last fix.
    typo = app.task(name="stray.typo", shared=False, lease_tll=10.0)(_plain_job)
    with pytest.raises(
        LeaseConfigError,
        match=r"and unknown task option lease_tll \(task "
        r"stray.typo\); did you mean lease_ttl\?",
    ):
        typo.apply((7,))


def test_a_task_leased_by_the_setting_keeps_its_own_lease_options(redis_url: str) -> None:
    app = Celery("own", broker="memory://", set_as_current=False)
    app.conf.update(lease_backend=redis_url, lease_tasks={"own.job": {"lease_key": ["x"]}})
    task = app.task(name="own.job", shared=False, lease_ttl=7.0)(_plain_job)
    apply_lease_tasks(app)
    leased = leased_class(task)
    assert leased is not None and leased().lease_settings().options.ttl == 7.0
    app.conf.lease_tasks = {"own.twice": {"lease_ttl": 8.0}}
    twice = app.task(name="own.twice", shared=False, lease_ttl=7.0)(_plain_job)
    with pytest.raises(LeaseConfigError, match="lease_ttl set both on the task and in the entry"):
        twice.apply((7,))


def test_the_doctor_judges_a_task_leased_by_the_setting_by_its_own_lease_options(
    redis_url: str,
) -> None:
    from celery_lease.ops.doctor import diagnose

    app = _client_app(
        redis_url,
        {
            "thirdparty.close_day": {
                "lease_key": ["day"],
                "lease_on_conflict": "retry",
                "lease_ttl": 7200.0,
            }
        },
    )
    app.conf.broker_transport_options = {"visibility_timeout": 3600}
    app.finalize()
    findings = [f for f in diagnose(app, at_start=True) if f.subject == "task thirdparty.close_day"]
    assert any(f.level == "ok" and "lease_ttl=7200s" in f.message for f in findings), findings
    assert any("visibility_timeout=3600s" in f.message for f in findings), findings
