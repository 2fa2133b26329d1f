"""Beat with real ``celery beat`` processes and real workers.

- A periodic task that outruns its period never overlaps; the skipped runs are visible in the
  worker log and through the ``lease_conflict`` signal.
- Several beats with ``LeasedScheduler``: one leader sends; a standby takes over within one
  TTL when the leader is killed or paused; a paused leader that resumes stops sending, goes
  back to standby and can lead again later.
- A periodic job with ``lease_on_conflict="preempt"`` replaces the run that outlived its
  period (Kubernetes' ``concurrencyPolicy: Replace``); the fencing guard refuses the replaced
  run's late write.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery
from celery.beat import Scheduler

from celery_lease import LeaseConfigError, LeaseStartRefused, store
from celery_lease.base.keys import BEAT_TASK_NAME
from celery_lease.beat.leader import BeatLeader
from celery_lease.beat.scheduler import LeasedScheduler
from celery_lease.errors import EX_CONFIG
from celery_lease.settings import config
from harness.waiting import wait_for
from tests.support import runs as journal
from tests.support.fixtures import RedisFactory, WorkerFactory
from tests.support.skew import skewed_env
from tests.support.workers import BROKER_URL_ENV, QUEUE_ENV, REPO_ROOT, RESULT_BACKEND_ENV

APP = "tests.apps.ops_app"
PREEMPT_APP = "tests.apps.preempt_app"
BEAT_KEY = "lease:{celery.beat:ops_app}"


class BeatProcess:
    """One ``celery -A <app> beat`` subprocess with its own schedule file, pidfile and log."""

    def __init__(
        self, env: Mapping[str, str], log_dir: Path, name: str, leased: bool = True, app: str = APP
    ) -> None:
        self.env = dict(env)
        self.name, self.app = name, app
        self.log_path = log_dir / f"beat-{name}.log"
        self.dir = log_dir
        self.leased = leased
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> BeatProcess:
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            self.app,
            "beat",
            "-l",
            "info",
            "-s",
            str(self.dir / f"schedule-{self.name}"),
            "--pidfile",
            str(self.dir / f"beat-{self.name}.pid"),
        ]
        if self.leased:
            command += ["-S", "celery_lease.beat:LeasedScheduler"]
        environ = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), environ.get("PYTHONPATH", "")) if p
        )
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environ,
                cwd=self.dir,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
            os.killpg(self.pid, signal.SIGTERM)
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.process.wait(5)


@pytest.fixture
def beats(tmp_path: Path) -> Iterator[list[BeatProcess]]:
    started: list[BeatProcess] = []
    yield started
    for beat in started:
        beat.stop()


def _env(redis_url: str, queue: str, **extra: str) -> dict[str, str]:
    return {BROKER_URL_ENV: redis_url, RESULT_BACKEND_ENV: redis_url, QUEUE_ENV: queue, **extra}


def _records(client: redis.Redis, name: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in client.lrange(name, 0, -1)]


def _leader_pid(client: redis.Redis) -> int | None:
    value = client.get(BEAT_KEY)
    return store.parse_value(value).pid if value else None


def test_overlong_periodic_run_never_overlaps_and_the_skip_is_visible(
    redis_url: str, worker_factory: WorkerFactory, beats: list[BeatProcess], tmp_path: Path
) -> None:
    env = _env(
        redis_url,
        worker_factory.queue,
        BEAT_PERIOD="0.4",
        SLOW_SECONDS="1.0",
        LEASE_TTL="1.5",
        RECORD_SIGNALS="1",
    )
    worker = worker_factory(APP, pool="threads", concurrency=3, env=env)
    beat = BeatProcess(env, tmp_path, "solo-beat", leased=False).start()
    beats.append(beat)
    client = redis.Redis.from_url(redis_url)

    def enough() -> bool:
        conflicts = [s for s in _records(client, "signals") if s["signal"] == "lease_conflict"]
        return len(_records(client, "runs:beat")) >= 3 and len(conflicts) >= 3

    wait_for(
        enough,
        25,
        interval=0.1,
        message=lambda: f"beat:\n{beat.log()[-2000:]}\nworker:\n{worker.log_tail()}",
    )
    beat.stop()
    runs = sorted(_records(client, "runs:beat"), key=lambda r: r["start"])
    for earlier, later in itertools.pairwise(runs):
        assert later["start"] >= earlier["end"], f"runs overlapped: {earlier} {later}"
    sent = beat.log().count("Sending due task periodic")
    assert sent > len(runs)  # beat really sent more often than the task could run
    # Visible: the signal (with the holder and the key) and the worker log.
    conflict = next(s for s in _records(client, "signals") if s["signal"] == "lease_conflict")
    assert conflict["key"].startswith("lease:{ops.slow")
    assert conflict["policy"] == "skip"
    assert conflict["holder_task_id"] in {r["id"] for r in runs} | {
        s["task_id"] for s in _records(client, "signals") if s["signal"] == "lease_acquired"
    }
    assert conflict["remaining"] > 0
    assert "skipped: task ops.slow[" in worker.log_text()
    assert "result stored as SUCCESS with a skip marker" in worker.log_text()


def _ticks_by(client: redis.Redis) -> list[tuple[int, float]]:
    # origin is "gen<pid>@host": the pid of the beat process that sent the message
    out = []
    for tick in _records(client, "ticks:beat"):
        origin = tick["origin"] or ""
        out.append((int(origin[3:].split("@")[0]), tick["at"]))
    return out


def test_two_beats_elect_one_leader_and_fail_over_on_kill_and_pause(
    redis_url: str, worker_factory: WorkerFactory, beats: list[BeatProcess], tmp_path: Path
) -> None:
    ttl = 1.5
    env = _env(
        redis_url, worker_factory.queue, BEAT_PERIOD="0.25", BEAT_TASK="tick", BEAT_TTL=str(ttl)
    )
    worker = worker_factory(APP, pool="solo", env=env)
    client = redis.Redis.from_url(redis_url)
    b1 = BeatProcess(env, tmp_path, "b1").start()
    b2 = BeatProcess(env, tmp_path, "b2").start()
    beats += [b1, b2]
    by_pid = {b1.pid: b1, b2.pid: b2}

    def logs() -> str:
        return (
            "\n".join(f"--- {b.name}\n{b.log()[-1500:]}" for b in beats)
            + f"\n--- worker\n{worker.log_tail()}"
        )

    first_pid = wait_for(lambda: _leader_pid(client), 20, message=logs)
    leader = by_pid[first_pid]
    standby = b2 if leader is b1 else b1
    wait_for(lambda: len(_ticks_by(client)) >= 4, 15, message=logs)
    wait_for(lambda: "standby; leader is" in standby.log(), 10, message=logs)
    assert {pid for pid, _ in _ticks_by(client)} == {leader.pid}  # only the leader sends

    # 1. Kill the leader: the standby takes over within one TTL.
    leader.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: _leader_pid(client) == standby.pid, ttl + 3, interval=0.01, message=logs)
    takeover = time.monotonic() - killed_at
    assert takeover <= ttl + 0.5, f"takeover took {takeover:.2f}s"
    count = len(_ticks_by(client))
    wait_for(
        lambda: any(pid == standby.pid for pid, _ in _ticks_by(client)[count:]), 10, message=logs
    )

    # 2. A third beat joins as standby; pause the leader (SIGSTOP) for longer than the TTL.
    current = standby
    b3 = BeatProcess(env, tmp_path, "b3").start()
    beats.append(b3)
    wait_for(lambda: "standby; leader is" in b3.log(), 20, message=logs)
    current.signal(signal.SIGSTOP)
    paused_at = time.monotonic()
    wait_for(lambda: _leader_pid(client) == b3.pid, ttl + 3, interval=0.01, message=logs)
    assert time.monotonic() - paused_at <= ttl + 0.5
    resumed_log_at = len(current.log())
    current.signal(signal.SIGCONT)
    wait_for(
        lambda: "lost leadership, back to standby" in current.log()[resumed_log_at:],
        10,
        message=logs,
    )
    after = current.log()[resumed_log_at:]
    before_loss = after.split("lost leadership, back to standby", 1)[0]
    # It noticed the loss before sending anything, and never sends while standby.
    assert "Sending due task" not in before_loss
    ticks_now = len(_ticks_by(client))
    wait_for(lambda: len(_ticks_by(client)) >= ticks_now + 4, 10, message=logs)
    assert current.alive()
    late = current.log()[resumed_log_at:].split("lost leadership, back to standby", 1)[1]
    assert "Sending due task" not in late
    assert "standby; leader is" in late

    # 3. The resumed beat is a working standby: kill the new leader and it leads again.
    b3.signal(signal.SIGKILL)
    wait_for(lambda: _leader_pid(client) == current.pid, ttl + 3, interval=0.01, message=logs)
    count = len(_ticks_by(client))
    wait_for(
        lambda: any(pid == current.pid for pid, _ in _ticks_by(client)[count:]), 10, message=logs
    )
    fences = [store.parse_value(client.get(BEAT_KEY) or b"").fencing_token]
    assert fences[0] > 0


def _ticking(
    redis_url: str, worker_factory: WorkerFactory, period: float, ttl: float
) -> tuple[dict[str, str], redis.Redis]:
    """A solo worker running ``ops.tick``, and the beat environment that sends it every
    ``period`` with a ``ttl`` leader lease; returns it and a client of the store."""
    env = _env(
        redis_url,
        worker_factory.queue,
        BEAT_PERIOD=str(period),
        BEAT_TASK="tick",
        BEAT_TTL=str(ttl),
    )
    worker_factory(APP, pool="solo", env=env)
    return env, redis.Redis.from_url(redis_url)


@pytest.mark.parametrize(
    "offset", [0.0, -4.0, 6.0], ids=["clocks agree", "leader 4 s slow", "leader 6 s fast"]
)
def test_a_graceful_stop_hands_over_at_once_and_the_successor_sends_one_period_after_the_last(
    redis_url: str,
    worker_factory: WorkerFactory,
    beats: list[BeatProcess],
    tmp_path: Path,
    offset: float,
) -> None:
    # A long TTL: only the release on shutdown explains a fast takeover. The successor's own
    # schedule says the entry is due 3 s after the leader's send (it started 3 s later); the
    # record says it ran a moment ago, so the next run waits a whole period. The leader's
    # wall clock is `offset` seconds off: had it stamped the record with its own clock, the
    # successor would send again 3 s (slow clock) or 12 s (fast clock) after the leader's
    # last send; on the store's clock it is one period.
    period = 6.0
    env, client = _ticking(redis_url, worker_factory, period, ttl=20.0)
    skew = skewed_env(offset, tmp_path) if offset else {}
    leader = BeatProcess({**env, **skew}, tmp_path, "leader").start()
    beats.append(leader)
    wait_for(lambda: _leader_pid(client) == leader.pid, 20, message=leader.log)
    successor = BeatProcess(env, tmp_path, "successor").start()
    beats.append(successor)
    wait_for(lambda: "standby; leader is" in successor.log(), 20, message=successor.log)
    wait_for(lambda: len(_ticks_by(client)) == 1, period + 10, interval=0.01, message=leader.log)
    leader.stop()  # SIGTERM: beat syncs, the scheduler closes and releases the lease
    stopped_at = time.monotonic()
    wait_for(lambda: _leader_pid(client) == successor.pid, 10, interval=0.01, message=successor.log)
    assert time.monotonic() - stopped_at < 5  # far below the 20 s TTL
    wait_for(lambda: "loaded 1 last-run time(s)" in successor.log(), 5, message=successor.log)
    wait_for(lambda: len(_ticks_by(client)) == 2, period + 10, interval=0.01, message=successor.log)
    (pid1, at1), (pid2, at2) = _ticks_by(client)
    assert (pid1, pid2) == (leader.pid, successor.pid)
    assert period - 0.75 <= at2 - at1 <= period + 1.5, (
        f"the successor sent {at2 - at1:.2f}s after the leader's last send (period {period}s)"
    )


def test_a_clean_stop_wakes_a_standby_that_would_not_try_again_for_a_renew_interval(
    redis_url: str, beats: list[BeatProcess], tmp_path: Path
) -> None:
    # TTL 30 s and a 30 s loop: the standby's next try is a renew interval (10 s) away once it
    # has seen the leader, so only the release's wake explains a take-over within 5 s.
    env = _env(redis_url, "beat-wake", BEAT_TTL="30", BEAT_MAX_INTERVAL="30")
    client = redis.Redis.from_url(redis_url)
    leader = BeatProcess(env, tmp_path, "leader").start()
    beats.append(leader)
    wait_for(lambda: _leader_pid(client) == leader.pid, 20, message=leader.log)
    standby = BeatProcess(env, tmp_path, "standby").start()
    beats.append(standby)
    wait_for(lambda: "standby; leader is" in standby.log(), 20, message=standby.log)
    leader.stop()
    wait_for(lambda: _leader_pid(client) == standby.pid, 5, interval=0.01, message=standby.log)
    assert "released leadership" in leader.log()


def test_the_last_run_record_lives_ten_periods_refreshed_at_every_send(
    redis_url: str, worker_factory: WorkerFactory, beats: list[BeatProcess], tmp_path: Path
) -> None:
    env, client = _ticking(redis_url, worker_factory, period=1.0, ttl=3.0)
    beats.append(BeatProcess(env, tmp_path, "only").start())
    state = f"{BEAT_KEY}:last-run"
    wait_for(lambda: len(_ticks_by(client)) >= 1, 20, message=beats[0].log)
    # The longer of ten periods and ten leader TTLs: 30 s, set again at every send.
    assert 20_000 < client.pttl(state) <= 30_000
    client.pexpire(state, 5_000)
    count = len(_ticks_by(client))
    wait_for(lambda: len(_ticks_by(client)) > count, 10, message=beats[0].log)
    wait_for(lambda: client.pttl(state) > 20_000, 5, message=beats[0].log)


class RecordingScheduler(Scheduler):  # type: ignore[misc]
    """An in-memory scheduler standing in for a user's configured one."""

    sent: list[str]

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        self.sent = [*getattr(self, "sent", []), entry.name]
        # What Celery's apply_async returns: Celery 5.3.0 logs its ``id`` unconditionally.
        return SimpleNamespace(id=f"recorded-{len(self.sent)}")


def _recording_app(name: str, redis_url: str, ttl: float, every: float) -> Celery:
    """An app whose beat wraps a :class:`RecordingScheduler` with one entry, ``every``."""
    app = Celery(name, broker=redis_url)
    app.conf.update(
        beat_scheduler="tests.test_beat:RecordingScheduler",
        lease_beat_ttl=ttl,
        beat_schedule={"every": {"task": "x.y", "schedule": every}},
    )
    return app


def test_leased_scheduler_wraps_the_configured_scheduler_and_only_the_leader_sends(
    redis_url: str,
) -> None:
    app = _recording_app("wrapped", redis_url, ttl=1.0, every=0.05)
    lazy = LeasedScheduler(app=app, lazy=True)
    assert isinstance(lazy.inner, RecordingScheduler)
    assert lazy.leader is None  # celery beat's banner instance takes part in no election
    assert "leader lease -> lease:{celery.beat:wrapped}" in lazy.info

    first, second = LeasedScheduler(app=app), LeasedScheduler(app=app)
    client = redis.Redis.from_url(redis_url)

    def ticks(scheduler: LeasedScheduler, until: float) -> None:
        end = time.monotonic() + until
        wait_for(
            lambda: scheduler.tick() is None or time.monotonic() >= end, until + 1, interval=0.01
        )

    ticks(first, 0.3)
    ticks(second, 0.3)
    assert first.leader is not None and first.leader.is_leader
    assert second.leader is not None and not second.leader.is_leader
    assert getattr(first.inner, "sent", []) and not getattr(second.inner, "sent", [])
    first.close()  # releases the lease: the standby takes over at its next tick
    assert client.get(BEAT_KEY.replace("ops_app", "wrapped")) is None
    ticks(second, 0.3)
    assert second.leader.is_leader and getattr(second.inner, "sent", [])
    second.close()

    app.conf.lease_beat_scheduler = "celery_lease.beat:LeasedScheduler"
    with pytest.raises(LeaseConfigError, match="lease_beat_scheduler"):
        LeasedScheduler(app=app, lazy=True)


def test_a_standby_asks_again_when_a_dead_leaders_lease_ends_not_a_renew_interval_later(
    redis_url: str,
) -> None:
    # A killed leader stops renewing, so its lease ends sooner than the standby's renew
    # interval: waiting a whole interval after that try would take over later than one TTL.
    app = Celery("ending", broker=redis_url)
    app.conf.lease_beat_ttl = 6.0  # renew interval 2 s
    options, url, _ = config.beat_settings(app.conf)
    key = "lease:{celery.beat:ending}"
    client = redis.Redis.from_url(url)
    dead = store.holder_json(BEAT_TASK_NAME, "beat@killed", "host", 42)
    assert store.acquire(client, key, uuid.uuid4().hex, 1000, dead).granted  # never renewed
    standby = BeatLeader(app, key, options, url)
    leading, wait = standby.poll()
    left = client.pttl(key) / 1000
    assert not leading and 0 < left < options.renew_interval
    assert wait <= left + 0.1, f"asks again in {wait:.3f}s, the lease ends in {left:.3f}s"
    try:
        wait_for(lambda: standby.poll()[0], left + 0.5, interval=0.01)
        assert store.parse_value(client.get(key)).task_id == standby.node
    finally:
        standby.step_down()


class StoppedWhileSending(RecordingScheduler):
    """A scheduler whose process is told to stop (SIGTERM) while it sends."""

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        result = super().apply_async(entry, producer, advance, **kwargs)
        signal.raise_signal(signal.SIGTERM)
        return result


def test_a_stop_during_a_send_is_handled_once_the_send_is_recorded(redis_url: str) -> None:
    # celery beat's SIGTERM handler closes the scheduler, releasing the lease (a standby leads
    # within milliseconds), then exits: had the send's last-run record not been written by
    # then, the new leader would send the same slot again.
    app = _recording_app("stopped", redis_url, ttl=5.0, every=3600.0)
    app.conf.beat_scheduler = "tests.test_beat:StoppedWhileSending"
    scheduler = LeasedScheduler(app=app)
    wait_for(lambda: scheduler.tick() is not None and scheduler.leader is not None, 5)
    leader = scheduler.leader
    assert leader is not None and leader.is_leader
    client = redis.Redis.from_url(redis_url)

    def stop(signum: int, frame: Any) -> None:  # what `celery beat` installs
        scheduler.close()
        raise SystemExit()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(SystemExit):
            scheduler.apply_async(scheduler.inner.schedule["every"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert scheduler.inner.sent == ["every"]
    assert client.get(leader.key) is None  # released by the stop
    assert list(leader.last_run_ages()) == ["every"]  # but only once the send was recorded
    assert signal.getsignal(signal.SIGTERM) is previous


def test_a_send_the_last_run_record_calls_early_is_not_made_and_the_record_is_loaded_again(
    redis_url: str,
) -> None:
    # A wrapped scheduler that re-read an older last run from its own storage after a
    # take-over (django-celery-beat's database) would send what the old leader just sent.
    app = _recording_app("early", redis_url, ttl=5.0, every=3600.0)
    scheduler = LeasedScheduler(app=app)
    try:
        wait_for(
            lambda: (
                scheduler.tick() is not None
                and scheduler.leader is not None
                and scheduler.leader.is_leader
            ),
            5,
            interval=0.01,
        )
        assert scheduler.leader is not None
        scheduler.leader.record_run("every", 3600.0)  # the old leader sent it just now
        stale = app.now() - datetime.timedelta(hours=2)
        scheduler.inner.schedule["every"].last_run_at = stale
        assert scheduler.apply_async(scheduler.inner.schedule["every"]) is None
        assert getattr(scheduler.inner, "sent", []) == []
        assert scheduler.inner.schedule["every"].last_run_at > stale  # the record's, again
        redis.Redis.from_url(redis_url).delete(scheduler.leader.state_key)  # no record: due
        assert scheduler.apply_async(scheduler.inner.schedule["every"]) is not None
        assert scheduler.inner.sent == ["every"]
    finally:
        scheduler.close()


def test_two_beats_wrapping_redbeat_elect_one_leader_and_fail_over(
    redis_url: str, worker_factory: WorkerFactory, beats: list[BeatProcess], tmp_path: Path
) -> None:
    ttl = 1.5
    env = _env(
        redis_url,
        worker_factory.queue,
        BEAT_PERIOD="0.25",
        BEAT_TASK="tick",
        BEAT_TTL=str(ttl),
        BEAT_INNER="redbeat",
    )
    worker = worker_factory(APP, pool="solo", env=env)
    client = redis.Redis.from_url(redis_url)
    b1 = BeatProcess(env, tmp_path, "r1").start()
    b2 = BeatProcess(env, tmp_path, "r2").start()
    beats += [b1, b2]

    def logs() -> str:
        return (
            "\n".join(f"--- {b.name}\n{b.log()[-1500:]}" for b in beats)
            + f"\n--- worker\n{worker.log_tail()}"
        )

    first_pid = wait_for(lambda: _leader_pid(client), 20, message=logs)
    leader, standby = (b1, b2) if first_pid == b1.pid else (b2, b1)
    wait_for(lambda: len(_ticks_by(client)) >= 4, 15, message=logs)
    wait_for(lambda: "standby; leader is" in standby.log(), 10, message=logs)
    assert ". redis -> " in leader.log()  # RedBeat's banner line: it is the wrapped one
    assert client.zcard(f"redbeat-{worker_factory.queue}:schedule") == 1  # its state
    assert {pid for pid, _ in _ticks_by(client)} == {leader.pid}  # only the leader sends

    leader.signal(signal.SIGKILL)
    wait_for(lambda: _leader_pid(client) == standby.pid, ttl + 3, interval=0.01, message=logs)
    count = len(_ticks_by(client))
    wait_for(lambda: len(_ticks_by(client)) >= count + 3, 10, message=logs)
    assert {pid for pid, _ in _ticks_by(client)[count:]} == {standby.pid}


def test_a_scheduler_that_sends_by_apply_async_directly_is_guarded_too(redis_url: str) -> None:
    # RedBeat's tick calls apply_async itself, never apply_entry: a beat that lost the lease
    # between its election and the send must not send.
    app = Celery("redbeat_guard", broker=redis_url)
    app.conf.update(
        lease_beat_scheduler="redbeat.RedBeatScheduler",
        redbeat_redis_url=redis_url,
        redbeat_lock_key=None,
        lease_beat_ttl=2.0,
        task_default_queue="guarded",
        beat_schedule={"every": {"task": "x.y", "schedule": 0.05}},
    )
    scheduler = LeasedScheduler(app=app)
    client = redis.Redis.from_url(redis_url)
    try:
        wait_for(lambda: client.llen("guarded") > 0 or scheduler.tick() is None, 5, interval=0.02)
        assert scheduler.leader is not None and scheduler.leader.is_leader
        assert type(scheduler.inner).__name__ == "RedBeatScheduler"
        sent = client.llen("guarded")
        assert scheduler.leader.lease is not None
        scheduler.leader.lease.lose()  # lost after the election, before the tick's send
        time.sleep(0.1)  # the entry (every 0.05 s) is due again: a send would happen now
        scheduler.inner.tick()
        assert client.llen("guarded") == sent
    finally:
        scheduler.close()


def test_an_unnamed_apps_beat_refuses_to_guess_a_leader_key_in_one_line(
    redis_url: str,
    tmp_path: Path,
) -> None:
    environ = {
        **os.environ,
        BROKER_URL_ENV: redis_url,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.apps.unnamed_app",
            "beat",
            "-l",
            "info",
            "-s",
            str(tmp_path / "schedule"),
        ],
        capture_output=True,
        text=True,
        env=environ,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == EX_CONFIG, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and error[0].startswith(
        "Error: celery-lease refused to start this beat: celery beat leader lease: the app has "
        "no name"
    ), done.stderr
    assert "Set lease_beat_key" in error[0]
    assert redis.Redis.from_url(redis_url).keys("lease:*") == []  # no election took place


def _beat_app(name: str | None, redis_url: str, queue: str, **conf: Any) -> Celery:
    app = Celery(name, broker=redis_url, set_as_current=False)
    app.conf.update(
        lease_beat_ttl=1.0,
        task_default_queue=queue,
        beat_schedule={f"{queue}-entry": {"task": f"{queue}.task", "schedule": 0.05}},
        **conf,
    )
    return app


def _lead(scheduler: LeasedScheduler, client: redis.Redis, queue: str) -> None:
    wait_for(lambda: scheduler.tick() is None or client.llen(queue) > 0, 5, interval=0.02)


def test_apps_on_one_redis_each_lead_their_own_schedule(
    redis_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="celery_lease")
    client = redis.Redis.from_url(redis_url)
    schedulers = [
        LeasedScheduler(
            app=_beat_app("billing", redis_url, "billing"),
            schedule_filename=str(tmp_path / "billing"),
        ),
        LeasedScheduler(
            app=_beat_app("reports", redis_url, "reports"),
            schedule_filename=str(tmp_path / "reports"),
        ),
        LeasedScheduler(
            app=_beat_app(
                None, redis_url, "first-unnamed", lease_beat_key="lease:{celery.beat:first}"
            ),
            schedule_filename=str(tmp_path / "first"),
        ),
        LeasedScheduler(
            app=_beat_app(
                "__main__", redis_url, "second-unnamed", lease_beat_key="lease:{celery.beat:second}"
            ),
            schedule_filename=str(tmp_path / "second"),
        ),
    ]
    try:
        for scheduler in schedulers:
            _lead(scheduler, client, scheduler.app.conf.task_default_queue)
        assert all(s.leader is not None and s.leader.is_leader for s in schedulers)
        assert [s.leader.key for s in schedulers if s.leader] == [
            "lease:{celery.beat:billing}",
            "lease:{celery.beat:reports}",
            "lease:{celery.beat:first}",
            "lease:{celery.beat:second}",
        ]
        for queue in ("billing", "reports", "first-unnamed", "second-unnamed"):
            assert client.llen(queue) > 0, queue  # each schedule is sent by its own leader
        became = [r for r in caplog.records if r.getMessage().startswith("beat: became leader")]
        assert len(became) == 4 and {r.levelno for r in became} == {logging.INFO}
    finally:
        for scheduler in schedulers:
            scheduler.close()

    for name in (None, "__main__"):
        app = _beat_app(name, redis_url, "refused")
        with pytest.raises(LeaseStartRefused, match="Set lease_beat_key") as info:
            LeasedScheduler(app=app, schedule_filename=str(tmp_path / "refused"))
        assert isinstance(info.value, LeaseConfigError)
        with pytest.raises(LeaseStartRefused):  # celery beat's banner instance too
            LeasedScheduler(app=app, lazy=True)


def test_two_beats_sending_a_preempt_job_replace_the_run_that_outlived_its_period(
    redis_url: str, worker_factory: WorkerFactory, beats: list[BeatProcess], tmp_path: Path
) -> None:
    # Each run of pre.work holds its key for 30 s; beat sends one every 1.5 s. With "preempt"
    # each send takes the key over from the run before (newest wins, as Replace does), which
    # gets LeaseLost(cause="preempted") at once and whose late fenced write is refused.
    tag, period = f"replace-{uuid.uuid4().hex[:8]}", 1.5
    env = _env(redis_url, worker_factory.queue, BEAT_PERIOD=str(period), BEAT_TAG=tag)
    worker = worker_factory(PREEMPT_APP, pool="threads", concurrency=3, env=env)
    pair = [BeatProcess(env, tmp_path, name, app=PREEMPT_APP).start() for name in ("r1", "r2")]
    beats += pair

    def logs() -> str:
        return (
            "\n".join(f"--- {b.name}\n{b.log()[-1500:]}" for b in pair)
            + f"\n--- worker\n{worker.log_tail()}"
        )

    def replaced() -> list[dict[str, Any]]:
        return [r for r in journal.read(redis_url, tag) if r["what"] == "end"]

    wait_for(lambda: len(replaced()) >= 3, 40, interval=0.2, message=logs)
    for beat in pair:
        beat.stop()
    records = journal.read(redis_url, tag)
    starts = sorted((r for r in records if r["what"] == "start"), key=lambda r: r["at"])
    by_run = {(r["run"], r["what"]): r for r in records}
    # One leader sent; every send ran, each with a higher fencing token than the last.
    assert sum("Sending due task replace" in b.log() for b in pair) == 1, logs()
    assert [r["fence"] for r in starts] == sorted({r["fence"] for r in starts})
    for old, new in itertools.pairwise(starts):
        if (old["run"], "end") not in by_run:
            continue  # still running (the last one), or not yet recorded
        assert by_run[old["run"], "lost"]["cause"] == "preempted"
        # Told at once (its renewal is 10 s away): the overlap is the notice's latency.
        assert by_run[old["run"], "lost"]["at"] - new["at"] < period
        assert by_run[old["run"], "end"]["late_write_accepted"] is False  # fenced off


def test_a_store_outage_is_logged_once_by_beat_without_a_release_it_never_needed(
    redis_url: str, beats: list[BeatProcess], tmp_path: Path, throwaway_redis: RedisFactory
) -> None:
    lease_store = throwaway_redis(config={"requirepass": "s3cret-pw"})
    url = f"redis://:s3cret-pw@127.0.0.1:{lease_store.port}/0"
    env = _env(redis_url, "beat-outage", LEASE_BACKEND=url, BEAT_TTL="1.5")
    beat = BeatProcess(env, tmp_path, "outage").start()
    beats.append(beat)
    wait_for(lambda: "became leader" in beat.log(), 20, message=beat.log)
    lease_store.stop()
    stopped = time.monotonic()
    masked = f"lease store redis://:**@127.0.0.1:{lease_store.port}/0"
    wait_for(lambda: f"{masked} is unreachable (seen by" in beat.log(), 20, message=beat.log)
    # Many election tries (every renew interval, 0.5 s) meet the stopped store.
    wait_for(lambda: time.monotonic() - stopped >= 5.0, 10)
    restarting = time.monotonic()
    lease_store.restart()
    wait_for(lambda: beat.log().count("became leader") == 2, 20, message=beat.log)
    answered = time.monotonic()
    log = beat.log()
    assert log.count("is unreachable (seen by") == 1, log
    assert "interrupted acquire" not in log and "may have been granted" not in log, log
    back = re.findall(rf"{re.escape(masked)} is reachable again after (\d+\.\d)s", log)
    assert len(back) == 1, log
    assert restarting - stopped - 3.0 <= float(back[0]) <= answered - stopped, back
    assert "s3cret-pw" not in log
