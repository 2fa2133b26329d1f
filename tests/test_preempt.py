"""``lease_on_conflict="preempt"``, newest wins, with real workers: the newcomer takes the key
over, the old body gets ``LeaseLost(cause="preempted")`` long before its next renewal would
have told it, its late fenced write is refused, and with ``lease_preempt_grace`` the newcomer's
body starts only once the old one ended or the grace passed."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_lease import LeaseLost
from celery_lease.ops import acl
from harness.waiting import wait_for
from tests.apps import preempt_app
from tests.apps.preempt_app import GRACE, deduped, graceful, runs, took_over, work
from tests.support.fixtures import WorkerFactory
from tests.support.redis_server import HOST
from tests.support.secure import AclRedisServer, lease_acl
from tests.support.workers import point_app

APP = "tests.apps.preempt_app"


def _tag() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def client_app(redis_url: str, worker_factory: WorkerFactory) -> Iterator[Any]:
    point_app(
        preempt_app.app,
        broker_url=worker_factory.broker_url,
        result_backend=redis_url,
        lease_backend=redis_url,
        task_default_queue=worker_factory.queue,
    )
    yield preempt_app.app
    preempt_app.app.conf.task_default_queue = "celery"


def _started(tag: str, count: int) -> list[dict[str, Any]]:
    return wait_for(
        lambda: (
            [r for r in runs(tag) if r["what"] == "start"][count - 1 :]
            and [r for r in runs(tag) if r["what"] == "start"]
        ),
        30,
        message=lambda: f"{count} start(s) of {tag}: {runs(tag)}",
    )


@pytest.mark.parametrize(
    ("pool", "broker_url"),
    [("prefork", "redis"), ("threads", "redis"), ("gevent", "redis"), ("prefork", "rabbitmq")],
    indirect=["broker_url"],
)
def test_the_newcomer_runs_and_the_old_body_gets_lease_lost_preempted_with_its_write_refused(
    pool: str, worker_factory: WorkerFactory, client_app: Any
) -> None:
    worker_factory(APP, pool=pool, concurrency=2, env={})
    tag = _tag()
    first = work.delay(tag, "old")
    _started(tag, 1)
    second = work.delay(tag, "new", 0.5)
    assert second.get(timeout=30) == "new"
    with pytest.raises(LeaseLost) as lost:
        first.get(timeout=30)
    assert lost.value.cause == "preempted"
    record = {(r["run"], r["what"]): r for r in runs(tag) if "run" in r}
    assert record["old", "lost"]["cause"] == "preempted"
    assert record["new", "start"]["fence"] > record["old", "start"]["fence"]
    assert record["old", "end"]["late_write_accepted"] is False  # fenced off downstream
    [takeover] = took_over(work.lease_key_for((tag, "old")))
    # Told by the notice, not by a renewal (every 10 s with lease_ttl=30): measured, loosely.
    assert record["old", "lost"]["at"] - takeover["at"] < preempt_app.TTL / 3


def _preempted_gracefully(
    worker_factory: WorkerFactory, checkpoint: float
) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[str, Any]]:
    """A ``pre.graceful`` holder that checkpoints ``checkpoint`` seconds once preempted, and
    its newcomer: what each recorded, and the take-over."""
    worker_factory(APP, pool="threads", concurrency=2, env={})
    tag = _tag()
    first = graceful.delay(tag, "old", 30.0, checkpoint)
    _started(tag, 1)
    assert graceful.delay(tag, "new", 0.2).get(timeout=30) == "new"
    with pytest.raises(LeaseLost):
        first.get(timeout=30)
    [takeover] = took_over(graceful.lease_key_for((tag, "old")))
    return {(r["run"], r["what"]): r for r in runs(tag) if "run" in r}, takeover


def test_with_a_grace_the_newcomer_starts_once_the_old_body_ended(
    worker_factory: WorkerFactory, client_app: Any
) -> None:
    record, takeover = _preempted_gracefully(worker_factory, 0.5)  # well within the grace
    assert record["new", "start"]["at"] >= record["old", "end"]["at"]  # never both at once
    assert record["new", "start"]["at"] < takeover["at"] + GRACE  # woken by the end


def test_with_a_grace_a_holder_that_does_not_end_is_overlapped_only_after_the_grace(
    worker_factory: WorkerFactory, client_app: Any
) -> None:
    record, takeover = _preempted_gracefully(worker_factory, GRACE + 2)  # past the grace
    assert record["new", "start"]["at"] >= takeover["at"] + GRACE
    assert record["old", "end"]["late_write_accepted"] is False


def test_the_preempted_execution_sends_task_lease_preempted_with_its_cause(
    worker_factory: WorkerFactory, client_app: Any
) -> None:
    worker_factory(APP, pool="threads", concurrency=2, env={}, extra_args=("-E",))
    seen: list[dict[str, Any]] = []
    ready = threading.Event()

    def capture() -> None:
        with client_app.connection_for_read() as conn:

            def on_event(event: dict[str, Any]) -> None:
                if event.get("type") == "task-lease-preempted":
                    seen.append(event)
                    receiver.should_stop = True

            receiver = client_app.events.Receiver(conn, handlers={"*": on_event})
            ready.set()
            with contextlib.suppress(socket.timeout, TimeoutError):
                receiver.capture(limit=None, timeout=30)

    listener = threading.Thread(target=capture, daemon=True)
    listener.start()
    ready.wait(10)
    tag = _tag()
    first = work.delay(tag, "old")
    _started(tag, 1)
    work.delay(tag, "new", 0.2).get(timeout=30)
    with pytest.raises(LeaseLost):
        first.get(timeout=30)
    listener.join(35)
    [event] = seen
    assert event["uuid"] == first.id and event["lease_cause"] == "preempted"
    assert event["lease_key"] == work.lease_key_for((tag, "old"))


def test_a_take_over_clears_the_newcomers_dedupe_claim_so_the_next_publish_is_queued(
    worker_factory: WorkerFactory, client_app: Any
) -> None:
    worker_factory(APP, pool="threads", concurrency=2, env={})
    tag = _tag()
    first = deduped.delay(tag, "old")
    _started(tag, 1)
    second = deduped.delay(tag, "new", 0.0)
    assert second.lease_disposition == "published"  # claims the waiting slot
    assert second.get(timeout=30) == "new"  # it ran: it took the key over
    # Its claim went with the take-over: a third publish waits for its own run, not folded
    # into the newcomer that already runs (which would lose this trigger).
    third = deduped.delay(tag, "third", 0.2)
    assert third.lease_disposition == "published"
    assert third.get(timeout=30) == "third"
    with pytest.raises(LeaseLost):
        first.get(timeout=30)


def _without_the_notice(
    ttl: float, grace: float, old_hold: float
) -> tuple[dict[tuple[str, str], float], float]:
    """An old run preempted by a new one in this process, the notice unable to arrive: the
    store's user has the preempt commands but no channel, so the old process cannot subscribe
    and the newcomer's PUBLISH is refused. What each run did (monotonic times) and when the
    newcomer was sent."""
    prefix = f"nonotice{_tag()}"
    job, _ = preempt_app.in_process("redis://x@127.0.0.1:1/0", prefix)
    (need,) = acl.needs(job.app)
    with AclRedisServer() as server:
        rule = [
            r
            for r in lease_acl("nochan", "pw", prefix, features=sorted(need.features))
            if not r.startswith("&")
        ]
        with server.client() as admin:
            admin.execute_command("ACL", "SETUSER", *rule)
        job, seen = preempt_app.in_process(
            f"redis://nochan:pw@{HOST}:{server.port}/0", prefix, ttl, grace, old_hold
        )
        thread = threading.Thread(target=job.apply, args=(("t", "old"),))
        thread.start()
        wait_for(lambda: seen, 10, message="the old run never started")
        taken_at = time.monotonic()
        assert job.apply(("t", "new")).get() == "new"
        thread.join(10)
    return {(run, what): at for run, what, at in seen}, taken_at


def test_a_take_over_found_by_the_renewal_is_a_preemption_and_wakes_the_waiting_newcomer() -> None:
    # The old holder learns it from its renewal (every second with lease_ttl=3), and its end
    # must wake the newcomer that waits out a 20 s grace, as on the notice's path.
    grace = 20.0
    marks, taken_at = _without_the_notice(3.0, grace, 30.0)
    assert ("old", "lost preempted") in marks, marks  # not "refused": the new holder names it
    # Woken by the old end (within a renewal interval and a pass), not at the grace's end.
    assert marks["new", "start"] - taken_at < grace / 2
    assert marks["new", "start"] >= marks["old", "lost preempted"]


def test_a_take_over_found_only_by_the_release_wakes_the_waiting_newcomer() -> None:
    # The old body ends (0.5 s) before any renewal (10 s with lease_ttl=30) could tell it: its
    # release finds the key taken over, and its end wakes the newcomer all the same.
    grace = 20.0
    marks, taken_at = _without_the_notice(30.0, grace, 0.5)
    assert ("old", "end") in marks  # it never learnt it while running
    assert marks["new", "start"] - taken_at < grace / 2
    assert marks["new", "start"] >= marks["old", "end"]
