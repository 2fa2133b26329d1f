"""docs/howto/django.md's Django project, built in a directory and run with real processes.

The page's titled blocks are written as they are, but for the Redis address (the private
server) and what a test appends to the settings: the beat's periods and leader TTL
(:func:`beat_settings`), another database (a :class:`~tests.support.postgres.PrivateDatabase`'s
``DATABASES``). Every message a process of the project publishes carries its publish time
(header ``sent_at``, float seconds since the epoch, this host's clock), and its ``origin`` header
names the process, so the broker's queue (a Redis list) tells who sent what and when: no worker
is needed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from celery_lease import store
from celery_lease.base.keys import last_run_key
from tests.test_docs_snippets import _local
from tests.test_testing_plugin import titled_blocks, write_project

BEAT_KEY = "shop-lease:{celery.beat:proj}"  # CELERY_LEASE_KEY_PREFIX and the app's name
QUEUE = "celery"  # the default queue: the broker's Redis list of messages
ENTRY = "sync-account-7"  # the page's CELERY_BEAT_SCHEDULE entry

# Imported with the settings, so in every process of the project (beat, shell).
STAMP_SENDS = """
import time as _time

from celery.signals import before_task_publish


@before_task_publish.connect(weak=False)
def _stamp_the_send(headers=None, **kwargs):
    headers["sent_at"] = _time.time()
"""


def beat_settings(period: float, ttl: float, max_interval: int = 1) -> str:
    """Settings lines: the page's entry every ``period`` float seconds (django-celery-beat
    stores whole seconds), a ``ttl`` float seconds leader lease, a loop of ``max_interval``."""
    return f"""
CELERY_BEAT_SCHEDULE = {{
    "{ENTRY}": {{"task": "accounts.tasks.sync_account", "schedule": {period!r}, "args": [7]}},
}}
CELERY_LEASE_BEAT_TTL = {ttl!r}
CELERY_BEAT_MAX_LOOP_INTERVAL = {max_interval}
"""


def build(root: Path, redis_url: str, settings: str) -> Path:
    """Write the page's project to ``root`` with ``settings`` appended to its settings module,
    and run ``migrate`` (django-celery-beat's tables); returns ``root``."""
    files = {
        name: _local(body, redis_url) for name, body in titled_blocks("howto/django.md").items()
    }
    files["proj/settings.py"] += settings + STAMP_SENDS
    files["accounts/__init__.py"] = ""  # a Django app is a package
    write_project(root, files)
    manage(root, "migrate", "-v", "0")
    return root


def env(root: Path) -> dict[str, str]:
    """The environment of the project's processes."""
    return {
        **os.environ,
        "PYTHONPATH": str(root),
        "DJANGO_SETTINGS_MODULE": "proj.settings",
        "PYTHONUNBUFFERED": "1",
    }


def manage(root: Path, *args: str) -> str:
    """Run ``python -m django <args>`` in the project (``shell -c CODE`` runs ORM code as the
    admin would); returns its stdout. Raises AssertionError (with stderr) when it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=root,
        env=env(root),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def broker(redis_url: str) -> redis.Redis:
    """A client of the broker's database (the page's ``CELERY_BROKER_URL``, db 0)."""
    return redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/0")


def leases(redis_url: str) -> redis.Redis:
    """A client of the lease store's database (the page's ``CELERY_LEASE_BACKEND``, db 1)."""
    return redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/1")


def leader(client: redis.Redis) -> int | None:
    """The pid of the beat holding the leader lease (``client``: :func:`leases`)."""
    value = client.get(BEAT_KEY)
    return store.parse_value(value).pid if value else None


def recorded(client: redis.Redis, entry: str = ENTRY) -> float:
    """When the beat leaders' last-run record says ``entry`` was last sent: epoch seconds on
    the store's clock (this host's), 0.0 if never (``client``: :func:`leases`). A leader
    writes it right after each send."""
    stamp = client.hget(last_run_key(BEAT_KEY), entry)
    return float(stamp) if stamp else 0.0


@dataclass(frozen=True)
class Send:
    """One message in the queue: who sent it, when, for which entry and with what args."""

    pid: int
    at: float  # float seconds since the epoch: the sender's clock as it published
    entry: str  # the periodic task's name ("" for a message beat did not send)
    args: str  # the args as Celery shows them ("[7]")


def sends(client: redis.Redis) -> list[Send]:
    """The messages waiting in the queue, oldest first (``client``: :func:`broker`)."""
    out = []
    for raw in reversed(client.lrange(QUEUE, 0, -1)):
        headers = json.loads(raw)["headers"]
        pid = int(headers["origin"][3:].split("@")[0])  # "gen<pid>@<host>"
        name = headers.get("periodic_task_name", "")
        out.append(Send(pid, float(headers["sent_at"]), name, headers["argsrepr"]))
    return out


def start_beat(root: Path, name: str) -> subprocess.Popen[bytes]:
    """A real ``celery -A proj beat`` in its own session, logging to ``beat-<name>.log``."""
    with open(root / f"beat-{name}.log", "wb") as log:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "proj", "beat", "-l", "info"),
                *("-s", str(root / f"schedule-{name}")),
            ],
            cwd=root,
            env=env(root),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


@contextmanager
def beats(root: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """A list to put the test's beats in; those still running at the end are killed."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for beat in started:
            if beat.poll() is None:
                os.killpg(beat.pid, signal.SIGKILL)
            beat.wait(10)


def logs(root: Path) -> str:
    """The end of every beat's log, for a failure message."""
    return "\n".join(
        f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(root.glob("beat-*.log"))
    )
