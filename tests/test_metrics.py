"""Prometheus metrics from a real prefork worker (multiprocess mode), scraped over HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_lease import LeaseLost, store
from harness.redis_server import free_port
from harness.waiting import wait_for
from tests.support.fixtures import WorkerFactory
from tests.support.workers import BROKER_URL_ENV, QUEUE_ENV, RESULT_BACKEND_ENV

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

APP = "tests.apps.ops_app"


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(port: int) -> Samples | None:
    """Every sample on /metrics, or ``None`` while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _value(samples: Samples | None, name: str, **labels: str) -> float:
    return (samples or {}).get((name, tuple(sorted(labels.items()))), 0.0)


def test_prefork_metrics_count_held_conflicts_losses_and_renewals(
    redis_url: str, worker_factory: WorkerFactory, tmp_path: Path
) -> None:
    multiproc = tmp_path / "prom"
    multiproc.mkdir()
    port = free_port()
    env = {
        BROKER_URL_ENV: redis_url,
        RESULT_BACKEND_ENV: redis_url,
        QUEUE_ENV: worker_factory.queue,
        "LEASE_TTL": "1.5",
        "METRICS_PORT": str(port),
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
    }
    worker = worker_factory(APP, pool="prefork", concurrency=2, env=env)
    wait_for(lambda: _scrape(port) is not None, 15, message=worker.log_tail)
    app = Celery("client", broker=redis_url, backend=redis_url)
    app.conf.task_default_queue = worker_factory.queue
    client = redis.Redis.from_url(redis_url)

    holder = app.send_task("ops.hold", ("metered", 30))
    wait_for(lambda: client.llen("started") >= 1, 15, message=worker.log_tail)
    assert app.send_task("ops.hold", ("metered", 30)).get(timeout=15)["lease_skipped"]

    def renewed_twice() -> Samples | None:
        samples = _scrape(port)
        count = _value(samples, "celery_lease_renewal_latency_seconds_count", task="ops.hold")
        return samples if count >= 2 else None

    samples = wait_for(renewed_twice, 10, message=worker.log_tail)
    assert _value(samples, "celery_lease_held", task="ops.hold") == 1.0
    assert _value(samples, "celery_lease_acquired_total", task="ops.hold") == 1.0
    assert _value(samples, "celery_lease_conflicts_total", task="ops.hold", policy="skip") == 1.0
    assert _value(samples, "celery_lease_renewal_margin_seconds_count", task="ops.hold") >= 2
    margin_sum = _value(samples, "celery_lease_renewal_margin_seconds_sum", task="ops.hold")
    assert margin_sum > 0  # each renewal still had most of the TTL left

    key = next(
        k.decode()
        for k in client.scan_iter(match="lease:{ops.hold:*", _type="STRING")
        if not k.endswith(b":fence")
    )
    value = client.get(key)
    assert value is not None
    assert store.revoke(client, key, store.parse_value(value).token)
    with pytest.raises(LeaseLost):
        holder.get(timeout=15)

    def lost() -> Samples | None:
        samples = _scrape(port)
        return (
            samples
            if _value(samples, "celery_lease_lost_total", task="ops.hold", cause="refused") == 1.0
            else None
        )

    samples = wait_for(lost, 10, message=worker.log_tail)
    assert _value(samples, "celery_lease_held", task="ops.hold") == 0.0
    worker.kill()


def _multiproc_env(
    redis_url: str, worker_factory: WorkerFactory, tmp_path: Path, port: int
) -> dict[str, str]:
    multiproc = tmp_path / "prom"
    multiproc.mkdir()
    return {
        BROKER_URL_ENV: redis_url,
        RESULT_BACKEND_ENV: redis_url,
        QUEUE_ENV: worker_factory.queue,
        "LEASE_TTL": "1.5",
        "METRICS_PORT": str(port),
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
    }


def test_held_gauge_returns_to_zero_once_the_child_holding_the_lease_is_sigkilled(
    redis_url: str, worker_factory: WorkerFactory, tmp_path: Path
) -> None:
    port = free_port()
    env = _multiproc_env(redis_url, worker_factory, tmp_path, port)
    worker = worker_factory(APP, pool="prefork", concurrency=2, env=env)
    wait_for(lambda: _scrape(port) is not None, 15, message=worker.log_tail)
    app = Celery("client", broker=redis_url, backend=redis_url)
    app.conf.task_default_queue = worker_factory.queue
    client = redis.Redis.from_url(redis_url)

    app.send_task("ops.hold", ("doomed", 60))
    started = wait_for(lambda: client.lindex("started", 0), 15, message=worker.log_tail)
    child = json.loads(started)["pid"]
    assert child in worker.child_pids()

    def held_is(value: float) -> Samples | None:
        samples = _scrape(port)
        return samples if _value(samples, "celery_lease_held", task="ops.hold") == value else None

    wait_for(lambda: held_is(1.0), 10, message=worker.log_tail)
    os.kill(child, signal.SIGKILL)  # no exit hook runs: the parent's scrape must reap it
    wait_for(lambda: held_is(0.0), 20, message=worker.log_tail)

    # The pool replaced the child; a clean run counts and leaves the gauge at 0 again.
    assert app.send_task("ops.hold", ("clean", 0.1)).get(timeout=30) == "clean"
    samples = _scrape(port)
    assert _value(samples, "celery_lease_held", task="ops.hold") == 0.0
    assert _value(samples, "celery_lease_acquired_total", task="ops.hold") == 2.0
    worker.kill()


DOCUMENTED_CALL_APP = """
from tests.apps.ops_app import app
from celery_lease import metrics

metrics.install(app, port={port})
metrics.install(app, port={port})  # a second call (a re-imported module) adds no server
"""


def test_documented_install_call_serves_with_the_default_address_and_only_once(
    redis_url: str, worker_factory: WorkerFactory, tmp_path: Path
) -> None:
    # `metrics.install(app, port=...)` as docs/operations/metrics.md writes it: no addr argument.
    port = free_port()
    (tmp_path / "documented_metrics_app.py").write_text(DOCUMENTED_CALL_APP.format(port=port))
    env = {
        BROKER_URL_ENV: redis_url,
        RESULT_BACKEND_ENV: redis_url,
        QUEUE_ENV: worker_factory.queue,
        "PYTHONPATH": str(tmp_path),
    }
    worker = worker_factory("documented_metrics_app", pool="solo", env=env)
    worker.wait_ready()
    samples = wait_for(lambda: _scrape(port), 15, message=worker.log_tail)
    assert any(
        name.startswith("python_") or name.startswith("process_") for name, _ in samples
    )  # the default registry is what is served
    log = worker.log_text()
    assert "Traceback" not in log
    assert log.count("lease metrics served on") == 1, worker.log_tail()
    worker.kill()


def test_install_refuses_a_second_port_in_the_same_process() -> None:
    code = (
        "from celery import Celery\n"
        "from celery_lease import metrics\n"
        "app = Celery('x')\n"
        "first = metrics.install(app, port=19808)\n"
        "assert metrics.install(app, port=19808) is first\n"
        "try:\n"
        "    metrics.install(app, port=19809)\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "already set up on 0.0.0.0:19808" in out


def test_reaping_keeps_live_and_counter_files_and_removes_dead_live_gauges(tmp_path: Path) -> None:
    from celery_lease.ops.metrics import reap_dead_processes

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    live = os.getpid()
    names = [
        f"gauge_livesum_{dead.pid}.db",
        f"gauge_livesum_{live}.db",
        f"counter_{dead.pid}.db",
        f"gauge_all_{dead.pid}.db",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert reap_dead_processes(str(tmp_path)) == [dead.pid]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])
