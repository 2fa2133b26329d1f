"""HA beat the way a Django shop runs it: docs/howto/django.md's project on a real PostgreSQL
(a private database on localhost:5432, dropped afterwards), two real ``celery beat`` processes
running ``LeasedScheduler`` wrapping django-celery-beat's ``DatabaseScheduler``.

- ``SIGKILL`` of the leader: the standby leads when the leader lease expires (within one
  ``lease_beat_ttl`` of the kill), and the slot the old leader sent just before it died is not
  sent again, although the database's ``last_run_at`` says it ran long ago.
- ``SIGTERM`` of the leader: it releases the lease on its way out and the standby leads at
  once (before its next try, a renew interval later, would have), again sending no slot twice.
- An edit of a ``PeriodicTask`` through the ORM (what the admin does; it bumps
  ``PeriodicTasks.changed``) is picked up by the leader, by the standby of the moment of the edit
  once it leads, and by that new leader for an edit made while it leads.

Sends are read from the broker's queue, each stamped with its publish time and sender
(tests/support/django_project.py). The figures are printed in the session's "measured by the
tests" summary and stated in docs/howto/django.md.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from celery_lease.beat.scheduler import RESEND_SLACK
from tests.support import django_project as dj
from tests.support.postgres import PrivateDatabase
from tests.support.rig import measured
from tests.support.waiting import wait_for

pytest.importorskip("django_celery_beat")

TTL = 1.5  # lease_beat_ttl
RENEW = TTL / 3  # lease_beat_renew_interval's default
MAX_INTERVAL = 1  # beat_max_loop_interval
LOOP = min(MAX_INTERVAL, RENEW)  # how often the leader looks at the database, at the latest
# Longer than a take-over after SIGKILL (at most TTL), so a slot sent again shows as a short gap.
PERIOD = 3.0
# How close two sends of an entry may be: a send the last-run record calls due within
# RESEND_SLACK goes out (docs/operations.md), after a re-read of older times from the database.
CLOSEST = PERIOD - RESEND_SLACK - 0.2
SLACK = 0.3  # float seconds a loaded machine may add to a bound (process wake-ups, polling)
# How late a send may run after its due time on a loaded machine: each DatabaseScheduler loop
# reads the database first (with Django's CONN_MAX_AGE = 0, on a new connection every time).
LATE = float(MAX_INTERVAL)
STARTUP = 60.0  # two beats starting on a busy machine
ADMIN_ENTRY = "sync-account-8"

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def project(tmp_path: Path, redis_url: str, postgres_db: PrivateDatabase) -> Path:
    settings = postgres_db.django_settings() + dj.beat_settings(PERIOD, TTL, MAX_INTERVAL)
    return dj.build(tmp_path, redis_url, settings)


@pytest.fixture
def beats(project: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    with dj.beats(project) as started:
        yield started


@dataclass(frozen=True)
class Handover:
    """The beat that leads after the signal, and when."""

    new: int  # its pid
    at: float  # when the old leader was signalled, epoch seconds
    took: float  # float seconds from the signal to the new leader's lead
    left: float  # the leader lease's lifetime left when the signal was sent, float seconds


class Pair:
    """The two beats of a test, the broker's queue and the leader lease."""

    def __init__(self, project: Path, redis_url: str, beats: list[subprocess.Popen[bytes]]):
        self.project = project
        beats += [dj.start_beat(project, "a"), dj.start_beat(project, "b")]
        self.by_pid = {beat.pid: beat for beat in beats}
        self.broker = dj.broker(redis_url)
        self.leases: redis.Redis = dj.leases(redis_url)

    def logs(self) -> str:
        return dj.logs(self.project)

    def sends(self, entry: str = dj.ENTRY) -> list[dj.Send]:
        return [send for send in dj.sends(self.broker) if send.entry == entry]

    def stop_right_after_a_send(self, sig: signal.Signals, recorded: bool) -> Handover:
        """Signal the leader just after it sent (the database has not seen that run), once
        the send is in the last-run record if ``recorded``, and wait for the other beat to
        lead (polling every 10 ms)."""
        before = len(wait_for(self.sends, STARTUP, message=self.logs))
        wait_for(lambda: len(self.sends()) > before, PERIOD + 10, interval=0.005)
        last = self.sends()[-1]
        if recorded:
            wait_for(lambda: dj.recorded(self.leases) >= last.at, 5, interval=0.005)
        old = last.pid
        (new,) = set(self.by_pid) - {old}
        left = self.leases.pttl(dj.BEAT_KEY) / 1000
        signalled, at = time.monotonic(), time.time()
        self.by_pid[old].send_signal(sig)
        wait_for(lambda: dj.leader(self.leases) == new, TTL + 10, 0.01, self.logs)
        took = time.monotonic() - signalled
        assert self.by_pid[old].wait(10) is not None
        return Handover(new, at, took, left)

    def check_sends(self, new: int, after: int = 2) -> tuple[float, float, float]:
        """Wait for ``after`` sends by ``new``; check that the old leader sent nothing after it
        and that no two sends are closer than CLOSEST. Returns when the old leader's last send
        and the new one's first were made (epoch seconds) and the shortest gap (seconds)."""
        wait_for(lambda: [s for s in self.sends() if s.pid == new][after - 1 :], 4 * PERIOD)
        sent = self.sends()
        first = next(i for i, send in enumerate(sent) if send.pid == new)
        assert {send.pid for send in sent[first:]} == {new}, self.logs()
        gaps = [b.at - a.at for a, b in itertools.pairwise(sent)]
        assert min(gaps) > CLOSEST, f"a slot sent twice: gaps {gaps}\n{self.logs()}"
        return sent[first - 1].at, sent[first].at, min(gaps)


def test_a_killed_leader_is_replaced_within_the_ttl_and_no_slot_is_sent_twice(
    project: Path, redis_url: str, beats: list[subprocess.Popen[bytes]]
) -> None:
    pair = Pair(project, redis_url, beats)
    # After the send's record: a kill in the instant between the two (one round trip to
    # Redis) leaves the record at the send before, and that slot is sent again.
    handover = pair.stop_right_after_a_send(signal.SIGKILL, recorded=True)
    # The standby leads when the killed leader's lease ends (it asks again at the moment the
    # store says it does): not before, and not a renew interval later. So within one TTL.
    late = handover.took - handover.left
    assert -SLACK < late <= SLACK and handover.took <= TTL + SLACK, pair.logs()
    last, first, closest = pair.check_sends(handover.new)
    gap = first - last
    # The new leader loaded the old one's last send from the record: the slot after it is due
    # one period later, or at the take-over (at most TTL after the kill) if that is later.
    assert gap <= max(PERIOD, handover.at - last + TTL) + LATE, pair.logs()
    measured("django beat SIGKILL: kill -> new leader", "postgresql", handover.took)
    measured("django beat SIGKILL: lease end -> new leader", "postgresql", late)
    measured("django beat SIGKILL: last send -> next send", "postgresql", gap)
    measured("django beat SIGKILL: closest two sends", "postgresql", closest)


def test_a_stopped_leader_hands_over_at_its_release_and_no_slot_is_sent_twice(
    project: Path, redis_url: str, beats: list[subprocess.Popen[bytes]]
) -> None:
    pair = Pair(project, redis_url, beats)
    # At once: a stop that arrives between the send and its record waits for the record.
    handover = pair.stop_right_after_a_send(signal.SIGTERM, recorded=False)
    assert handover.took < RENEW, pair.logs()  # woken by the release, not at its next try
    assert "beat: released leadership" in pair.logs()
    last, first, closest = pair.check_sends(handover.new)
    gap = first - last
    # A take-over within milliseconds of the last send: one period separates the two sends.
    assert gap <= PERIOD + LATE, pair.logs()
    measured("django beat SIGTERM: stop -> new leader", "postgresql", handover.took)
    measured("django beat SIGTERM: last send -> next send", "postgresql", gap)
    measured("django beat SIGTERM: closest two sends", "postgresql", closest)


def _admin(project: Path, code: str) -> float:
    """Run ORM code in ``manage.py shell`` as the admin's save would; returns the time of the
    change django-celery-beat recorded (``PeriodicTasks.last_change()``, epoch seconds)."""
    out = dj.manage(
        project,
        "shell",
        "-c",
        "from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks\n"
        f"{code}\nprint(PeriodicTasks.last_change().timestamp())",
    )
    return float(out.strip().splitlines()[-1])


def _every(seconds: int) -> str:
    return f"IntervalSchedule.objects.get_or_create(every={seconds}, period='seconds')[0]"


def _edit(project: Path, every: int, args: str) -> float:
    return _admin(
        project,
        f"task = PeriodicTask.objects.get(name={ADMIN_ENTRY!r})\n"
        f"task.interval = {_every(every)}\ntask.args = {args!r}\ntask.save()",
    )


def test_an_edit_of_a_periodic_task_is_picked_up_by_whichever_beat_leads(
    project: Path, redis_url: str, beats: list[subprocess.Popen[bytes]]
) -> None:
    _admin(  # an entry added in the admin: 4 s, account 8
        project,
        f"PeriodicTask.objects.create(name={ADMIN_ENTRY!r}, task='accounts.tasks.sync_account', "
        f"interval={_every(4)}, args='[8]')",
    )
    pair = Pair(project, redis_url, beats)

    def admin_sends() -> list[dj.Send]:
        return pair.sends(ADMIN_ENTRY)

    def sent_with(args: str, count: int) -> list[dj.Send]:
        return [s for s in admin_sends() if s.args == args][count - 1 :]

    wait_for(lambda: sent_with("[8]", 2), STARTUP, message=pair.logs)
    first = admin_sends()[0].pid
    changed = _edit(project, every=2, args="[9]")  # while `first` leads; the other stands by
    wait_for(lambda: sent_with("[9]", 2), 10, message=pair.logs)
    picked = sent_with("[9]", 1)  # from the first send with the edited values on
    # Seen at the leader's next look at the database, sent when the edited schedule says.
    assert picked[0].at - changed <= LOOP + 2 + LATE, pair.logs()
    assert {s.pid for s in admin_sends()} == {first}
    assert {s.args for s in admin_sends() if s.at >= picked[0].at} == {"[9]"}, pair.logs()
    measured("django beat: edit -> send, by the leader", "postgresql", picked[0].at - changed)

    pair.by_pid[first].send_signal(signal.SIGKILL)
    (second,) = set(pair.by_pid) - {first}
    wait_for(lambda: dj.leader(pair.leases) == second, TTL + 10, 0.01, pair.logs)
    wait_for(lambda: [s for s in admin_sends() if s.pid == second][1:], 10, message=pair.logs)
    by_second = [s for s in admin_sends() if s.pid == second]
    assert {s.args for s in by_second} == {"[9]"}, pair.logs()  # the edit it had not run
    assert 2 - RESEND_SLACK - 0.2 < by_second[1].at - by_second[0].at < 4 - SLACK  # every 2 s

    changed = _edit(project, every=2, args="[10]")  # while the standby of the first edit leads
    picked = wait_for(lambda: sent_with("[10]", 1), 10, message=pair.logs)
    assert picked[0].pid == second
    assert picked[0].at - changed <= LOOP + 2 + LATE, pair.logs()
    after = [s.args for s in admin_sends() if s.at >= picked[0].at]
    assert set(after) == {"[10]"}, pair.logs()  # the old arguments are not sent again
    measured("django beat: edit -> send, by a new leader", "postgresql", picked[0].at - changed)
