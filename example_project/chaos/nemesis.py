"""The seeded nemesis, and the supervisor that restarts the workers it kills.

One fault at a time, at random moments drawn from the seed, each logged with the times it
started and was healed:

- ``kill_worker``: SIGKILL a worker's whole process group (the supervisor starts a new one);
- ``kill_child``: SIGKILL one pool child of a prefork worker (the pool replaces it);
- ``stop_worker``: SIGSTOP a worker's group for longer than the TTL, then SIGCONT;
- ``pause_store``: SIGSTOP the lease Redis (connections stay open, nothing answers);
- ``blackhole``: the proxy in front of the lease Redis stops moving bytes;
- ``restart_empty``: the lease Redis restarts with an empty dataset (same port);
- ``delete_key``: one held lease key is deleted behind its holder's back.

After the last two, the nemesis also sends a duplicate of each job whose lease it erased, so
that a second holder is granted while the first still runs: the case the fencing token and
the renewal's refusal exist for.
- ``latency``: a burst of latency: the proxy holds the bytes back in short pulses.
- ``kill_beat``: SIGKILL a beat process (the supervisor starts a new one; the other beat
  takes the leader lease over once it lapses);
- ``stop_beat``: SIGSTOP a beat process for longer than the leader lease's TTL, then SIGCONT.
- ``failover`` (``--sentinel`` only): ``SENTINEL FAILOVER``, or SIGKILL of the primary, the
  sentinels' failover, and the old primary restarted as a replica of the new one.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from .history import Fault
from .infra import CeleryProcess, CeleryWorker, TcpProxy

__all__ = ["FAULTS", "SENTINEL_FAULTS", "Fleet", "Nemesis"]

#: Every kind of fault, with its weight in the draw.
FAULTS: Mapping[str, int] = {
    "kill_worker": 2,
    "kill_child": 2,
    "stop_worker": 2,
    "pause_store": 2,
    "blackhole": 2,
    "restart_empty": 1,
    "delete_key": 2,
    "latency": 2,
    "kill_beat": 1,
    "stop_beat": 1,
}
#: The faults with ``--sentinel``: the workers reach the primary the sentinels name, not a
#: proxy (no ``blackhole``, ``latency``), and ``restart_empty`` gives way to ``failover``.
SENTINEL_FAULTS: Mapping[str, int] = {
    **{
        kind: weight
        for kind, weight in FAULTS.items()
        if kind not in ("blackhole", "latency", "restart_empty")
    },
    "failover": 2,
}

#: Worker concurrency per pool on a 2-core machine.
CONCURRENCY = {"prefork": 2, "threads": 2, "gevent": 4, "solo": 1, "eventlet": 4}
#: The pools the workers cycle through.
POOLS = ("prefork", "threads", "gevent")


@dataclass
class Slot:
    """One supervised process (a worker, or a beat: ``pool == "beat"``): the current
    process, how often it was restarted."""

    name: str
    pool: str
    worker: CeleryProcess
    restarts: int = 0
    stopped: bool = False  # SIGSTOPped by the nemesis: not dead, do not restart


@dataclass
class Fleet:
    """The campaign's workers, restarted when they die, as a supervisor would."""

    app_module: str
    env: dict[str, str]
    log_dir: str
    queue: str = "celery"
    slots: list[Slot] = field(default_factory=list)
    beats: list[Slot] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _new_worker(self, pool: str, name: str = "") -> CeleryProcess:
        if pool == "beat":  # its own schedule file: two beats must not share one shelve
            schedule = os.path.join(self.log_dir, f"{name}-{time.time_ns()}.schedule")
            return CeleryProcess(
                self.app_module,
                [
                    "beat",
                    "-S",
                    "celery_lease.beat:LeasedScheduler",
                    "-s",
                    schedule,
                    "-l",
                    "info",
                    "--max-interval",
                    "1",
                ],
                env=self.env,
                log_dir=self.log_dir,
                name=name,
            ).start()
        worker = CeleryWorker(
            self.app_module,
            pool=pool,
            concurrency=CONCURRENCY[pool],
            queue=self.queue,
            env=self.env,
            log_dir=self.log_dir,
        )
        return worker.start()

    def start(self, count: int, timeout: float = 90.0, beats: int = 0) -> None:
        """Start ``count`` workers of the pools in turn, wait until all are ready, then start
        ``beats`` beat processes (``-S celery_lease.beat:LeasedScheduler``)."""
        for i in range(count):
            pool = POOLS[i % len(POOLS)]
            self.slots.append(Slot(f"w{i}-{pool}", pool, self._new_worker(pool)))
        for slot in self.slots:
            slot.worker.wait_ready(timeout)
        for i in range(beats):
            self.beats.append(Slot(f"beat{i}", "beat", self._new_worker("beat", f"beat{i}")))
        self._thread = threading.Thread(target=self._supervise, daemon=True, name="supervisor")
        self._thread.start()

    def _supervise(self) -> None:
        while not self._closing.wait(0.2):
            with self._lock:
                for slot in self.slots + self.beats:
                    if not slot.worker.is_running():
                        slot.worker.kill()  # reap it, and whatever is left of its group
                        slot.worker = self._new_worker(slot.pool, slot.name)
                        slot.restarts += 1

    def pick(self, rng: random.Random, pool: str | None = None) -> Slot | None:
        """A random running slot (of ``pool``, if given; ``"beat"``: a beat process)."""
        with self._lock:
            slots = self.beats if pool == "beat" else self.slots
            alive = [
                s
                for s in slots
                if s.worker.is_running() and not s.stopped and (pool is None or s.pool == pool)
            ]
        return rng.choice(alive) if alive else None

    def stop_beats(self) -> None:
        """Stop the beat processes for good (SIGTERM: a leader releases its lease)."""
        with self._lock:
            beats, self.beats = self.beats, []
        for slot in beats:
            slot.worker.send_signal(signal.SIGCONT, group=True)
            slot.worker.stop(timeout=10)

    def close(self) -> None:
        """Stop supervising, then stop every process (resuming a stopped one first)."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(5)
        self.stop_beats()
        for slot in self.slots:
            slot.worker.send_signal(signal.SIGCONT, group=True)
            slot.worker.stop(timeout=10)


class Nemesis:
    """Draws faults from ``seed`` and injects them one at a time until :meth:`stop`.

    Args:
        rng: the seeded random source. The sequence of fault kinds and the gaps between them
            come from a stream of their own, so a seed always draws the same plan; the
            targets and the durations depend on what is running at the time.
        fleet: the workers.
        store: the lease store: a ``RedisServer``, or a
            :class:`~example_project.chaos.sentinel.SentinelStore`; ``proxy``: the proxy the
            workers reach it through (``None`` with Sentinel: no ``blackhole``, ``latency``).
        ttl: the lease TTL (float seconds): sizes the pauses.
        held_keys: returns the lease keys currently present (for ``delete_key``).
        erased: called with the lease keys a fault erased (to send duplicates of their jobs).
        faults: the kinds of fault to draw, with their weights (:data:`FAULTS`, or
            :data:`SENTINEL_FAULTS`).
    """

    def __init__(
        self,
        rng: random.Random,
        fleet: Fleet,
        store: Any,
        proxy: TcpProxy | None,
        ttl: float,
        held_keys: Callable[[redis.Redis], list[str]],
        erased: Callable[[list[str]], None] = lambda keys: None,
        faults: Mapping[str, int] = FAULTS,
    ) -> None:
        self.plan = random.Random(rng.random())
        self.rng = random.Random(rng.random())
        self.fleet = fleet
        self.store = store
        self.proxy = proxy
        self.ttl = ttl
        self.held_keys = held_keys
        self.erased = erased
        self.kinds = dict(faults)
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self._stop = threading.Event()

    def run(self, until: float) -> None:
        """Inject faults until the wall time ``until`` (or :meth:`stop`), then heal all."""
        try:
            while not self._stop.is_set() and time.time() < until:
                if self._stop.wait(self.plan.uniform(0.5, 2.5)):
                    break
                kind = self.plan.choices(list(self.kinds), weights=list(self.kinds.values()))[0]
                started = time.time()
                try:
                    target = getattr(self, kind)()
                except Exception as exc:  # a fault that could not be injected is reported
                    self.errors.append(f"{kind}: {exc!r}")
                    continue
                lossy = bool(getattr(self.store, "pop_lossy", lambda: False)())
                if target is not None:
                    if lossy:
                        target += "; promoted a node not in sync: writes since are lost"
                    self.faults.append(Fault(kind, target, started, time.time(), lossy))
        finally:
            self.heal()

    def stop(self) -> None:
        """Ask :meth:`run` to stop after the current fault."""
        self._stop.set()

    def heal(self) -> None:
        """Undo whatever may still be in force (idempotent)."""
        if self.proxy is not None:
            self.proxy.heal()
        if self.store.paused:
            self.store.resume()
        for slot in self.fleet.slots:
            if slot.stopped:
                slot.worker.send_signal(signal.SIGCONT, group=True)
                slot.stopped = False

    def _hold(self, low: float, high: float) -> float:
        seconds = self.rng.uniform(low, high) * self.ttl
        self._stop.wait(seconds)
        return seconds

    # -- the faults: each returns what it hit (None: nothing to hit right now) ---------------

    def kill_worker(self) -> str | None:
        slot = self.fleet.pick(self.rng)
        if slot is None:
            return None
        slot.worker.send_signal(signal.SIGKILL, group=True)
        return f"{slot.name} pid {slot.worker.pid}"

    def kill_beat(self) -> str | None:
        slot = self.fleet.pick(self.rng, "beat")
        if slot is None:
            return None
        slot.worker.send_signal(signal.SIGKILL, group=True)
        return f"{slot.name} pid {slot.worker.pid}"

    def stop_beat(self) -> str | None:
        return self.stop_worker("beat")

    def kill_child(self) -> str | None:
        slot = self.fleet.pick(self.rng, "prefork")
        children = slot.worker.child_pids() if slot else []
        if slot is None or not children:
            return None
        pid = self.rng.choice(children)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return f"{slot.name} child {pid}"

    def stop_worker(self, pool: str | None = None) -> str | None:
        slot = self.fleet.pick(self.rng, pool)
        if slot is None:
            return None
        slot.stopped = True
        slot.worker.send_signal(signal.SIGSTOP, group=True)
        try:
            seconds = self.ttl + 1.0 + self.rng.uniform(0.0, 1.0)
            self._stop.wait(seconds)
        finally:
            slot.worker.send_signal(signal.SIGCONT, group=True)
            slot.stopped = False
        return f"{slot.name} for {seconds:.1f}s"

    def pause_store(self) -> str:
        self.store.pause()
        try:
            seconds = self._hold(0.3, 1.5)
        finally:
            self.store.resume()
        return f"lease redis for {seconds:.1f}s"

    def failover(self) -> str:
        return str(self.store.failover(self.rng))

    def blackhole(self) -> str:
        assert self.proxy is not None, "blackhole needs the proxy"
        self.proxy.blackhole()
        try:
            seconds = self._hold(0.3, 1.5)
        finally:
            self.proxy.heal()
        return f"proxy for {seconds:.1f}s"

    def restart_empty(self) -> str:
        client = self.store.client(socket_timeout=2.0)
        try:
            held = self.held_keys(client)
        finally:
            client.close()
        self.store.restart()
        self.erased(held)
        return f"lease redis on port {self.store.port} ({len(held)} leases erased)"

    def delete_key(self) -> str | None:
        client = self.store.client(socket_timeout=2.0)
        try:
            keys = self.held_keys(client)
            if not keys:
                return None
            key = self.rng.choice(keys)
            client.delete(key)
            self.erased([key])
            return key
        finally:
            client.close()

    def latency(self) -> str:
        assert self.proxy is not None, "latency needs the proxy"
        delay = self.rng.uniform(0.1, 0.4)
        ends = time.time() + self.rng.uniform(0.5, 1.0) * self.ttl
        pulses = 0
        try:
            while time.time() < ends and not self._stop.is_set():
                self.proxy.blackhole()
                time.sleep(delay)
                self.proxy.heal()
                time.sleep(0.03)
                pulses += 1
        finally:
            self.proxy.heal()
        return f"{pulses} pulses of {delay * 1000:.0f} ms"
