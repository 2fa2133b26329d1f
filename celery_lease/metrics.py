"""Optional Prometheus metrics for leases (``pip install 'celery-lease[prometheus]'``).

Call :func:`install` once where the app is defined (``celery_lease.metrics.install(app,
port=9808)``). It connects receivers to :mod:`celery_lease.signals`, so the metrics are
updated in the process that holds the lease (a prefork child, the worker itself for solo,
threads, gevent and eventlet, or a beat process for its leader lease), and serves them over
HTTP from the worker's main process.

Metrics (``task`` is the task name; ``celery.beat`` for a beat leader lease):

- ``celery_lease_held`` (gauge, ``task``): leases held right now.
- ``celery_lease_acquired_total`` (counter, ``task``).
- ``celery_lease_conflicts_total`` (counter, ``task``, ``policy``): refused duplicates.
- ``celery_lease_lost_total`` (counter, ``task``, ``cause``): ``refused``, ``deadline``,
  ``store_error``.
- ``celery_lease_renewal_failures_total`` (counter, ``task``).
- ``celery_lease_renewal_latency_seconds`` (histogram, ``task``): renewal round trip.
- ``celery_lease_renewal_margin_seconds`` (histogram, ``task``): time that was left to the
  local deadline when each renewal was confirmed. Values near zero mean the TTL is too short
  for the pauses this deployment sees.

Prefork: a prefork worker's leases are held in its children, so each child must write its
samples where the main process can read them. Set the ``PROMETHEUS_MULTIPROC_DIR``
environment variable to an empty directory *before the worker starts* (prometheus-client reads
it at import). :func:`install` then serves a ``MultiProcessCollector`` registry, the gauge
sums live processes only (``multiprocess_mode="livesum"``), and each child's files are
marked dead when it exits. Without the variable, metrics are process-local: fine for solo,
threads, gevent and eventlet, wrong for prefork (``install`` logs a warning when it can tell).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from . import signals

__all__ = ["LeaseMetrics", "install", "metrics"]

logger = logging.getLogger("celery_lease")

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
MARGIN_BUCKETS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)

_instance: LeaseMetrics | None = None


def _import_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ImportError(
            "celery_lease.metrics needs prometheus-client: pip install "
            "'celery-lease[prometheus]'") from None
    return prometheus_client


def _task_name(sender: Any) -> str:
    return str(getattr(sender, "name", sender) or "unknown")


class LeaseMetrics:
    """The lease metrics, registered in ``registry`` (default: prometheus' global registry).

    Attributes are the prometheus-client metric objects (``held``, ``acquired``,
    ``conflicts``, ``lost``, ``renewal_failures``, ``renewal_latency``, ``renewal_margin``).
    """

    def __init__(self, registry: Any = None, namespace: str = "celery_lease") -> None:
        prom = _import_prometheus()
        kw: dict[str, Any] = {"namespace": namespace}
        if registry is not None:
            kw["registry"] = registry
        self.held = prom.Gauge("held", "Leases held right now", ["task"],
                               multiprocess_mode="livesum", **kw)
        self.acquired = prom.Counter("acquired", "Leases granted", ["task"], **kw)
        self.conflicts = prom.Counter(
            "conflicts", "Executions refused because another one held the lease",
            ["task", "policy"], **kw)
        self.lost = prom.Counter("lost", "Leases lost while held", ["task", "cause"], **kw)
        self.renewal_failures = prom.Counter(
            "renewal_failures", "Renewal round trips that failed (timeout, connection)",
            ["task"], **kw)
        self.renewal_latency = prom.Histogram(
            "renewal_latency_seconds", "Round trip of a confirmed renewal", ["task"],
            buckets=LATENCY_BUCKETS, **kw)
        self.renewal_margin = prom.Histogram(
            "renewal_margin_seconds", "Time left to the local deadline when a renewal was "
            "confirmed", ["task"], buckets=MARGIN_BUCKETS, **kw)

    # -- signal receivers (weak=False: they are bound methods of a long-lived object) ----------

    def on_acquired(self, sender: Any = None, **kw: Any) -> None:
        task = _task_name(sender)
        self.acquired.labels(task).inc()
        self.held.labels(task).inc()

    def on_released(self, sender: Any = None, **kw: Any) -> None:
        self.held.labels(_task_name(sender)).dec()

    def on_conflict(self, sender: Any = None, policy: str = "", **kw: Any) -> None:
        self.conflicts.labels(_task_name(sender), policy or "unknown").inc()

    def on_lost(self, sender: Any = None, cause: str = "", **kw: Any) -> None:
        self.lost.labels(_task_name(sender), cause or "unknown").inc()

    def on_renewal_failed(self, sender: Any = None, **kw: Any) -> None:
        self.renewal_failures.labels(_task_name(sender)).inc()

    def on_renewed(self, sender: Any = None, latency: float = 0.0, margin: float = 0.0,
                   **kw: Any) -> None:
        task = _task_name(sender)
        self.renewal_latency.labels(task).observe(latency)
        self.renewal_margin.labels(task).observe(max(margin, 0.0))

    def connect(self) -> None:
        """Connect the receivers to :mod:`celery_lease.signals`."""
        signals.lease_acquired.connect(self.on_acquired, weak=False)
        signals.lease_released.connect(self.on_released, weak=False)
        signals.lease_conflict.connect(self.on_conflict, weak=False)
        signals.lease_lost.connect(self.on_lost, weak=False)
        signals.lease_renewal_failed.connect(self.on_renewal_failed, weak=False)
        signals.lease_renewed.connect(self.on_renewed, weak=False)


def metrics() -> LeaseMetrics | None:
    """The metrics :func:`install` created in this process, or ``None``."""
    return _instance


def _serve(port: int, addr: str) -> None:
    prom = _import_prometheus()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = prom.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        prom.start_http_server(port, addr=addr, registry=registry)
    else:
        prom.start_http_server(port, addr=addr)
    logger.info("lease metrics served on http://%s:%d/metrics", addr or "0.0.0.0", port)


def install(app: Any = None, port: int | None = None, addr: str = "") -> LeaseMetrics:
    """Create the lease metrics in this process and keep them updated; idempotent.

    Args:
        app: the Celery app. With ``port``, the HTTP server starts in the worker's main
            process when it is ready (``worker_ready``), never in a prefork child.
        port: TCP port for ``/metrics`` (int), or ``None`` to serve them yourself (e.g. with
            Flower's or your web app's registry).
        addr: address to bind (str, default all interfaces).

    Raises:
        ImportError: prometheus-client is not installed (the message names the extra).
    """
    global _instance
    if _instance is None:
        _instance = LeaseMetrics()
        _instance.connect()
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from celery.signals import worker_process_shutdown

            worker_process_shutdown.connect(_mark_dead, weak=False)
    if port is not None and app is not None:
        from celery.signals import worker_ready

        def _start(sender: Any = None, **kw: Any) -> None:
            pool = getattr(getattr(sender, "controller", None), "pool", None)
            prefork = type(pool).__module__.endswith(".prefork")
            if prefork and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                logger.warning(
                    "lease metrics: PROMETHEUS_MULTIPROC_DIR is not set; with the prefork "
                    "pool the leases live in the children and /metrics will miss them. Set "
                    "it to an empty directory before starting the worker")
            _serve(port, addr)

        worker_ready.connect(_start, weak=False)
    return _instance


def _mark_dead(sender: Any = None, pid: int | None = None, **kw: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid or os.getpid())  # type: ignore[no-untyped-call]
