"""``python -m benchmarks [--quick] [--out DIR]``: every benchmark in one run.

Starts two private redis-servers on free loopback ports (the broker and everything measured,
and a lease store for the loss-detection task that can be frozen), runs the seven benchmarks,
and writes ``results.json`` (every figure and the machine), ``results.md`` and the PNG plots
into ``--out`` (default ``docs/benchmarks/``). When ``--out`` is that default, the targets
table between the ``benchmarks:results`` markers in ``docs/benchmarks.md`` is refreshed too
(the page's other figures are written by hand from ``results.json``).

``--quick`` (the CI smoke run) makes every figure from fewer samples in about a minute; the
full run takes about seven minutes on two cores. The exit status is 1 when a figure is missing,
never because a target was missed (targets are reported, not asserted).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import redis

from harness import REPO_ROOT
from harness.redis_server import RedisServer, redis_server_binary

from . import cycle, detection, e2e, overhead, renewal, report, soak, stall
from ._infra import Worker, client_kwargs, section_timer

DEFAULT_OUT = REPO_ROOT / "docs" / "benchmarks"
DOC = REPO_ROOT / "docs" / "benchmarks.md"
MARK_START = "<!-- benchmarks:results:start -->"
MARK_END = "<!-- benchmarks:results:end -->"
STALL_TTLS_FULL = (1.0, 3.0)
STALL_TTLS_QUICK = (1.0,)
#: pool -> concurrency of the worker that serves it.
WORKERS = {"prefork": 2, "solo": 1, "threads": 2, "gevent": 4, "eventlet": 4}
PACKAGES = (
    "celery",
    "kombu",
    "redis",
    "celery-lease",
    "celery-singleton",
    "celery_once",
    "python-redis-lock",
    "pottery",
    "gevent",
    "eventlet",
    "matplotlib",
)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine(quick: bool, redis_version: str) -> dict[str, Any]:
    """What the run ran on."""
    import psutil

    return {
        "started_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": quick,
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "redis_server": redis_version,
        "redis_server_binary": redis_server_binary(),
        "packages": {name: _version(name) for name in PACKAGES},
        "git_commit": _git_commit(),
        "load_before": _load(),
    }


def _start_workers(
    broker: RedisServer,
    lease_store: RedisServer,
    records: redis.Redis,
    log_dir: Path,
    stall_ttls: tuple[float, ...],
) -> dict[str, Worker]:
    env = {
        "BENCH_BROKER": broker.url(),
        "BENCH_LEASE_STORE": lease_store.url(),
        "BENCH_DETECT_TTL": str(detection.TTL),
        "BENCH_STALL_TTLS": ",".join(str(t) for t in stall_ttls),
    }
    workers = {}
    for pool, concurrency in WORKERS.items():
        queues = [f"tp-{pool}", f"det-{pool}"] if pool in overhead.POOLS else [f"det-{pool}"]
        if pool == "prefork":
            queues.append("stall")
        if pool in soak.POOLS:
            queues.append(f"soak-{pool}")  # last: soak.py reads it from there
        workers[pool] = Worker(pool, concurrency, queues, env, log_dir, records).start()
    workers["e2e"] = e2e.start_worker(env, log_dir, records)  # a solo worker of its own
    return workers


class _Timings:
    """The float seconds each section of :func:`run_all` took (``seconds``, by name), each
    printed as it ends."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def section(self, name: str, progress: str = "") -> Iterator[None]:
        """Time the block as ``name``, ``progress`` (when given) printed as it starts; a block
        that raises is not noted (the run stops)."""
        elapsed = section_timer()
        if progress:
            print(progress, file=sys.stderr, flush=True)
        yield
        self.seconds[name] = round(elapsed(), 1)
        print(f"  {name}: {self.seconds[name]:.1f} s", file=sys.stderr, flush=True)


def run_all(quick: bool, log_dir: Path) -> dict[str, Any]:
    """Run the seven benchmarks and return every figure."""
    total = section_timer()
    timings = _Timings()
    stall_ttls = STALL_TTLS_QUICK if quick else STALL_TTLS_FULL
    with RedisServer() as broker, RedisServer() as lease_store:
        results: dict[str, Any] = {"meta": machine(quick, broker.version())}
        records = broker.client(**client_kwargs())
        with timings.section("cycle", "1/7 lease cycle cost"):
            results["cycle"] = cycle.run(broker.url(), quick)
            if broker.pid is not None and hasattr(os, "sched_setaffinity"):
                results["cycle"]["same_core"] = cycle.run_same_core(broker.url(), broker.pid, quick)
        workers: dict[str, Worker] = {}
        try:
            with timings.section("renewal", "3/7 renewal cost"):
                # The steady-state children mostly sleep: the workers start meanwhile.
                results["renewal"] = renewal.run(
                    broker.url(),
                    quick,
                    on_steady=lambda: workers.update(
                        _start_workers(broker, lease_store, records, log_dir, stall_ttls)
                    ),
                )
            with timings.section("workers ready"):
                for worker in workers.values():
                    worker.wait_ready()
            from .app import make_app

            app = make_app(broker.url(), lease_store.url(), detection.TTL, stall_ttls)
            with timings.section("overhead", "2/7 task overhead"):
                results["overhead"] = overhead.run(app, records, workers, quick)
            with timings.section("detection", "4/7 loss detection"):
                results["detection"] = detection.run(app, records, lease_store, workers, quick)
            with timings.section("stall", "5/7 stall after a crash"):
                results["stall"] = stall.run(app, records, workers["prefork"], stall_ttls, quick)
            with timings.section("soak", "6/7 soak"):
                results["soak"] = soak.run(app, records, workers, quick)
            with timings.section("e2e", "7/7 end to end (publisher + worker + Redis)"):
                results["e2e"] = e2e.run(app, records, workers["e2e"], broker.pid, quick)
        finally:
            for worker in workers.values():
                worker.stop()
    results["meta"]["load_after"] = _load()
    results["meta"]["section_s"] = timings.seconds
    results["meta"]["total_s"] = round(total(), 1)
    results["targets"] = report.targets(results)
    return results


def _refresh_doc(table: str) -> None:
    if not DOC.exists():
        return
    text = DOC.read_text()
    if MARK_START not in text or MARK_END not in text:
        return
    head, rest = text.split(MARK_START, 1)
    _, tail = rest.split(MARK_END, 1)
    DOC.write_text(f"{head}{MARK_START}\n\n{table}\n{MARK_END}{tail}")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer samples: every figure in about a minute (CI smoke run)",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output directory (default: docs/benchmarks/)"
    )
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="celery-lease-bench-"))  # worker logs
    print(f"worker logs in {log_dir}", file=sys.stderr)
    started = time.perf_counter()
    results = run_all(args.quick, log_dir)
    table = report.markdown(results)
    (out / "results.json").write_text(json.dumps(results, indent=1, sort_keys=False) + "\n")
    (out / "results.md").write_text("## Benchmark results\n\n" + table)
    report.plots(results, out)
    if out == DEFAULT_OUT.resolve():
        _refresh_doc(table[table.index("### Targets") :])
    print(table)
    missing = report.missing_figures(results)
    print(f"done in {time.perf_counter() - started:.0f} s; results in {out}", file=sys.stderr)
    if missing:
        print("MISSING FIGURES: " + ", ".join(missing), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
