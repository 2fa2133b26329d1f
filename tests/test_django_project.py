"""docs/howto/django.md run as a real Django project: Django, django-celery-beat, SQLite in a
temporary directory, and the private Redis in place of ``localhost:6379``.

- ``proj/__init__.py`` makes the project's app Celery's current app, so a ``.delay()`` from
  ``manage.py shell`` is published to ``CELERY_BROKER_URL``.
- Two real ``celery beat`` processes run ``LeasedScheduler`` wrapping django-celery-beat's
  ``DatabaseScheduler``: only the leader sends; when it is killed, the other leads and sends;
  a schedule change right after the take-over (``DatabaseScheduler`` then re-reads the older
  times of its database) does not make the new leader send again what the old one just sent.

The broker's queue is read directly (tests/support/django_project.py), so no worker is needed.
The same project on PostgreSQL, with the hand-over measured: tests/test_django_beat_handover.py.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import django_project as dj
from tests.support.waiting import wait_for

pytest.importorskip("django_celery_beat")

TTL = 1.5


@pytest.fixture
def project(tmp_path: Path, redis_url: str) -> Path:
    """The page's files, as written but for the Redis address, and the migrated database."""
    return dj.build(tmp_path, redis_url, dj.beat_settings(period=1.0, ttl=TTL))


@pytest.fixture
def beats(project: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    with dj.beats(project) as started:
        yield started


def test_delay_from_the_django_shell_goes_to_the_settings_broker(
    project: Path, redis_url: str
) -> None:
    out = dj.manage(
        project,
        "shell",
        "-c",
        "from accounts.tasks import sync_account; print(sync_account.delay(7).id)",
    )
    task_id = out.strip().splitlines()[-1]
    messages = dj.broker(redis_url).lrange(dj.QUEUE, 0, -1)
    assert [json.loads(m)["headers"]["id"] for m in messages] == [task_id]
    assert json.loads(messages[0])["headers"]["task"] == "accounts.tasks.sync_account"


def test_two_beats_wrapping_the_database_scheduler_send_from_the_leader_only(
    project: Path, redis_url: str, beats: list[subprocess.Popen[bytes]]
) -> None:
    beats += [dj.start_beat(project, "a"), dj.start_beat(project, "b")]
    by_pid = {beat.pid: beat for beat in beats}
    client = dj.broker(redis_url)
    leases = dj.leases(redis_url)

    def logs() -> str:
        return dj.logs(project)

    def senders() -> list[int]:
        return [send.pid for send in dj.sends(client)]

    first = wait_for(lambda: dj.leader(leases), 30, message=logs)
    wait_for(lambda: len(senders()) >= 3, 20, message=logs)
    assert set(senders()) == {first}  # the standby sent nothing
    with sqlite3.connect(project / "db.sqlite3") as db:  # the schedule lives in the database
        rows = db.execute(
            "SELECT task FROM django_celery_beat_periodictask WHERE name = 'sync-account-7'"
        ).fetchall()
    assert rows == [("accounts.tasks.sync_account",)]

    by_pid[first].send_signal(signal.SIGKILL)
    by_pid[first].wait(10)
    (other,) = set(by_pid) - {first}
    wait_for(lambda: dj.leader(leases) == other, TTL + 10, message=logs)
    sent = len(senders())
    wait_for(lambda: len(senders()) >= sent + 2, 20, message=logs)
    assert set(senders()[sent:]) == {other}


def test_a_schedule_change_after_a_take_over_does_not_resend_what_the_old_leader_sent(
    tmp_path: Path, redis_url: str
) -> None:
    # DatabaseScheduler writes last_run_at to the database every few minutes, and re-reads
    # its entries from there when the schedule changes (an edit in Django's admin).
    period = 6.0
    project = dj.build(tmp_path, redis_url, dj.beat_settings(period=period, ttl=TTL))
    client = dj.broker(redis_url)
    leases = dj.leases(redis_url)

    def logs() -> str:
        return dj.logs(project)

    with dj.beats(project) as beats:
        beats += [dj.start_beat(project, "a"), dj.start_beat(project, "b")]
        by_pid = {beat.pid: beat for beat in beats}
        wait_for(lambda: len(dj.sends(client)) >= 2, 3 * period, interval=0.01, message=logs)
        last = dj.sends(client)[-1]
        old = last.pid
        # Right after the send is in the last-run record; the database did not see it.
        wait_for(lambda: dj.recorded(leases) >= last.at, 5, interval=0.005)
        by_pid[old].send_signal(signal.SIGKILL)
        by_pid[old].wait(10)
        (new,) = set(by_pid) - {old}
        wait_for(lambda: dj.leader(leases) == new, TTL + 10, message=logs)
        dj.manage(
            project,
            "shell",
            "-c",
            "from django_celery_beat.models import PeriodicTasks; PeriodicTasks.update_changed()",
        )
        seen = wait_for(lambda: dj.sends(client)[2:], 3 * period, interval=0.02, message=logs)
    assert seen[0].pid == new
    gap = seen[0].at - dj.sends(client)[1].at
    assert gap > period - 1.5, f"sent again {gap:.2f}s after the old leader's send\n{logs()}"
