"""The heartbeat's timing rules, on a fake deadline clock: fast, and exact to the microsecond.

The store is a real Redis; only the clock (``celery_lease.base.clock.now``, the seam every deadline
is measured on) is moved by hand. The heartbeat under test is a private instance whose thread
never starts: each test drives its passes itself.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import redis

from celery_lease import LeaseLost, store
from celery_lease.base import clock
from celery_lease.core.heartbeat import Heartbeat, plan_pass
from celery_lease.core.lease import Lease
from celery_lease.settings.config import resolve_options

T0 = 1000.0


class FakeClock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


class Recorder:
    mechanism = "none"

    def __init__(self) -> None:
        self.delivered: list[LeaseLost] = []

    def deliver(self, error: LeaseLost) -> bool:
        self.delivered.append(error)
        return True

    def finish(self) -> None:
        pass


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(clock, "now", fake)
    return fake


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return store.client_for(redis_url, 0.5)


def take(
    client: redis.Redis, name: str, sent_at: float = T0, ttl: float = 3.0, **options: float
) -> Lease:
    """A lease granted by the real store, its times counted from ``sent_at``."""
    opts = resolve_options({}, {"lease_ttl": ttl, **options}, "test")
    key, token = f"lease:{{{name}}}", f"{name:0<32}"[:32]
    assert store.acquire(client, key, token, opts.ttl_ms, "{}").granted
    return Lease(
        key=key,
        token=token,
        fencing_token=1,
        task_name="t",
        task_id=name,
        options=opts,
        client=client,
        target=Recorder(),
        sent_at=sent_at,
    )


class Driven(Heartbeat):
    """A heartbeat whose passes the test runs: its thread is never started."""

    def __init__(self, leases: list[Lease]) -> None:
        super().__init__()
        self._leases.update(leases)


def test_a_lease_past_its_deadline_is_lost_before_anything_is_sent(
    client: redis.Redis,
    fake_clock: FakeClock,
) -> None:
    late = take(client, "late")
    due = take(client, "due", sent_at=T0 + 1.0)
    fake_clock.t = late.deadline  # `due` is also due for renewal (interval 1 s)
    plan = plan_pass([late, due], fake_clock.t)
    assert plan.expired == [late] and plan.renew == [due]
    beat = Driven([late, due])
    beat._pass()
    assert late.lost and late.target.delivered[0].cause == "deadline"  # type: ignore[attr-defined]
    assert late not in beat.held()
    assert due.confirmed_at == fake_clock.t and not due.lost  # renewed after the loss


def test_leases_due_within_half_an_interval_ride_along_in_one_round_trip(
    client: redis.Redis,
    fake_clock: FakeClock,
) -> None:
    first = take(client, "a")  # interval 1 s: due at T0 + 1
    close = take(client, "b", sent_at=T0 + 0.4)  # due at T0 + 1.4: within half an interval
    far = take(client, "c", sent_at=T0 + 0.6)  # due at T0 + 1.6: not yet
    fake_clock.t = T0 + 1.0
    assert plan_pass([first, close, far], fake_clock.t).renew == [first, close]
    for lease in (first, close, far):  # mark the server's lifetimes to see which got renewed
        client.pexpire(lease.key, 1000)
    beat = Driven([first, close, far])
    beat._pass()
    assert beat.passes == 1
    assert [x.next_renewal for x in (first, close, far)] == [T0 + 2.0, T0 + 2.0, T0 + 1.6]
    assert first.deadline == T0 + 1.0 + 3.0 - first.options.drift_margin
    assert [client.pttl(x.key) > 2000 for x in (first, close, far)] == [True, True, False]


def test_nothing_due_sends_nothing_and_wakes_at_the_next_renewal(
    client: redis.Redis,
    fake_clock: FakeClock,
) -> None:
    a = take(client, "a")
    b = take(client, "b", sent_at=T0 + 0.3)
    fake_clock.t = T0 + 0.5
    plan = plan_pass([a, b], fake_clock.t)
    assert (plan.expired, plan.renew, plan.wake) == ([], [], T0 + 1.0)


def test_no_round_trip_is_sent_whose_timeout_could_outlive_a_deadline(
    client: redis.Redis,
    fake_clock: FakeClock,
) -> None:
    # store timeout 0.5 s; `ending` has 0.4 s left: a renewal sent now could still be on the
    # wire when that deadline passes, so the pass waits for the deadline instead.
    ending = take(client, "ending", ttl=3.0)
    fake_clock.t = ending.deadline - 0.4
    plan = plan_pass([ending], fake_clock.t)
    assert plan.renew == [] and plan.wake == ending.deadline
    fake_clock.t = ending.deadline - 0.6  # now the call's timeout ends before the deadline
    assert plan_pass([ending], fake_clock.t).renew == [ending]


def test_a_failed_renewal_is_retried_after_a_third_of_an_interval_until_the_deadline(
    fake_clock: FakeClock,
) -> None:
    with socket.socket() as s:  # a port nothing listens on: every call fails at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = store.client_for(f"redis://127.0.0.1:{port}/0", 0.5)
    opts = resolve_options({}, {"lease_ttl": 6.0}, "test")  # interval 2 s
    lease = Lease(
        key="lease:{x}",
        token="x" * 32,
        fencing_token=1,
        task_name="t",
        task_id="x",
        options=opts,
        client=dead,
        target=Recorder(),
        sent_at=T0,
    )
    beat = Driven([lease])
    fake_clock.t = T0 + 2.0
    beat._pass()
    assert lease.next_renewal == pytest.approx(T0 + 2.0 + 2.0 / 3)
    assert not lease.lost and lease.store_error is None  # no answer is not an error reply
    fake_clock.t = T0 + 2.5  # before the retry is due: nothing is sent
    assert plan_pass([lease], fake_clock.t).renew == []
    fake_clock.t = lease.deadline
    beat._pass()
    assert lease.lost and lease.target.delivered[0].cause == "deadline"  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _no_leftovers(client: redis.Redis) -> Iterator[None]:
    yield
    client.flushdb()


def test_an_emptied_heartbeat_waits_a_second_before_it_waits_for_no_time_limit(
    client: redis.Redis,
) -> None:
    # Between back-to-back executions the set is empty for a moment: a timed wait there lets
    # the next add() (and the release's wake_for_pending) go without waking the thread; an
    # idle process still ends in a wait without a time limit (no wake-up every second).
    import math
    import time

    beat = Heartbeat()
    lease = take(client, "emptied", sent_at=clock.now(), ttl=30.0)
    beat.add(lease)
    beat.remove(lease)
    deadline = time.monotonic() + 10.0
    while not (math.isfinite(beat._wake_at) and beat._wake_at <= clock.now() + 1.0):
        assert time.monotonic() < deadline, "the emptied heartbeat never waited a second"
        time.sleep(0.005)
    while beat._wake_at != math.inf:
        assert time.monotonic() < deadline, "the idle heartbeat never waited without a limit"
        time.sleep(0.01)
    again = take(client, "again", sent_at=clock.now(), ttl=30.0)
    beat.add(again)  # a wait without a limit is notified: the lease is planned at once
    while not math.isfinite(beat._wake_at):
        assert time.monotonic() < deadline, "add() did not wake the idle heartbeat"
        time.sleep(0.005)
    assert beat.held() == [again]
    beat.remove(again)
