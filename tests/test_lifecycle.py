"""Celery semantics on real prefork workers: retries, revoke, time limits, redelivery, policies."""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Iterator

import pytest
from celery.exceptions import TimeoutError as CeleryTimeout

from celery_lease import LeaseConflict, LeaseStoreUnavailable
from harness.redis_server import RedisServer
from harness.waiting import wait_for
from tests.support.rig import Rig, stop_process


@pytest.fixture(scope="module")
def prefork(broker: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    rig = Rig(broker, "prefork", tmp_path_factory.mktemp("prefork"))
    rig.worker()
    yield rig
    rig.close()


@pytest.fixture
def rig(prefork: Rig) -> Rig:
    prefork.reset()
    return prefork


def no_lease_left(rig: Rig) -> None:
    wait_for(lambda: rig.lease_keys() == [], 5, message=lambda: f"left: {rig.lease_keys()}")


def test_retry_runs_and_leaves_no_lease(rig: Rig) -> None:
    assert rig.send("retry_once", "r1").get(timeout=20) == "r1"
    starts = rig.journal("r1", "start")
    assert [s["retries"] for s in starts] == [0, 1]
    # countdown=0: the retry waits for its own holder to end, not for the lease's lifetime.
    assert starts[1]["t"] - starts[0]["t"] < rig.ttl * 0.6
    no_lease_left(rig)


def test_autoretry_exhausted_every_attempt_ran_no_lease_left(rig: Rig) -> None:
    result = rig.send("always_fails", "r2")
    with pytest.raises(ValueError, match="r2"):
        result.get(timeout=20)
    assert [s["retries"] for s in rig.journal("r2", "start")] == [0, 1, 2]
    no_lease_left(rig)


def test_self_requeue_runs_after_the_current_execution_releases(rig: Rig) -> None:
    rig.send("requeue", "r19", 2)
    ends = rig.wait_event("r19", "end", count=3, timeout=30)
    starts = rig.journal("r19", "start")
    assert [s["times"] for s in starts] == [2, 1, 0]
    # one at a time: each run starts after the previous one ended
    for previous_end, start in zip(ends, starts[1:], strict=False):
        assert start["t"] >= previous_end["t"]
    no_lease_left(rig)


def test_same_message_redelivered_while_running_is_a_conflict(rig: Rig) -> None:
    first = rig.send("hold", "r7", 2.0, "sleep", task_id="same-id-r7")
    rig.wait_event("r7", "start")
    rig.send("hold", "r7", 2.0, "sleep", task_id="same-id-r7")  # the broker delivers it again
    signal = wait_for(lambda: rig.journal(event="conflict-signal"), 10)[0]
    assert signal["policy"] == "redelivered"
    assert first.get(timeout=20) == "r7"  # the real result, not a skipped marker
    # The deferred copy looks again after the holder's lifetime, sees it finished, drops.
    wait_for(lambda: "already finished in an earlier delivery" in rig.logs(), 10)
    assert len(rig.journal("r7", "start")) == 1
    assert first.get(timeout=1) == "r7"


def test_redelivery_of_a_task_without_stored_results_runs_once(rig: Rig) -> None:
    rig.send("quiet", "r7q", 1.0, task_id="same-id-r7q")
    rig.wait_event("r7q", "start")
    rig.send("quiet", "r7q", 1.0, task_id="same-id-r7q")
    rig.wait_event("r7q", "end")
    wait_for(lambda: rig.logs().count("already finished in an earlier delivery") >= 1, 10)
    assert len(rig.journal("r7q", "start")) == 1


def test_self_requeue_with_arguments_json_changes(rig: Rig) -> None:
    rig.send("requeue_json", {"1": "a"}, 1)
    rig.wait_event("rqj", "end", count=2, timeout=20)
    assert [s["times"] for s in rig.journal("rqj", "start")] == [1, 0]


def test_skipped_link_of_a_chain_fails_the_chain_instead_of_hanging(rig: Rig) -> None:
    from celery import chain

    from celery_lease import LeaseConflict

    rig.send("hold", "ch", 3.0, "sleep")
    rig.wait_event("ch", "start")
    sig = rig.app.signature
    flow = chain(
        sig("hold", args=("ch", 0.1, "sleep"), queue=rig.queue),
        sig("hold", args=("ch-next", 0.1, "sleep"), queue=rig.queue),
    ).apply_async()
    with pytest.raises(LeaseConflict):
        flow.get(timeout=15)
    assert rig.journal("ch-next", "start") == []
    rig.wait_event("ch", "end")  # leave no busy pool process to the next test


def test_redelivery_after_the_holder_died_runs_once_its_lease_lapsed(rig: Rig) -> None:
    """acks_late + reject_on_worker_lost: the same task id comes back and must not be dropped
    as a duplicate of the dead execution's stale lease."""
    import os
    import signal

    result = rig.send("durable", "rd", 1.0)
    first = rig.wait_event("rd", "start")[0]
    os.kill(int(first["pid"]), signal.SIGKILL)
    killed = time.monotonic()
    assert result.get(timeout=30) == "rd"
    starts = rig.journal("rd", "start")
    assert len(starts) == 2 and starts[1]["fence"] > first["fence"]
    assert len(rig.journal("rd", "end")) == 1  # the killed run never ended; the new one once
    # One lifetime, then the run (its 1 s body, a new pool process and the broker's
    # redelivery on a loaded machine): not a visibility timeout, and never dropped.
    assert time.monotonic() - killed < rig.ttl + 1.0 + 5.0


def test_revoked_before_running_never_takes_a_lease(rig: Rig) -> None:
    result = rig.send("hold", "r4", 0.1, "sleep", countdown=1.5)
    result.revoke()
    wait_for(lambda: result.state == "REVOKED", 10)
    assert rig.journal("r4", "start") == []
    assert [k for k in rig.leases.scan_iter("lease:{hold*") if b"r4" in k] == []


def test_running_task_revoked_with_terminate_leaves_no_lease(rig: Rig) -> None:
    result = rig.send("hold", "r4t", 30.0, "sleep")
    key = str(rig.wait_event("r4t", "start")[0]["key"])
    result.revoke(terminate=True)
    wait_for(
        lambda: not rig.leases.exists(key),
        rig.ttl + 1.0,
        interval=0.01,
        message="lease outlived one TTL after revoke(terminate=True)",
    )


def test_hard_time_limit_never_deletes_the_next_holders_lease(rig: Rig) -> None:
    """A is paused past its 0.6 s lifetime, B takes the key, then A's 1 s hard limit fires:
    whatever the parent runs for the killed child, B's lease stays B's."""
    rig.send("limited", "r6", 5.0)
    first = rig.wait_event("r6", "start")[0]
    key = str(first["key"])
    stop_process(int(first["pid"]))
    wait_for(lambda: not rig.leases.exists(key), 2.0, interval=0.01)
    rig.send("limited", "r6", 0.8)
    second = rig.wait_event("r6", "start", count=2)[1]
    token = str(second["token"])
    seen = []
    while not rig.journal("r6", "end"):
        raw = rig.leases.get(key)
        seen.append(raw)
        assert raw is None or raw.decode().startswith(token), "B's lease was touched"
        time.sleep(0.01)
    assert rig.journal("r6", "end")[0]["pid"] == second["pid"]
    assert len([s for s in seen if s]) > 10
    assert "Hard time limit" in rig.logs() or "TimeLimitExceeded" in rig.logs()


def test_conflict_policy_fail_stores_a_picklable_lease_conflict(rig: Rig) -> None:
    holder = rig.send("fail_on_conflict", "pf", 3.0)
    rig.wait_event("pf", "start")
    with pytest.raises(LeaseConflict) as info:
        rig.send("fail_on_conflict", "pf", 0.0).get(timeout=20)
    assert info.value.holder_task_id == holder.id
    assert pickle.loads(pickle.dumps(info.value)).args == info.value.args


def test_conflict_policy_retry_runs_after_the_holder(rig: Rig) -> None:
    rig.send("retry_on_conflict", "pr", 1.5)
    rig.wait_event("pr", "start")
    second = rig.send("retry_on_conflict", "pr", 0.0)
    assert second.get(timeout=30) == "pr"
    starts = rig.journal("pr", "start")
    # Waiting for the holder used up no retry: the copy waited in the key's line.
    assert len(starts) == 2 and starts[1]["retries"] == 0
    assert starts[1]["t"] >= rig.journal("pr", "end")[0]["t"]


def test_store_down_at_start_retries_then_runs(rig: Rig) -> None:
    rig.store.stop()
    try:
        result = rig.send("hold", "r12", 0.1, "sleep")
        wait_for(lambda: result.state == "RETRY", 15, message=lambda: rig.logs())
        assert rig.journal("r12", "start") == []
        assert "is unreachable (seen by acquire of lease:" in rig.logs()
    finally:
        rig.store.start()
    assert result.get(timeout=30) == "r12"


def test_store_down_past_the_outage_bound_fails_with_store_unavailable_without_running(
    rig: Rig,
) -> None:
    # The policy "retry" waits the outage out for lease_store_outage_max (1.5 s for this task),
    # then the execution fails (tests/test_store_outage.py: beyond max_retries).
    rig.store.stop()
    try:
        result = rig.send("short_outage", "r12x")
        with pytest.raises(LeaseStoreUnavailable) as info:
            result.get(timeout=30)
        assert info.value.operation == "acquire"
        assert rig.journal("r12x", "start") == []
        retries = sum(w.log_text().count(f"[{result.id}] retry: Retry in") for w in rig.workers)
        assert retries >= 2, rig.logs()
        assert any("lease_store_outage_max=1.5s" in w.log_text() for w in rig.workers)
    finally:
        rig.store.start()


def test_store_down_at_start_with_fail_policy_fails_without_running(
    broker: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    rig = Rig(broker, "solo", tmp_path_factory.mktemp("fail-policy"))
    try:
        rig.worker(LEASE_ON_STORE_ERROR="fail")
        rig.store.stop()
        with pytest.raises(LeaseStoreUnavailable) as info:
            rig.send("hold", "r12f", 0.1, "sleep").get(timeout=20)
        assert info.value.operation == "acquire"
        assert rig.journal("r12f", "start") == []
    finally:
        rig.close()


def test_conflict_visible_in_log_signal_and_event(rig: Rig) -> None:
    received: list[dict[str, object]] = []
    with rig.app.connection() as conn:
        recv = rig.app.events.Receiver(conn, handlers={"*": received.append})
        listener = threading.Thread(
            target=lambda: recv.capture(limit=None, timeout=30), daemon=True
        )
        listener.start()
        try:
            # The receiver is bound once it sees our own probe event.
            with rig.app.events.default_dispatcher() as dispatcher:
                wait_for(
                    lambda: (
                        dispatcher.send("probe") is None
                        and any(e["type"] == "probe" for e in received)
                    ),
                    10,
                    interval=0.2,
                )
            holder = rig.send("hold", "r16", 3.0, "sleep")
            rig.wait_event("r16", "start")
            rig.send("hold", "r16", 3.0, "sleep").get(timeout=20)
            skipped = wait_for(
                lambda: [e for e in received if e["type"] == "task-lease-skipped"], 10
            )[0]
        finally:
            recv.should_stop = True
    assert skipped["lease_holder_task_id"] == holder.id
    assert str(skipped["lease_key"]).startswith("lease:{hold:")
    assert rig.journal(event="conflict-signal")[0]["policy"] == "skip"
    # The skip line follows the stored marker, which follows the event: wait for it.
    wait_for(lambda: "skipped: task " in rig.logs(), 10, message="no skip line in the log")


def test_skipped_duplicate_get_returns_a_marker_not_a_hang(rig: Rig) -> None:
    rig.send("hold", "rs", 3.0, "sleep")
    rig.wait_event("rs", "start")
    try:
        marker = rig.send("hold", "rs", 3.0, "sleep").get(timeout=10)
    except CeleryTimeout:  # pragma: no cover - the failure this test exists for
        pytest.fail("AsyncResult.get() of a skipped duplicate hung")
    from celery_lease import is_skipped

    assert is_skipped(marker)
