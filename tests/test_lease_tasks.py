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

import celery_lease
import tests.apps.thirdparty.tasks  # noqa: F401 - registers its shared tasks on every app
from celery_lease import LeaseConfigError, LeasedTask, apply_lease_tasks, is_skipped
from celery_lease.inspection import scan_leases
from celery_lease.keys import build_key
from tests.support.waiting import wait_for

APP = "tests.apps.lease_tasks_app"


def _client_app(url: str, lease_tasks: dict[str, Any], queue: str = "celery") -> Celery:
    app = Celery("client", broker=url, backend=url, set_as_current=False)
    app.conf.update(lease_tasks=lease_tasks, task_default_queue=queue)
    return app


def test_eager_apply_takes_a_lease_without_changing_the_task_class(redis_url: str) -> None:
    app = _client_app(redis_url, {"thirdparty.close_day": {"lease_key": ["day"]},
                                  "thirdparty.sync_*": {}})
    app.finalize()
    task = app.tasks["thirdparty.close_day"]
    cls = type(task)
    assert not isinstance(task, LeasedTask)
    signature = inspect.signature(task.run)
    assert str(signature) == "(day: 'str', note: 'str' = '') -> 'str'"
    seen: list[str] = []

    def on_acquired(sender: Any = None, key: str = "", **_: Any) -> None:
        seen.append(key)

    celery_lease.signals.lease_acquired.connect(on_acquired, weak=False)
    try:
        assert task.apply(("2024-01-01",), {"note": "0"}).get() == "closed 2024-01-01"
        assert task("2024-01-02") == "closed 2024-01-02"  # a direct call takes no lease
    finally:
        celery_lease.signals.lease_acquired.disconnect(on_acquired)
    # Keyed by `day` only, bound to the real signature (the keyword `note` is left out).
    assert seen == [build_key("lease", "thirdparty.close_day", signature, ["day"],
                              ("2024-01-01",), {})]
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


@pytest.mark.parametrize("setting, match", [
    ({"nothing.matches.*": {}}, r"lease_tasks\['nothing.matches.\*'\] matches no registered"),
    ({"thirdparty.close_day": {"lease_tll": 3.0}}, r"lease_tll.*did you mean lease_ttl"),
    ({"thirdparty.close_day": {"lease_key": ["month"]}}, r"'month'.*not a parameter"),
    ({"thirdparty.close_day": {"lease_ttl": -1}}, r"lease_ttl=-1"),
    ({"thirdparty.*": {}, "thirdparty.close_*": {}}, r"matches both"),
])
def test_bad_entries_are_clear_errors_naming_the_entry(
        redis_url: str, setting: dict[str, Any], match: str) -> None:
    app = _client_app(redis_url, setting)
    with pytest.raises(LeaseConfigError, match=match):
        apply_lease_tasks(app)


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_worker_leases_the_tasks_and_retries_an_autoretry_task(
        redis_url: str, worker_factory: Any, pool: str) -> None:
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
        redis_url: str, worker_factory: Any, tmp_path: Path) -> None:
    worker = worker_factory(APP, env={"TEST_LEASE_TASKS": json.dumps({"billing.*": {}})},
                            ready_timeout=None)
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
