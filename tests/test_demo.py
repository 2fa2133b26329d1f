"""The demo end to end: real workers, a private Redis, real SIGKILL/SIGSTOP; verdicts and figures.

Each test runs ``python -m example_project demo`` as the README does, in a subprocess, and
reads the verdicts and measured figures from its ``--json`` file.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from example_project.demo.runtime import Worker
from example_project.demo.timeline import Stage
from harness import REPO_ROOT
from harness.redis_server import free_port
from harness.waiting import wait_for
from tests.support.fixtures import RedisFactory

TTL = 2.0  # the demo's default: short, so the whole demo stays well under a minute


class DemoRun:
    """``python -m example_project demo`` in a subprocess, its output collected line by line."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "example_project", "demo", *args],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def finish(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGINT)
            self.process.wait(20)
            raise AssertionError(f"demo still running after {timeout}s:\n{self.output}") from None
        self._reader.join(5)
        return code


def _processes_with(marker: str) -> list[int]:
    """Pids whose environment contains ``marker`` (e.g. ``DEMO_PREFIX=lease-demo-...``)."""
    found = []
    needle = marker.encode()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid()]


def _scenes(path: Path) -> dict[str, dict[str, Any]]:
    report = json.loads(path.read_text())
    return {scene["name"]: scene for scene in report["scenes"]}


def test_demo_runs_every_scene_and_measures(throwaway_redis: RedisFactory, tmp_path: Path) -> None:
    server = throwaway_redis({"maxmemory-policy": "noeviction"})
    report = tmp_path / "demo.json"
    demo = DemoRun(["--redis-url", server.url(0), "--ttl", str(TTL), "--json", str(report)])
    code = demo.finish(timeout=110)
    assert code == 0, demo.output
    scenes = _scenes(report)
    assert list(scenes) == ["duplicates", "crash", "long-run", "pause"]
    for scene in scenes.values():
        assert scene["passed"], (scene, demo.output)

    dup = scenes["duplicates"]["figures"]
    assert dup["max_concurrent_runs"] == 1
    assert dup["runs"] + dup["skipped"] == dup["requests"] == 6
    assert dup["skipped"] >= 1 and dup["follow_up_ran"]

    crash = scenes["crash"]["figures"]
    assert 0 < crash["stall_s"] <= TTL + TTL / 3 + 0.5  # the TTL and one hand-over sweep pass
    assert crash["stall_s"] >= crash["lease_left_at_kill_s"] - 0.05  # not before it expired
    assert crash["b_started_after_expiry_s"] >= -0.05

    long_run = scenes["long-run"]["figures"]
    assert long_run["run_over_ttl"] >= 2.5
    assert long_run["renewals_seen"] >= long_run["renewals_expected"] - 3
    assert long_run["min_lease_left_s"] > 0
    assert long_run["duplicates_skipped"] == long_run["duplicates"] >= 1
    assert long_run["lease_lost"] == 0

    pause = scenes["pause"]["figures"]
    assert pause["pause_s"] > TTL
    assert pause["lease_expired_after_pause_s"] <= TTL + 0.2
    assert pause["b_fence"] > pause["a_fence"]
    assert pause["a_lost_cause"] == "deadline"
    assert pause["a_noticed_after_resume_s"] < 1.0
    assert pause["a_late_writes_refused"] >= 1
    assert pause["a_writes_accepted_after_b"] == 0
    assert pause["a_release_deleted_b_key"] is False
    assert pause["b_steps_written"] == 8 and pause["b_lease_lost"] == 0

    # The timeline table and the verdicts are what a user sees.
    assert "| time     | worker A" in demo.output
    assert "REFUSED" in demo.output
    assert demo.output.count("PASS  ") >= 8  # one per scene, and the summary
    # Every key the demo wrote is gone, and so is every process it started.
    assert server.client().dbsize() == 0
    prefix = json.loads(report.read_text())["prefix"]
    assert _processes_with(f"DEMO_PREFIX={prefix}") == []


@pytest.mark.parametrize("pool", ["threads", "gevent"])
def test_the_pause_scene_on_other_pools(
    pool: str, throwaway_redis: RedisFactory, tmp_path: Path
) -> None:
    server = throwaway_redis({"maxmemory-policy": "noeviction"})
    report = tmp_path / "demo.json"
    demo = DemoRun(
        ["--redis-url", server.url(0), "--pool", pool, "--scene", "pause", "--json", str(report)]
    )
    assert demo.finish(timeout=60) == 0, demo.output
    pause = _scenes(report)["pause"]
    assert pause["passed"], demo.output
    assert pause["figures"]["a_late_writes_refused"] >= 1
    assert pause["figures"]["a_writes_accepted_after_b"] == 0


def test_demo_starts_an_embedded_redis_when_none_answers(tmp_path: Path) -> None:
    report = tmp_path / "demo.json"
    dead = f"redis://127.0.0.1:{free_port()}/0"
    demo = DemoRun(["--scene", "duplicates", "--json", str(report)], env={"REDIS_URL": dead})
    code = demo.finish(timeout=60)
    assert code == 0, demo.output
    data = json.loads(report.read_text())
    assert data["embedded_redis"] is True
    assert data["scenes"][0]["passed"]
    assert "starting an embedded redis-server" in demo.output
    # The embedded server was stopped at the end.
    client = redis.Redis.from_url(data["redis_url"], socket_connect_timeout=0.5)
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert _processes_with(f"DEMO_PREFIX={data['prefix']}") == []


def test_ctrl_c_stops_every_process_the_demo_started(throwaway_redis: RedisFactory) -> None:
    server = throwaway_redis({"maxmemory-policy": "noeviction"})
    demo = DemoRun(["--redis-url", server.url(0), "--scene", "long-run"])
    wait_for(
        lambda: any("claims the lease" in line for line in demo.lines),
        40,
        message=lambda: f"the scene did not start:\n{demo.output}",
    )
    prefix_line = next(line for line in demo.lines if line.startswith("Run: "))
    prefix = prefix_line.split(" under ", 1)[1].split(" ", 1)[0]
    assert len(_processes_with(f"DEMO_PREFIX={prefix}")) >= 2  # both workers (and children)
    demo.process.send_signal(signal.SIGINT)
    code = demo.finish(timeout=30)
    assert code == 130, demo.output
    assert "interrupted" in demo.output
    wait_for(
        lambda: not _processes_with(f"DEMO_PREFIX={prefix}"),
        5,
        message="processes left behind after Ctrl-C",
    )
    assert server.client().dbsize() == 0


def test_an_explicit_redis_url_that_does_not_answer_is_an_error() -> None:
    demo = DemoRun(["--redis-url", f"redis://127.0.0.1:{free_port()}/0"])
    assert demo.finish(timeout=30) == 2
    assert "no Redis answers" in demo.output


def test_a_skipped_duplicate_is_printed_after_the_claim_it_names(redis_url: str) -> None:
    """B's conflict event can reach the event list before A's claim: the timeline holds the
    conflict row back until the claim row is printed, and prints both in claim order."""
    client = redis.Redis.from_url(redis_url)
    out = io.StringIO()
    key = "demo-job:report-1"
    stage = Stage(out, client, "events", {k: Worker(k, "prefork", {}) for k in "AB"}, key)
    claimed_at = time.time()
    client.rpush(
        "events",
        json.dumps(
            {
                "t": claimed_at + 0.01,
                "w": "B",
                "pid": 202,
                "ev": "conflict",
                "key": key,
                "policy": "skip",
                "holder": "A@host:101",
                "remaining": 1.9,
                "holder_fence": 7,
            }
        ),
    )
    stage.pump()
    assert "duplicate skipped" not in out.getvalue()  # held back: A's claim not seen yet
    client.rpush(
        "events",
        json.dumps(
            {"t": claimed_at, "w": "A", "pid": 101, "ev": "acquired", "key": key, "fence": 7}
        ),
    )
    stage.pump()
    text = out.getvalue()
    assert "claims the lease (#1)" in text and "duplicate skipped: A holds it" in text
    assert text.index("claims the lease") < text.index("duplicate skipped"), text
    # A conflict whose claim never shows up is printed anyway once HOLD has passed.
    client.rpush(
        "events",
        json.dumps(
            {
                "t": time.time() - 5,
                "w": "B",
                "pid": 202,
                "ev": "conflict",
                "key": key,
                "policy": "skip",
                "holder": "A@host:303",
                "remaining": 1.0,
                "holder_fence": 9,
            }
        ),
    )
    stage.pump()
    assert out.getvalue().count("duplicate skipped") == 2
