"""Prometheus metrics from a real prefork worker (multiprocess mode), scraped over HTTP."""

from __future__ import annotations

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
    env = {BROKER_URL_ENV: redis_url, RESULT_BACKEND_ENV: redis_url,
           QUEUE_ENV: worker_factory.queue, "LEASE_TTL": "1.5", "METRICS_PORT": str(port),
           "PROMETHEUS_MULTIPROC_DIR": str(multiproc)}
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

    key = next(k.decode() for k in client.scan_iter(match="lease:{ops.hold:*", _type="STRING")
               if not k.endswith(b":fence"))
    value = client.get(key)
    assert value is not None
    assert store.release(client, key, store.parse_value(value).token)
    with pytest.raises(LeaseLost):
        holder.get(timeout=15)

    def lost() -> Samples | None:
        samples = _scrape(port)
        return samples if _value(samples, "celery_lease_lost_total", task="ops.hold",
                                 cause="refused") == 1.0 else None

    samples = wait_for(lost, 10, message=worker.log_tail)
    assert _value(samples, "celery_lease_held", task="ops.hold") == 0.0
    worker.kill()
