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

A Sentinel failover is not injected: the campaign runs one lease Redis, without replicas.
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

import redis

from .history import Fault
from .infra import CeleryWorker, RedisServer, TcpProxy

__all__ = ["FAULTS", "Fleet", "Nemesis"]

#: Every kind of fault, with its weight in the draw.
FAULTS: Mapping[str, int] = {
    "kill_worker": 2, "kill_child": 2, "stop_worker": 2, "pause_store": 2, "blackhole": 2,
    "restart_empty": 1, "delete_key": 2, "latency": 2,
}

#: Worker concurrency per pool on a 2-core machine.
CONCURRENCY = {"prefork": 2, "threads": 2, "gevent": 4, "solo": 1, "eventlet": 4}
#: The pools the workers cycle through.
POOLS = ("prefork", "threads", "gevent")


@dataclass
class Slot:
    """One supervised worker: its pool, the current process, how often it was restarted."""

    name: str
    pool: str
    worker: CeleryWorker
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
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _new_worker(self, pool: str) -> CeleryWorker:
        worker = CeleryWorker(self.app_module, pool=pool, concurrency=CONCURRENCY[pool],
                              queue=self.queue, env=self.env, log_dir=self.log_dir)
        return worker.start()

    def start(self, count: int, timeout: float = 90.0) -> None:
        """Start ``count`` workers of the pools in turn and wait until all are ready."""
        for i in range(count):
            pool = POOLS[i % len(POOLS)]
            self.slots.append(Slot(f"w{i}-{pool}", pool, self._new_worker(pool)))
        for slot in self.slots:
            slot.worker.wait_ready(timeout)
        self._thread = threading.Thread(target=self._supervise, daemon=True, name="supervisor")
        self._thread.start()

    def _supervise(self) -> None:
        while not self._closing.wait(0.2):
            with self._lock:
                for slot in self.slots:
                    if not slot.worker.is_running():
                        slot.worker.kill()  # reap it, and whatever is left of its group
                        slot.worker = self._new_worker(slot.pool)
                        slot.restarts += 1

    def pick(self, rng: random.Random, pool: str | None = None) -> Slot | None:
        """A random running slot (of ``pool``, if given)."""
        with self._lock:
            alive = [s for s in self.slots if s.worker.is_running() and not s.stopped
                     and (pool is None or s.pool == pool)]
        return rng.choice(alive) if alive else None

    def close(self) -> None:
        """Stop supervising, then stop every worker (resuming a stopped one first)."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(5)
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
        store: the lease Redis; ``proxy``: the proxy the workers reach it through.
        ttl: the lease TTL (float seconds): sizes the pauses.
        held_keys: returns the lease keys currently present (for ``delete_key``).
        erased: called with the lease keys a fault erased (to send duplicates of their jobs).
    """

    def __init__(self, rng: random.Random, fleet: Fleet, store: RedisServer, proxy: TcpProxy,
                 ttl: float, held_keys: Callable[[redis.Redis], list[str]],
                 erased: Callable[[list[str]], None] = lambda keys: None) -> None:
        self.plan = random.Random(rng.random())
        self.rng = random.Random(rng.random())
        self.fleet = fleet
        self.store = store
        self.proxy = proxy
        self.ttl = ttl
        self.held_keys = held_keys
        self.erased = erased
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self._stop = threading.Event()

    def run(self, until: float) -> None:
        """Inject faults until the wall time ``until`` (or :meth:`stop`), then heal all."""
        try:
            while not self._stop.is_set() and time.time() < until:
                if self._stop.wait(self.plan.uniform(0.5, 2.5)):
                    break
                kind = self.plan.choices(list(FAULTS), weights=list(FAULTS.values()))[0]
                started = time.time()
                try:
                    target = getattr(self, kind)()
                except Exception as exc:  # a fault that could not be injected is reported
                    self.errors.append(f"{kind}: {exc!r}")
                    continue
                if target is not None:
                    self.faults.append(Fault(kind, target, started, time.time()))
        finally:
            self.heal()

    def stop(self) -> None:
        """Ask :meth:`run` to stop after the current fault."""
        self._stop.set()

    def heal(self) -> None:
        """Undo whatever may still be in force (idempotent)."""
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

    def kill_child(self) -> str | None:
        slot = self.fleet.pick(self.rng, "prefork")
        children = slot.worker.child_pids() if slot else []
        if slot is None or not children:
            return None
        pid = self.rng.choice(children)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return f"{slot.name} child {pid}"

    def stop_worker(self) -> str | None:
        slot = self.fleet.pick(self.rng)
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

    def blackhole(self) -> str:
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
