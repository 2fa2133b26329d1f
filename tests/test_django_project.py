"""docs/howto/django.md run as a real Django project: Django, django-celery-beat, SQLite in a
temporary directory, and the private Redis in place of ``localhost:6379``.

- ``proj/__init__.py`` makes the project's app Celery's current app, so a ``.delay()`` from
  ``manage.py shell`` is published to ``CELERY_BROKER_URL``.
- Two real ``celery beat`` processes run ``LeasedScheduler`` wrapping django-celery-beat's
  ``DatabaseScheduler``: only the leader sends; when it is killed, the other leads and sends;
  a schedule change right after the take-over (``DatabaseScheduler`` then re-reads the older
  times of its database) does not make the new leader send again what the old one just sent.

The broker's queue is read directly (a Redis list of JSON messages), so no worker is needed:
each message's ``origin`` header names the process that sent it.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_lease import store
from tests.support.waiting import wait_for
from tests.test_docs_snippets import _local
from tests.test_testing_plugin import titled_blocks, write_project

pytest.importorskip("django_celery_beat")

BEAT_KEY = "shop-lease:{celery.beat:proj}"  # CELERY_LEASE_KEY_PREFIX and the app's name
QUEUE = "celery"  # the default queue: the broker's Redis list of messages
TTL = 1.5
# A period django-celery-beat can store (its IntervalSchedule counts whole seconds) and a
# short leader lease, so that a take-over fits in a test.
FAST_BEAT = f"""
CELERY_BEAT_SCHEDULE = {{
    "sync-account-7": {{"task": "accounts.tasks.sync_account", "schedule": 1.0, "args": [7]}},
}}
CELERY_LEASE_BEAT_TTL = {TTL}
CELERY_BEAT_MAX_LOOP_INTERVAL = 1
"""


@pytest.fixture
def project(tmp_path: Path, redis_url: str) -> Path:
    """The page's files, as written but for the Redis address, and the migrated database."""
    files = {
        name: _local(body, redis_url) for name, body in titled_blocks("howto/django.md").items()
    }
    files["proj/settings.py"] += FAST_BEAT
    files["accounts/__init__.py"] = ""  # a Django app is a package
    write_project(tmp_path, files)
    migrate = subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0"],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrate.returncode == 0, migrate.stderr
    return tmp_path


def _env(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(root),
        "DJANGO_SETTINGS_MODULE": "proj.settings",
        "PYTHONUNBUFFERED": "1",
    }


def _broker(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/0")


def _senders(client: redis.Redis) -> list[int]:
    """The pid of the process that sent each message waiting in the queue, oldest first."""
    messages = [json.loads(m) for m in reversed(client.lrange(QUEUE, 0, -1))]
    return [int(m["headers"]["origin"][3:].split("@")[0]) for m in messages]


def test_delay_from_the_django_shell_goes_to_the_settings_broker(
    project: Path, redis_url: str
) -> None:
    shell = subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "shell",
            "-c",
            "from accounts.tasks import sync_account; print(sync_account.delay(7).id)",
        ],
        cwd=project,
        env=_env(project),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shell.returncode == 0, shell.stderr
    task_id = shell.stdout.strip().splitlines()[-1]
    messages = [json.loads(m) for m in _broker(redis_url).lrange(QUEUE, 0, -1)]
    assert [m["headers"]["id"] for m in messages] == [task_id]
    assert messages[0]["headers"]["task"] == "accounts.tasks.sync_account"


@pytest.fixture
def beats(project: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for beat in started:
        if beat.poll() is None:
            os.killpg(beat.pid, signal.SIGKILL)
        beat.wait(10)


def _beat(project: Path, name: str) -> subprocess.Popen[bytes]:
    with open(project / f"beat-{name}.log", "wb") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "proj",
                "beat",
                "-l",
                "info",
                "-s",
                str(project / f"schedule-{name}"),
            ],
            cwd=project,
            env=_env(project),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _logs(project: Path) -> str:
    return "\n".join(
        f"--- beat {n}\n{(project / f'beat-{n}.log').read_text()[-2000:]}" for n in "ab"
    )


def _leader(leases: redis.Redis) -> int | None:
    """The pid of the beat holding the leader lease."""
    value = leases.get(BEAT_KEY)
    return store.parse_value(value).pid if value else None


def test_two_beats_wrapping_the_database_scheduler_send_from_the_leader_only(
    project: Path, redis_url: str, beats: list[subprocess.Popen[bytes]]
) -> None:
    beats += [_beat(project, "a"), _beat(project, "b")]
    by_pid = {beat.pid: beat for beat in beats}
    client = _broker(redis_url)
    leases = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/1")

    def logs() -> str:
        return _logs(project)

    def leader() -> int | None:
        return _leader(leases)

    first = wait_for(leader, 30, message=logs)
    wait_for(lambda: len(_senders(client)) >= 3, 20, message=logs)
    assert set(_senders(client)) == {first}  # the standby sent nothing
    with sqlite3.connect(project / "db.sqlite3") as db:  # the schedule lives in the database
        rows = db.execute(
            "SELECT task FROM django_celery_beat_periodictask WHERE name = 'sync-account-7'"
        ).fetchall()
    assert rows == [("accounts.tasks.sync_account",)]

    by_pid[first].send_signal(signal.SIGKILL)
    by_pid[first].wait(10)
    (other,) = set(by_pid) - {first}
    wait_for(lambda: leader() == other, TTL + 10, message=logs)
    sent = len(_senders(client))
    wait_for(lambda: len(_senders(client)) >= sent + 2, 20, message=logs)
    assert set(_senders(client)[sent:]) == {other}


def test_a_schedule_change_after_a_take_over_does_not_resend_what_the_old_leader_sent(
    project: Path, redis_url: str, beats: list[subprocess.Popen[bytes]]
) -> None:
    # DatabaseScheduler writes last_run_at to the database every few minutes, and re-reads
    # its entries from there when the schedule changes (an edit in Django's admin).
    period = 6
    with open(project / "proj" / "settings.py", "a") as settings:
        settings.write(f'\nCELERY_BEAT_SCHEDULE["sync-account-7"]["schedule"] = {period}.0\n')
    beats += [_beat(project, "a"), _beat(project, "b")]
    by_pid = {beat.pid: beat for beat in beats}
    client = _broker(redis_url)
    leases = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/1")
    seen: list[tuple[int, float]] = []  # (sender, when this test first saw the message)

    def watch() -> int:
        senders = _senders(client)
        seen.extend((pid, time.monotonic()) for pid in senders[len(seen) :])
        return len(seen)

    def logs() -> str:
        return _logs(project)

    wait_for(lambda: watch() >= 2, 3 * period, interval=0.02, message=logs)
    old = seen[-1][0]
    by_pid[old].send_signal(signal.SIGKILL)  # right after a send: the database did not see it
    by_pid[old].wait(10)
    (new,) = set(by_pid) - {old}
    wait_for(lambda: _leader(leases) == new, TTL + 10, message=logs)
    changed = subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "shell",
            "-c",
            "from django_celery_beat.models import PeriodicTasks; PeriodicTasks.update_changed()",
        ],
        cwd=project,
        env=_env(project),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert changed.returncode == 0, changed.stderr
    wait_for(lambda: watch() >= 3, 3 * period, interval=0.02, message=logs)
    assert seen[2][0] == new
    gap = seen[2][1] - seen[1][1]
    assert gap > period - 1.5, f"sent again {gap:.2f}s after the old leader's send\n{logs()}"
