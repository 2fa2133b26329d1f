"""``coalesce`` and ``queue`` in eager mode, and what operators see of them: ``celery lease
ls``'s entry for a key with runs waiting, the metrics, Flower's summary."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery._state import _set_task_join_will_block
from prometheus_client import CollectorRegistry

from celery_lease import is_coalesced
from celery_lease.base import signals
from celery_lease.ops import inspection
from celery_lease.ops.flower import lease_summary
from celery_lease.ops.metrics import LeaseMetrics
from tests.apps import handoff_app
from tests.apps.handoff_app import coalesced, queued, runs
from tests.support.waiting import wait_for


@pytest.fixture
def eager(redis_url: str) -> Iterator[None]:
    handoff_app.configure(redis_url, task_always_eager=True, task_eager_propagates=True)
    yield
    handoff_app.app.conf.update(task_always_eager=False, task_eager_propagates=False)
    # Two eager calls in two threads race on Celery's process-wide "join would block" flag
    # (Task.apply_async's denied_join_result saves and restores it): leave it as found.
    _set_task_join_will_block(False)


def _hold(task: Any, tag: str, seconds: float) -> threading.Thread:
    thread = threading.Thread(target=task.delay, args=(tag, 0, seconds))
    thread.start()
    wait_for(lambda: runs(tag), 10, message="the holder never started")
    return thread


def test_eager_coalesce_returns_the_marker_and_the_holder_runs_the_pending_run_after_it(
    eager: None,
) -> None:
    holder = _hold(coalesced, "e", 0.5)
    marker = coalesced.delay("e", 1).result
    assert is_coalesced(marker)
    assert coalesced.delay("e", 2).result["into"] == marker["into"]
    holder.join(10)
    assert [r["n"] for r in runs("e") if r["what"] == "start"] == [0, 2]  # latest arguments


def test_eager_queue_waits_its_turn_and_returns_the_real_result(eager: None) -> None:
    holder = _hold(queued, "eq", 0.5)
    assert queued.delay("eq", 1).result == 1
    holder.join(10)
    assert [(r["what"], r["n"]) for r in runs("eq")][:4] == [
        ("start", 0),
        ("end", 0),
        ("start", 1),
        ("end", 1),
    ]


def test_ls_lists_a_keys_line_and_the_run_it_is_handed_to(redis_url: str) -> None:
    handoff_app.configure(redis_url)
    key = coalesced.lease_key_for(("ls", 0))
    client = redis.Redis.from_url(redis_url)
    client.rpush(f"{key}:line", "q1\n1\n{}", "q2\n2\n{}")
    client.hset(f"{key}:reserved", mapping={"id": "r1", "el": 'r1\n0\n{"task":"ho.queued"}'})
    (info,) = inspection.scan_leases(client, "lease")
    assert (info.key, info.waiting, info.reserved_for) == (key, 2, "r1")
    assert (info.task, info.host) == ("ho.queued", inspection.FREE_HOST)  # nobody holds it


def test_the_metrics_count_parked_duplicates_line_lengths_and_hand_overs() -> None:
    registry = CollectorRegistry()
    LeaseMetrics(registry).connect()
    task = coalesced  # a sender with a name
    signals.lease_coalesced.send(
        sender=task, key="k", task_id="a", into="p", joined=False, holder_task_id="h"
    )
    signals.lease_queued.send(sender=task, key="k", task_id="b", position=3, holder_task_id="h")
    signals.lease_handed_over.send(sender="ho.coalesced", key="k", task_id="p", by="sweep")
    value = registry.get_sample_value
    assert value("celery_lease_coalesced_total", {"task": "ho.coalesced"}) == 1
    assert value("celery_lease_queued_total", {"task": "ho.coalesced"}) == 1
    assert value("celery_lease_line_length_sum", {"task": "ho.coalesced"}) == 4
    assert value("celery_lease_handed_over_total", {"task": "ho.coalesced", "by": "sweep"}) == 1


def test_flower_summarises_a_coalesced_and_a_queued_duplicate() -> None:
    def task(**fields: Any) -> Any:
        return SimpleNamespace(**fields)

    assert (
        lease_summary(
            task(lease_key="k", lease_into="p", state="LEASE-COALESCED", lease_remaining=1.0)
        )
        == "coalesced (pending run)"
    )
    assert (
        lease_summary(
            task(lease_key="k", lease_position=2, state="LEASE-QUEUED", lease_remaining=1.0)
        )
        == "queued (#2)"
    )
    assert (
        lease_summary(task(lease_key="k", lease_position=2, state="SUCCESS", lease_remaining=1.0))
        == "waited in line (#2)"
    )


def test_ls_shows_a_waiting_column_only_when_runs_wait(capsys: pytest.CaptureFixture[str]) -> None:
    from celery_lease.ops import cli

    held = inspection.LeaseInfo("lease:{a}", "t.job", "id-1", "web1", 7, 1, 12.0, "t" * 32)
    cli._print_leases([held], wide=False)
    assert "WAITING" not in capsys.readouterr().out
    free = inspection.LeaseInfo(
        "lease:{b}", "t.job", "", inspection.FREE_HOST, 0, 0, 0.0, "", waiting=2, reserved_for="r1"
    )
    cli._print_leases([held, free], wide=True)
    out = capsys.readouterr().out
    assert "WAITING" in out and "2 (handed to r1)" in out and "(free)" in out
