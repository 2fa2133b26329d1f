"""Fault tests on real workers, in every pool: the lease is lost, the task is told.

Each pool gets one worker (module scope) against a broker and a separate lease store that the
tests delete keys from, pause, restart and kill. TTL 1.5 s, so the renew interval is 0.5 s.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from harness.redis_server import RedisServer
from harness.waiting import wait_for
from tests.support.rig import MODE, POOLS, Rig, measured, resume_process, stop_process


@pytest.fixture(scope="module", params=POOLS)
def rig(
    request: pytest.FixtureRequest, broker: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rig]:
    rig = Rig(broker, request.param, tmp_path_factory.mktemp(request.param))
    rig.worker()
    yield rig
    rig.close()


@pytest.fixture
def pool_rig(rig: Rig) -> Rig:
    rig.reset()
    return rig


def start_holder(rig: Rig, tag: str, seconds: float = 30.0) -> dict[str, object]:
    rig.send("hold", tag, seconds, MODE.get(rig.pool, "sleep"))
    return rig.wait_event(tag, "start")[0]


def test_deleted_key_renewal_refused_raises_lease_lost(pool_rig: Rig) -> None:
    rig = pool_rig
    start = start_holder(rig, "refused")
    rig.leases.delete(str(start["key"]))
    deleted_at = time.time()
    lost = rig.wait_event("refused", "lost")[0]
    assert lost["cause"] == "refused"
    assert lost["is_soft_limit"] is True
    latency = lost["t"] - deleted_at
    measured("refused -> LeaseLost in sleep", rig.pool, latency)
    interval = rig.ttl / 3
    assert latency < interval + 0.5  # one interval plus a round trip (generous on 2 cores)
    if rig.pool != "threads":  # a blocking sleep was interrupted: no step after it
        assert rig.journal("refused", "step") == []
    wait_for(lambda: rig.journal(event="lost-signal"), 5, message="no lease_lost signal")


def test_pure_python_loop_catches_lease_lost_in_its_own_try(pool_rig: Rig) -> None:
    """A busy body's own ``except LeaseLost`` sees the loss, on every Python (on 3.13 an
    exception raised at a loop's backward jump skips the ``try`` around the loop)."""
    rig = pool_rig
    if rig.pool in ("gevent", "eventlet"):
        pytest.skip("a green thread that never yields cannot be interrupted (test_pool_specific)")
    rig.send("spin", "spin", 30.0)
    start = rig.wait_event("spin", "start")[0]
    rig.leases.delete(str(start["key"]))
    lost = rig.wait_event("spin", "lost", timeout=10)[0]
    assert lost["cause"] == "refused"
    assert rig.journal("spin", "end") == []
    wait_for(lambda: rig.lease_keys() == [], 5, message="the lost lease is still held")


def test_overwritten_key_is_refused_and_left_alone(pool_rig: Rig) -> None:
    rig = pool_rig
    start = start_holder(rig, "overwritten")
    rig.leases.set(str(start["key"]), "someone-else:1:{}", px=60_000)
    lost = rig.wait_event("overwritten", "lost")[0]
    assert lost["cause"] == "refused"
    wait_for(
        lambda: (
            rig.journal("overwritten", "end") == []
            and rig.leases.get(str(start["key"])) == b"someone-else:1:{}"
        ),
        5,
    )
    assert 50_000 < rig.leases.pttl(str(start["key"])) <= 60_000  # not renewed, not deleted


def test_store_paused_raises_by_the_local_deadline(pool_rig: Rig) -> None:
    rig = pool_rig
    start_holder(rig, "paused")
    rig.store.pause()
    try:
        lost = rig.wait_event("paused", "lost", timeout=15)[0]
    finally:
        rig.store.resume()
    assert lost["cause"] == "deadline"
    late = lost["at"] - lost["deadline"]
    measured("deadline -> LeaseLost in sleep", rig.pool, late)
    assert 0 <= late < 0.25
    # (That the server still held the key at that moment is asserted with a black-holed
    # store in test_pool_specific, where the test can still reach the server.)


def test_store_restarted_lease_lost_then_new_leases_work(pool_rig: Rig) -> None:
    rig = pool_rig
    start_holder(rig, "restart")
    rig.store.restart()
    lost = rig.wait_event("restart", "lost", timeout=15)[0]
    assert lost["cause"] in ("refused", "deadline")  # refused once it reconnects in time
    rig.send("hold", "after-restart", 0.2, "sleep")
    rig.wait_event("after-restart", "end", timeout=15)
    wait_for(lambda: rig.lease_keys() == [], 5, message="lease left after the run")


def test_killed_holder_lease_gone_within_one_ttl(pool_rig: Rig) -> None:
    """prefork: the pool child is killed; other pools: the whole worker process."""
    rig = pool_rig
    victim = None
    if rig.pool == "prefork":
        start = start_holder(rig, "killed")
    else:
        victim = rig.worker(queue=rig.queue + "-victim")
        rig.send("hold", "killed", 30.0, MODE.get(rig.pool, "sleep"), queue=victim.queue)
        start = rig.wait_event("killed", "start")[0]
    key = str(start["key"])
    os.kill(int(start["pid"]), signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: not rig.leases.exists(key), rig.ttl + 1.0, interval=0.01)
    gone = time.monotonic() - killed_at
    measured("SIGKILL -> key gone (TTL 1.5)", rig.pool, gone)
    assert gone <= rig.ttl + 0.2
    rig.send("hold", "killed", 0.1, "sleep")
    rig.wait_event("killed", "end", timeout=15)
    if victim is not None:
        victim.kill()
        rig.workers.remove(victim)


def test_stray_lease_signal_is_ignored_and_the_worker_keeps_consuming(pool_rig: Rig) -> None:
    """SIGUSR2 outside a leased body (or for no armed lease) must never raise or kill.

    Only where task bodies run on a process's main thread (prefork children, solo) does the
    lease signal have a handler; other pools never send it.
    """
    rig = pool_rig
    if rig.pool not in ("prefork", "solo"):
        pytest.skip("this pool delivers LeaseLost without a signal")
    worker = rig.workers[0]
    for n in range(4):  # every prefork child has run a leased body: handlers installed
        rig.send("hold", f"stray-{n}", 0.3, "sleep")
    for n in range(4):
        rig.wait_event(f"stray-{n}", "end")
    pids = worker.child_pids() if rig.pool == "prefork" else [worker.pid]
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)
    running = rig.send("hold", "stray-body", 0.5, "sleep")
    rig.wait_event("stray-body", "start")
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)  # during a body whose lease is fine
    assert running.get(timeout=15) == "stray-body"
    assert rig.send("hold", "stray-after", 0.05, "sleep").get(timeout=15) == "stray-after"
    assert all(w.is_running() for w in rig.workers)


def test_paused_past_lifetime_successor_runs_old_holder_learns_first(
    pool_rig: Rig,
) -> None:
    """A is paused past its lease's lifetime, B takes over, A resumes: A learns of the loss
    before it can act again, and its release leaves B's lease alone."""
    rig = pool_rig
    start = start_holder(rig, "paused-holder")
    key = str(start["key"])
    pid = rig.holder_pid(key)
    other_queue = rig.queue + "-b"
    b = rig.worker(pool="solo", queue=other_queue)
    try:
        stop_process(pid)
        stopped_at = time.time()
        try:
            wait_for(lambda: not rig.leases.exists(key), rig.ttl + 2, interval=0.01)
            rig.send("hold", "paused-holder", 3.0, "sleep", queue=other_queue)
            b_start = rig.wait_event("paused-holder", "start", count=2)[1]
            assert b_start["fence"] > start["fence"]
        finally:
            resume_process(pid)
        lost = rig.wait_event("paused-holder", "lost")[0]
        assert lost["pid"] == pid and lost["cause"] == "deadline"
        # A did nothing more as holder after the pause: no step, no end.
        assert [
            e
            for e in rig.journal("paused-holder")
            if e["pid"] == pid and e["event"] in ("step", "end") and e["t"] > stopped_at
        ] == []
        # A's release left B's lease alone, and B finishes undisturbed.
        held = rig.leases.get(key)
        assert held is not None and held.decode().startswith(str(b_start["token"]))
        rig.wait_event("paused-holder", "end", timeout=15)
        assert len(rig.journal("paused-holder", "lost")) == 1
    finally:
        b.kill()
        rig.workers.remove(b)


def test_other_producers_refused_while_the_holder_runs(pool_rig: Rig) -> None:
    """send_task twice while a first execution runs; the holder is untouched."""
    rig = pool_rig
    if rig.pool == "solo":
        pytest.skip("solo runs one task at a time: a duplicate waits in the queue")
    start = start_holder(rig, "dup", seconds=4.0)
    key = str(start["key"])
    before = rig.leases.get(key)
    results = [rig.send("hold", "dup", 4.0, "sleep") for _ in range(2)]
    values = [r.get(timeout=15) for r in results]
    assert all(v["lease_skipped"] is True for v in values)
    assert values[0]["holder_task_id"] and values[0]["key"] == key
    assert rig.leases.get(key) == before
    assert len(rig.journal("dup", "start")) == 1
    assert len(rig.journal(event="conflict-signal")) == 2
