"""``python -m benchmarks.profile [--out DIR]``: where a leased execution spends its time.

Written for ``docs/benchmarks.md`` ("The targets missed"):

- ``profile-leased-task.txt``: a pyinstrument profile of ``LeasedTask.apply()`` (the whole
  execution path: key, token, acquire, heartbeat, body, release) repeated against a private
  redis-server, with the same trivial body the throughput benchmark runs;
- ``profile-steps.json``: the median cost in µs of each Python step of that path measured
  alone, next to one ``PING`` round trip, to the acquire and release calls, to the same two
  calls as redis-py's ``Lock`` makes them, and to the server-side time per call of the
  celery-lease scripts and of ``SET NX PX`` (``INFO commandstats``).

py-spy gives the same picture on a live worker (``py-spy record -p <worker pid> --idle -f raw``)
where ptrace is allowed; pyinstrument needs nothing but this process.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import REPO_ROOT
from harness.redis_server import RedisServer

from ._infra import percentile


def _median_us(fn: Callable[[], Any], count: int = 3000) -> float:
    samples = []
    for _ in range(count):
        started = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - started) / 1000)
    return percentile(samples, 50)


def steps(app: Any, url: str) -> dict[str, float]:
    """Median µs of each step of a leased execution, each measured alone."""
    from celery_lease import store
    from celery_lease.base import clock, signals
    from celery_lease.core import interrupt
    from celery_lease.core.heartbeat import heartbeat
    from celery_lease.core.lease import Lease

    task = app.tasks["bench.leased"]
    options = task.lease_settings().options
    client = store.client_for(url, options.store_timeout)
    args = ("run", 1, 10**9)
    result: dict[str, float] = {}
    result["ping_round_trip"] = _median_us(lambda: client.execute_command("PING"))
    result["lease_settings"] = _median_us(task.lease_settings)
    result["lease_key_for"] = _median_us(lambda: task.lease_key_for(args, {}))
    result["token"] = _median_us(lambda: os.urandom(16).hex())  # as lifecycle.take makes it
    result["holder_json"] = _median_us(
        lambda: store.holder_json(task.name, "task-id", socket.gethostname(), os.getpid())
    )
    result["target_create_finish"] = _median_us(lambda: interrupt.for_current_context(12).finish())
    found = store.acquire(client, "profile:key", "t" * 32, options.ttl_ms, "{}")
    result["parse_value"] = _median_us(lambda: store.parse_value(found.holder.token + ":1:{}"))
    store.release(client, "profile:key", "t" * 32)

    def lease_add_remove() -> None:
        lease = Lease(
            key="k",
            token="t",
            fencing_token=1,
            task_name=task.name,
            task_id="i",
            options=options,
            client=client,
            target=interrupt.for_current_context(12),
            sent_at=clock.now(),
        )
        beat = heartbeat(12)
        beat.add(lease)
        beat.remove(lease)
        lease.target.finish()

    result["lease_heartbeat_add_remove"] = _median_us(lease_add_remove)
    result["signals_acquired_released"] = _median_us(
        lambda: (
            signals.lease_acquired.send(
                sender=task, key="k", token="t", fencing_token=1, task_id="i", ttl=1.0, latency=0.0
            ),
            signals.lease_released.send(
                sender=task,
                key="k",
                token="t",
                fencing_token=1,
                task_id="i",
                held=0.0,
                released=True,
            ),
        )
    )
    result["acquire_call"], result["release_call"] = _acquire_release(client, options.ttl_ms)
    # The same two calls as redis-py's Lock makes them, on the same client.
    lock_release = client.lock("profile:rp").lua_release
    result["redis_py_set_nx_px_call"] = _median_us(
        lambda: client.set("profile:rp", "t" * 32, nx=True, px=options.ttl_ms)
    )
    result["redis_py_lock_release_call"] = _median_us(
        lambda: lock_release(keys=["profile:rp"], args=["t" * 32], client=client)
    )
    # Server-side time per call (INFO commandstats) of each script and of SET.
    client.config_resetstat()
    _acquire_release(client, options.ttl_ms, 1000)
    evalsha = client.info("commandstats").get("cmdstat_evalsha", {})
    result["server_us_per_script_call_avg_of_acquire_and_release"] = float(
        evalsha.get("usec_per_call", 0.0)
    )
    client.config_resetstat()
    for i in range(1000):
        client.set(f"profile:rp:{i % 64}", "t", nx=True, px=options.ttl_ms)
        client.delete(f"profile:rp:{i % 64}")
    stats = client.info("commandstats").get("cmdstat_set", {})
    result["server_us_per_set_nx_px"] = float(stats.get("usec_per_call", 0.0))
    return result


def _acquire_release(client: Any, ttl_ms: int, count: int = 2000) -> tuple[float, float]:
    from celery_lease import store

    acquires, releases = [], []
    for i in range(count):
        key, token = f"profile:cycle:{i % 64}", uuid.uuid4().hex
        started = time.perf_counter_ns()
        store.acquire(client, key, token, ttl_ms, "{}")
        middle = time.perf_counter_ns()
        store.release(client, key, token)
        releases.append((time.perf_counter_ns() - middle) / 1000)
        acquires.append((middle - started) / 1000)
    return percentile(acquires, 50), percentile(releases, 50)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "benchmarks")
    parser.add_argument("--count", type=int, default=3000)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    from pyinstrument import Profiler

    from .app import make_app

    with RedisServer() as server:
        os.environ["BENCH_BROKER"] = server.url()
        app = make_app(server.url())
        leased = app.tasks["bench.leased"]
        for i in range(200):  # warm-up
            leased.apply(("warm", i, 10**9))
        profiler = Profiler(interval=0.0002)
        profiler.start()
        for i in range(args.count):
            leased.apply(("run", i, 10**9))
        profiler.stop()
        text = profiler.output_text(unicode=False, color=False, show_all=False)
        (args.out / "profile-leased-task.txt").write_text(text)
        measured = steps(app, server.url())
    (args.out / "profile-steps.json").write_text(
        json.dumps({k: round(v, 1) for k, v in measured.items()}, indent=1) + "\n"
    )
    print(text)
    print(json.dumps({k: round(v, 1) for k, v in measured.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
