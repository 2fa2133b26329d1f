"""``python -m benchmarks.beat_handover [--rounds N]``: beat's hand-over after a clean stop.

Two ``celery beat -S celery_lease.beat:LeasedScheduler`` processes with the default leader
lease (``lease_beat_ttl`` 30.0, renew interval 10.0 s) and Celery's default loop interval
(300 s) share a private redis-server. Each round starts a leader, then a standby, waits until
the standby has seen the leader, stops the leader with SIGTERM (as a supervisor does), and
measures from the SIGTERM (and from the leader's exit) to the moment the standby holds the
leader key. A
standby that only re-tried on its own schedule would take up to a renew interval (10 s); the
leader's release wakes it. Prints one JSON object: the rounds' ``summary`` in float seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from celery_lease import store
from harness import REPO_ROOT
from harness.redis_server import RedisServer
from harness.waiting import wait_for

from ._infra import summary

KEY = "lease:{celery.beat:ops_app}"


def _beat(env: dict[str, str], where: Path, name: str) -> subprocess.Popen[bytes]:
    with open(where / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.apps.ops_app",
                "beat",
                "-l",
                "info",
                "-S",
                "celery_lease.beat:LeasedScheduler",
                "-s",
                str(where / f"schedule-{name}"),
                "--pidfile",
                str(where / f"{name}.pid"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=where,
            start_new_session=True,
        )


def _leader_pid(client: redis.Redis) -> int | None:
    value = client.get(KEY)
    return store.parse_value(value).pid if value else None


def one_round(url: str, where: Path) -> tuple[float, float]:
    """Float seconds from the SIGTERM, and from the leader's exit, to the standby's
    leadership (negative: it led before the old leader's process had exited)."""
    env = {
        **os.environ,
        "TEST_BROKER_URL": url,
        "TEST_RESULT_BACKEND": url,
        "TEST_QUEUE": "handover",
        "BEAT_MAX_INTERVAL": "300",
        "BEAT_TTL": "30",
        "PYTHONPATH": str(REPO_ROOT),
        "PYTHONUNBUFFERED": "1",
    }
    client = redis.Redis.from_url(url)
    leader = _beat(env, where, "leader")
    wait_for(lambda: _leader_pid(client) == leader.pid, 30)
    standby = _beat(env, where, "standby")
    try:
        wait_for(lambda: "standby; leader is" in (where / "standby.log").read_text(), 30)
        signalled = time.monotonic()
        os.kill(leader.pid, signal.SIGTERM)
        wait_for(lambda: _leader_pid(client) == standby.pid, 40, interval=0.002)
        led = time.monotonic()
        leader.wait(30)
        return led - signalled, led - time.monotonic()
    finally:
        for process in (leader, standby):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        client.delete(KEY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        figures = [one_round(server.url(), Path(tmp)) for _ in range(rounds)]
    print(
        json.dumps(
            {
                "from_sigterm_s": summary(f[0] for f in figures),
                "from_leader_exit_s": summary(f[1] for f in figures),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
