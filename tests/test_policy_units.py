"""A policy is one unit: a subclass of ``Policy`` in its own file is found, bound only to the
tasks it applies to and only for the hooks it overrides, and runs in a real leased execution
on a real Redis, with nothing else of the package changed. A task with no policy binds only
the hooks a message header can ask for."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_lease import LeasedTask
from celery_lease.core.lease import Lease
from celery_lease.core.lifecycle import Ending
from celery_lease.policies import base, compose
from celery_lease.settings.config import LeaseOptions, resolve_options

#: What the example policy saw, in order: (hook, task name, fencing token).
SEEN: list[tuple[str, str, int]] = []


@pytest.fixture
def audited() -> Iterator[type[base.Policy]]:
    """A policy a user of the package could write: it records every grant and every end of
    the tasks whose key prefix is ``audited``, and leaves the release to the others."""

    class Audit(base.Policy):
        name = "audit (example)"

        def applies(self, options: LeaseOptions, limit: Any) -> bool:
            return options.key_prefix == "audited"

        def on_grant(self, task: Any, request: Any, lease: Lease) -> None:
            SEEN.append(("grant", task.name, lease.fencing_token))

        def release(self, task: Any, lease: Lease, ending: str, wait: bool) -> Ending | None:
            SEEN.append((f"end ({ending})", task.name, lease.fencing_token))
            return None  # the plain release ends it

    SEEN.clear()
    yield Audit
    base.unregister(Audit)


def _app(redis_url: str) -> Celery:
    app = Celery("policy_units", set_as_current=False)
    app.conf.update(lease_backend=redis_url, broker_url="memory://", result_backend=None)
    return app


def test_a_new_policy_runs_its_hooks_in_the_executions_of_the_tasks_it_applies_to(
    redis_url: str, audited: type[base.Policy]
) -> None:
    app = _app(redis_url)

    @app.task(base=LeasedTask, lease_key_prefix="audited", shared=False)
    def audited_job(x: int) -> int:
        return x * 2

    @app.task(base=LeasedTask, shared=False)
    def plain_job(x: int) -> int:
        return x + 1

    assert audited_job.apply((21,)).get() == 42
    assert plain_job.apply((1,)).get() == 2
    assert [(hook, name) for hook, name, _ in SEEN] == [
        ("grant", audited_job.name),
        ("end (success)", audited_job.name),
    ]
    assert SEEN[0][2] == SEEN[1][2] > 0  # the same lease: its fencing token, granted
    assert audited_job.lease_key_for((21,)).startswith("audited:")


def _hooks(steps: compose.Steps) -> dict[str, list[str]]:
    phases = ("prepare", "admit", "shape", "on_grant", "release", "acquires_apart")
    return {
        phase: [type(hook.__self__).__name__ for hook in getattr(steps, phase)] for phase in phases
    }


def _triggered(steps: compose.Steps) -> dict[str, list[tuple[str, str]]]:
    phases = ("prepare", "admit", "shape", "on_grant", "acquires_apart")
    return {
        phase: [
            (header, type(hook.__self__).__name__) for header, hook in getattr(steps, phase + "_on")
        ]
        for phase in phases
    }


def test_a_task_with_no_policy_binds_no_hook_and_a_header_calls_its_policy_s_own() -> None:
    options = resolve_options({}, {}, "test")
    steps = compose.steps_for(options, None)
    assert all(hooks == [] for hooks in _hooks(steps).values())
    assert _triggered(steps) == {
        "prepare": [("lease_debounce", "Debounce")],  # a timer message
        "admit": [("lease_redelivery", "Redelivery")],  # a redelivery's check copy
        "shape": [("lease_handoff", "HandOver"), ("lease_claimed", "Dedupe")],
        "on_grant": [("lease_handoff", "HandOver")],  # a coalesced run's joined arguments
        "acquires_apart": [("lease_redelivery", "Redelivery"), ("lease_debounce", "Debounce")],
    }
    assert steps.waits is False


def test_each_policy_binds_the_hooks_of_its_own_phases() -> None:
    limited = compose.steps_for(resolve_options({}, {}, "test"), 3)
    queued = compose.steps_for(resolve_options({}, {"lease_on_conflict": "queue"}, "t"), None)
    cooling = compose.steps_for(resolve_options({}, {"lease_cooldown": 5.0}, "test"), None)
    preempting = compose.steps_for(
        resolve_options({}, {"lease_on_conflict": "preempt", "lease_preempt_grace": 1.0}, "t"),
        None,
    )
    assert _hooks(limited)["shape"] == ["Limit"]
    assert _hooks(queued)["shape"] == ["HandOver"]  # bound: it hands the key over
    assert _hooks(limited)["release"] == ["Limit"]
    assert _hooks(queued)["release"] == ["HandOver"]
    assert _hooks(cooling)["release"] == ["Cooldown"]
    assert _hooks(preempting)["on_grant"] == ["Preempt"]
    assert preempting.waits is True  # a newcomer waits out the grace for this end


def test_every_conflict_policy_has_one_handler_and_preempt_falls_back_to_skip() -> None:
    names = {"skip", "fail", "retry", "coalesce", "queue", "preempt"}
    names |= {"successor", "redelivered", "handed_over"}
    assert set(compose.handlers()) == names
    assert compose.FALLBACK["preempt"](False) == "skip"
    assert compose.FALLBACK["preempt"](True) == "fail"
