"""Benchmark 3: what keeping N leases alive costs one process, next to python-redis-lock.

Each measurement runs in a fresh child process (``python -m benchmarks.renewal ...``), so its
threads and memory are its own:

- ``passes`` (celery-lease only; children run one after another): N leases at a short interval
  (``lease_ttl`` 3 s, renewed every 1 s); after a warm-up, every call of
  :func:`celery_lease.store.renew_many` is timed (wall and heartbeat-thread CPU), and the round
  trips sent (``send_packed_command`` calls, counted on the connection class) are divided by
  the passes the heartbeat made.
- ``steady`` (both libraries; children run side by side, started a second apart): N leases at
  the production interval (10 s: ``lease_ttl`` 30 s; python-redis-lock's ``expire=15`` with its
  auto-renewal every ``expire * 2 / 3``); over one interval plus a little, the process CPU time,
  the round trips, the threads and the resident memory added by the N leases.

Leases are taken with :func:`celery_lease.store.acquire` and handed to the process heartbeat the
way ``LeasedTask`` does, with a target that only counts deliveries (a loss would show up as
``lost`` > 0).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from harness import REPO_ROOT

from ._infra import percentile

NS = (1, 100, 1000, 10000)
#: python-redis-lock starts one thread per lock: these are the Ns run for it. At 10 000 it
#: needs 10 000 threads and, when their renewals coincide, up to 10 000 connections (Redis'
#: default ``maxclients``) on a shared 2-core machine; that N is reported as not run.
REDIS_LOCK_NS = (1, 100, 1000)


# --- child side ---------------------------------------------------------------------------------


class _SendCounter:
    """Counts every request written to Redis (one per command, one per whole pipeline)."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def install(self) -> None:
        """Wrap redis-py's ``Connection.send_packed_command`` in this process."""
        from redis.connection import Connection

        original = Connection.send_packed_command

        def counted(conn: Any, command: Any, check_health: bool = True) -> Any:
            with self._lock:
                self.value += 1
            return original(conn, command, check_health)

        Connection.send_packed_command = counted  # type: ignore[method-assign]


_sent = _SendCounter()


def _rss_and_threads() -> tuple[int, int]:
    import psutil

    proc = psutil.Process()
    return int(proc.memory_info().rss), int(proc.num_threads())


class _CountingTarget:
    """A delivery target that only counts: nothing is interrupted in the benchmark."""

    mechanism = "count"
    delivered = 0

    def deliver(self, error: BaseException) -> bool:
        _CountingTarget.delivered += 1
        return True

    def finish(self) -> None:
        pass


def _take_leases(url: str, n: int, ttl: float, threads: int = 1) -> list[Any]:
    """Acquire ``n`` leases and hand them to the heartbeat.

    ``threads`` > 1 takes them from that many threads (faster set-up, but each thread leaves
    a malloc arena behind, so not where memory is measured).
    """
    from concurrent.futures import ThreadPoolExecutor

    from celery_lease import store
    from celery_lease.base import clock
    from celery_lease.core.heartbeat import heartbeat
    from celery_lease.core.lease import Lease
    from celery_lease.settings.config import resolve_options

    options = resolve_options({}, {"lease_ttl": ttl, "lease_backend": url}, "benchmark")
    client = store.client_for(url, options.store_timeout)
    holder = store.holder_json("bench.renewal", "task-id", "host", os.getpid())
    beat = heartbeat()
    run = uuid.uuid4().hex[:8]

    def take(i: int) -> Any:
        key = f"bench:renewal:{run}:{i}"
        token = uuid.uuid4().hex
        sent_at = clock.now()
        found = store.acquire(client, key, token, options.ttl_ms, holder)
        if not found.granted:
            raise AssertionError(f"lease {key} not granted")
        lease = Lease(
            key=key,
            token=token,
            fencing_token=found.holder.fencing_token,
            task_name="bench.renewal",
            task_id=f"t{i}",
            options=options,
            client=client,
            target=_CountingTarget(),
            sent_at=sent_at,
        )
        beat.add(lease)
        return lease

    if threads <= 1:
        return [take(i) for i in range(n)]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(take, range(n)))


def _heartbeat_cpu() -> Callable[[], float]:
    """Float seconds of CPU used so far by the heartbeat thread."""
    thread = next(t for t in threading.enumerate() if t.name == "celery-lease-heartbeat")
    clock_id = time.pthread_getcpuclockid(thread.ident or 0)
    return lambda: time.clock_gettime(clock_id)


def child_passes(url: str, n: int, warmup: float, window: float) -> dict[str, Any]:
    """Per-pass costs of renewing ``n`` leases at a 1 s interval (ttl 3 s)."""
    from celery_lease import store

    calls: list[tuple[float, float, int, int]] = []  # (wall s, cpu s, leases, round trips)
    recording = threading.Event()
    original = store.renew_many

    def timed(client: Any, leases: Any, *args: Any) -> Any:
        # Only the heartbeat talks to Redis once the leases are taken: the requests written
        # during this call are this pass's round trips.
        wall, cpu, sent = time.perf_counter(), time.thread_time(), _sent.value
        try:
            return original(client, leases, *args)
        finally:
            if recording.is_set():
                calls.append(
                    (
                        time.perf_counter() - wall,
                        time.thread_time() - cpu,
                        len(leases),
                        _sent.value - sent,
                    )
                )

    store.renew_many = timed  # type: ignore[assignment]
    _sent.install()
    leases = _take_leases(url, n, 3.0, threads=8)
    time.sleep(warmup)
    cpu = _heartbeat_cpu()
    sent0, cpu0, wall0 = _sent.value, cpu(), time.perf_counter()
    recording.set()
    time.sleep(window)
    recording.clear()
    sent, used, wall = _sent.value - sent0, cpu() - cpu0, time.perf_counter() - wall0
    passes = len(calls)
    return {
        "n": n,
        "interval_s": 1.0,
        "window_s": wall,
        "passes": passes,
        "round_trips_per_pass": sum(c[3] for c in calls) / passes if passes else None,
        "round_trips_per_interval": sent / wall,
        "leases_per_pass": sum(c[2] for c in calls) / passes if passes else None,
        "renew_call_wall_ms": {
            "median": percentile([c[0] * 1e3 for c in calls], 50),
            "max": max(c[0] * 1e3 for c in calls),
        }
        if calls
        else None,
        # Each call's wall time per lease it renewed, the slowest of them: the passes renew
        # different numbers of leases, so the slowest call over the mean count would mix them.
        "renew_call_wall_us_per_lease_max": max(c[0] * 1e6 / c[2] for c in calls)
        if calls
        else None,
        "renew_call_cpu_ms": percentile([c[1] * 1e3 for c in calls], 50) if calls else None,
        "thread_cpu_per_pass_ms": used / passes * 1e3 if passes else None,
        "lost": _CountingTarget.delivered,
        "held": len(leases),
    }


def _warm_up(impl: str, url: str, client: Any) -> None:
    """One acquire, renewal and release with ``impl``, outside of what is measured."""
    key = f"bench:warm:{uuid.uuid4().hex}"
    if impl == "celery_lease":
        from celery_lease import store

        lease_client = store.client_for(url, 2.0)
        token = uuid.uuid4().hex
        store.acquire(lease_client, key, token, 5000, "{}")
        store.renew_many(lease_client, [(key, token, 5000)])
        store.release(lease_client, key, token)
    else:
        import redis_lock

        lock = redis_lock.Lock(client, key, expire=5)
        lock.acquire(blocking=False)
        lock.extend()
        lock.release()


def child_steady(impl: str, url: str, n: int, interval: float, window: float) -> dict[str, Any]:
    """CPU, round trips, threads and memory of keeping ``n`` locks alive for ``window`` s."""
    import redis
    import redis_lock

    import celery_lease.core.heartbeat
    import celery_lease.core.lease
    import celery_lease.store  # noqa: F401  (imported before the memory baseline)

    from ._infra import client_kwargs

    client = redis.Redis.from_url(url, **client_kwargs())
    _warm_up(impl, url, client)  # scripts loaded, connections open, before any figure
    gc.collect()
    rss0, threads0 = _rss_and_threads()
    _sent.install()
    held: list[Any] = []
    if impl == "celery_lease":
        held = _take_leases(url, n, interval * 3)
    else:
        expire = round(interval * 3 / 2)  # renewed every expire * 2 / 3 = interval
        run = uuid.uuid4().hex[:8]
        for i in range(n):
            lock = redis_lock.Lock(
                client, f"bench:rlock:{run}:{i}", expire=expire, auto_renewal=True
            )
            if not lock.acquire(blocking=False):
                raise AssertionError("python-redis-lock not acquired")
            held.append(lock)
    gc.collect()
    rss1, threads1 = _rss_and_threads()
    sys.stdout.write("acquired\n")  # the parent waits for this before loading the machine
    sys.stdout.flush()
    sent0, cpu0, wall0 = _sent.value, time.process_time(), time.perf_counter()
    time.sleep(window)
    sent, cpu, wall = _sent.value - sent0, time.process_time() - cpu0, time.perf_counter() - wall0
    rss2, threads2 = _rss_and_threads()
    return {
        "impl": impl,
        "n": n,
        "interval_s": interval,
        "window_s": wall,
        "round_trips_per_interval": sent * interval / wall,
        "cpu_percent_of_one_core": cpu / wall * 100,
        "cpu_ms_per_interval": cpu * interval / wall * 1e3,
        "threads_added": max(threads1, threads2) - threads0,
        "rss_added_mib": (max(rss1, rss2) - rss0) / 2**20,
        "lost": _CountingTarget.delivered,
    }


def _child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.renewal")
    parser.add_argument("mode", choices=("passes", "steady"))
    parser.add_argument(
        "--impl", default="celery_lease", choices=("celery_lease", "python_redis_lock")
    )
    parser.add_argument("--url", required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--window", type=float, required=True)
    args = parser.parse_args(argv)
    if args.mode == "passes":
        result = child_passes(args.url, args.n, args.warmup, args.window)
    else:
        result = child_steady(args.impl, args.url, args.n, args.interval, args.window)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # daemon renewal threads: leave without joining or releasing anything


# --- parent side --------------------------------------------------------------------------------


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.renewal", *args],
        stdout=subprocess.PIPE,
        stderr=tempfile.TemporaryFile(),
        text=True,
        env=env,
        cwd=str(REPO_ROOT),
    )


def _collect(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The child's JSON result (its last line of output)."""
    out = proc.stdout.read() if proc.stdout is not None else ""
    proc.wait(timeout)
    lines = [line for line in out.strip().splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        err = ""
        if proc.stderr is not None:
            proc.stderr.seek(0)
            err = proc.stderr.read()
            err = err.decode(errors="replace") if isinstance(err, bytes) else err
        raise RuntimeError(f"renewal child failed ({proc.returncode}):\n{err[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run(url: str, quick: bool, on_steady: Callable[[], None] | None = None) -> dict[str, Any]:
    """Benchmark 3 against the Redis at ``url``.

    ``on_steady`` is called once the per-pass children are done, while the steady-state ones
    sleep through their window (the caller starts its workers then). In ``quick`` mode the
    per-pass children run side by side too.
    """
    warmup, window = (1.0, 1.5) if quick else (2.0, 3.0)
    passes = {}
    procs = []
    for n in NS:
        procs.append(
            (
                n,
                _spawn(
                    [
                        "passes",
                        "--url",
                        url,
                        "--n",
                        str(n),
                        "--warmup",
                        str(warmup),
                        "--window",
                        str(window),
                    ]
                ),
            )
        )
        if not quick:
            passes[str(n)] = _collect(procs[-1][1], 120)
    for n, proc in procs:
        if str(n) not in passes:
            passes[str(n)] = _collect(proc, 120)
    # python-redis-lock renews every expire * 2 / 3 with a whole-seconds expire: 2 s and 10 s
    # intervals are ones it can express (expire 3 s and 15 s).
    interval = 2.0 if quick else 10.0
    steady_window = interval * 1.05
    children: list[tuple[str, int, subprocess.Popen[str]]] = []
    plan = [("celery_lease", n) for n in NS] + [("python_redis_lock", n) for n in REDIS_LOCK_NS]
    for impl, n in plan:
        children.append(
            (
                impl,
                n,
                _spawn(
                    [
                        "steady",
                        "--impl",
                        impl,
                        "--url",
                        url,
                        "--n",
                        str(n),
                        "--interval",
                        str(interval),
                        "--window",
                        str(steady_window),
                    ]
                ),
            )
        )
        time.sleep(0.2 if quick else 1.0)  # stagger: their renewal passes must not coincide
    for _impl, _n, proc in children:  # every lease taken before anything else starts
        if proc.stdout is None or proc.stdout.readline().strip() != "acquired":
            _collect(proc, 60)  # raises with the child's error output
    if on_steady is not None:
        on_steady()
    steady: dict[str, dict[str, Any]] = {"celery_lease": {}, "python_redis_lock": {}}
    for impl, n, proc in children:
        steady[impl][str(n)] = _collect(proc, 180)
    for n in NS:
        if n not in REDIS_LOCK_NS:
            steady["python_redis_lock"][str(n)] = {
                "impl": "python_redis_lock",
                "n": n,
                "not_run": (
                    f"one thread per lock: {n} threads and up to {n} simultaneous connections"
                ),
            }
    return {"passes": passes, "steady": steady, "steady_interval_s": interval}


if __name__ == "__main__":
    _child_main(sys.argv[1:])
