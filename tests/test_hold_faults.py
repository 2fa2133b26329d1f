"""Losing a ``hold()`` / ``hold_async()`` lease, in each execution context, in a real process.

The holder is ``tests/apps/hold_holder.py`` (TTL 1 s) in a subprocess: on the main thread
(signal), in another thread (asynchronous exception), under gevent (greenlet) and in an
asyncio task (``hold_async``: cancellation). Faults: the holder paused past its lifetime
(SIGSTOP), its key deleted (the renewal is refused), the store paused (the local deadline).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from celery_lease import hold
from celery_lease.base.keys import hold_key

ROOT = Path(__file__).resolve().parent.parent
CONTEXTS = ["main", "thread", "gevent", "asyncio"]
TTL = 1.0


class Holder:
    """The holder subprocess and its output lines."""

    def __init__(self, url: str, name: str, context: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.apps.hold_holder", url, name, context],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, prefix: str, timeout: float) -> list[str]:
        """The words of the first line starting with ``prefix`` within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {prefix!r} line within {timeout}s; saw {self.seen}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(line)
            if line.startswith(prefix):
                return line.split()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def start_holder() -> Any:
    started: list[Holder] = []

    def start(url: str, name: str, context: str) -> Holder:
        holder = Holder(url, name, context)
        started.append(holder)
        return holder

    yield start
    for holder in started:
        holder.close()


@pytest.mark.parametrize("context", CONTEXTS)
def test_deleted_key_raises_lease_lost_refused_in_the_block(
    redis_url: str, start_holder: Any, context: str
) -> None:
    holder = start_holder(redis_url, "deleted", context)
    fence = holder.expect("HELD", 30)[1]
    client = __import__("redis").Redis.from_url(redis_url)
    assert client.delete(hold_key("lease", "deleted")) == 1
    words = holder.expect("LOST", TTL * 2 + 5)
    assert words[1:4] == ["refused", fence, "LeaseLost"]


@pytest.mark.parametrize("context", CONTEXTS)
def test_paused_store_raises_lease_lost_by_the_local_deadline(
    throwaway_redis: Any, start_holder: Any, context: str
) -> None:
    server = throwaway_redis()
    holder = start_holder(server.url(0), "paused-store", context)
    fence = holder.expect("HELD", 30)[1]
    server.pause()
    try:
        paused_at = time.monotonic()
        words = holder.expect("LOST", TTL + 5)
        # Nothing can answer while the store is paused: the loss comes from the local deadline.
        assert time.monotonic() - paused_at < TTL + 1.0
        assert words[1:4] == ["deadline", fence, "LeaseLost"]
    finally:
        server.resume()


@pytest.mark.parametrize("context", CONTEXTS)
def test_holder_paused_past_its_lifetime_loses_and_another_takes_over(
    redis_url: str, start_holder: Any, context: str
) -> None:
    holder = start_holder(redis_url, "paused-holder", context)
    fence = int(holder.expect("HELD", 30)[1])
    holder.proc.send_signal(signal.SIGSTOP)
    try:
        # The stopped holder renews nothing: its key expires and this process takes it.
        with hold(
            "paused-holder", url=redis_url, ttl=TTL, on_conflict="wait", timeout=TTL * 3
        ) as lease:
            assert lease.fencing_token > fence
            holder.proc.send_signal(signal.SIGCONT)
            words = holder.expect("LOST", TTL + 5)
            assert words[1] in ("deadline", "refused")
            assert int(words[2]) == fence
            assert not lease.lost
    finally:
        holder.proc.send_signal(signal.SIGCONT)


def test_greenlets_contending_under_gevent_never_hold_at_once(redis_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.apps.hold_contend", redis_url, "8", "2.0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["overlaps"] == 0 and result["rising"] is True
    assert result["entries"] > 20
