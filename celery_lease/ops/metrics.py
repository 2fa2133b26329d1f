"""Optional Prometheus metrics for leases (``pip install 'celery-lease[prometheus]'``).

Call :func:`install` once where the app is defined (``celery_lease.ops.metrics.install(app,
port=9808)``). It connects receivers to :mod:`celery_lease.base.signals`, so the metrics are
updated in the process that holds the lease (a prefork child, the worker itself for solo,
threads, gevent and eventlet, or a beat process for its leader lease), and serves them over
HTTP from the worker's main process.

Metrics (``task`` is the task name; ``celery.beat`` for a beat leader lease):

- ``celery_lease_held`` (gauge, ``task``): leases held right now.
- ``celery_lease_acquired_total`` (counter, ``task``).
- ``celery_lease_conflicts_total`` (counter, ``task``, ``policy``): refused duplicates.
- ``celery_lease_publishes_total`` (counter, ``task``, ``disposition``): publishes of tasks
  with ``lease_dedupe`` or ``lease_debounce``: ``published``, ``deduplicated``,
  ``debounced`` (every publish of a burst), ``unguarded`` (counted where they are published:
  a web process, beat, a worker).
- ``celery_lease_coalesced_total`` (counter, ``task``): duplicates coalesced into a pending
  run (``lease_on_conflict="coalesce"``).
- ``celery_lease_queued_total`` (counter, ``task``): duplicates parked in a key's line
  (``lease_on_conflict="queue"``).
- ``celery_lease_line_length`` (histogram, ``task``): the line's length when a duplicate
  was parked (1: it is the head; a pending run counts 1).
- ``celery_lease_handed_over_total`` (counter, ``task``, ``by``): runs published when the key
  was handed to them, ``by`` the holder's ``release`` or the crash ``sweep``.
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
it at import). :func:`install` then serves a ``MultiProcessCollector`` registry and the gauge
sums live processes only (``multiprocess_mode="livesum"``). A child cannot be trusted to
clean up after itself (``SIGKILL``, the OOM killer and a segfault run no exit hook), so the
process that serves ``/metrics`` does it: before each collection it removes the live-gauge
files of every process that no longer exists (or whose pid now belongs to a newer process).
Counters and histograms of dead processes are kept, as Prometheus expects. Without the
variable, metrics are process-local: fine for solo, threads, gevent and eventlet, wrong for
prefork (``install`` logs a warning when it can tell).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..base import signals

__all__ = ["LeaseMetrics", "install", "metrics", "reap_dead_processes"]

logger = logging.getLogger("celery_lease")

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LINE_BUCKETS = (1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000)
MARGIN_BUCKETS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)

_instance: LeaseMetrics | None = None


def _import_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ImportError(
            "celery_lease.metrics needs prometheus-client: pip install 'celery-lease[prometheus]'"
        ) from None
    return prometheus_client


def _task_name(sender: Any) -> str:
    return str(getattr(sender, "name", sender) or "unknown")


class LeaseMetrics:
    """The lease metrics, registered in ``registry`` (default: prometheus' global registry).

    Attributes are the prometheus-client metric objects (``held``, ``acquired``,
    ``conflicts``, ``publishes``, ``coalesced``, ``queued``, ``line_length``, ``handed_over``,
    ``lost``, ``renewal_failures``, ``renewal_latency``, ``renewal_margin``).
    """

    def __init__(self, registry: Any = None, namespace: str = "celery_lease") -> None:
        prom = _import_prometheus()
        kw: dict[str, Any] = {"namespace": namespace}
        if registry is not None:
            kw["registry"] = registry
        self.held = prom.Gauge(
            "held", "Leases held right now", ["task"], multiprocess_mode="livesum", **kw
        )
        self.acquired = prom.Counter("acquired", "Leases granted", ["task"], **kw)
        self.conflicts = prom.Counter(
            "conflicts",
            "Executions refused because another one held the lease",
            ["task", "policy"],
            **kw,
        )
        self.publishes = prom.Counter(
            "publishes",
            "Publishes of tasks with lease_dedupe, by what was done",
            ["task", "disposition"],
            **kw,
        )
        self.lost = prom.Counter("lost", "Leases lost while held", ["task", "cause"], **kw)
        self.coalesced = prom.Counter(
            "coalesced", "Duplicates coalesced into a pending run", ["task"], **kw
        )
        self.queued = prom.Counter("queued", "Duplicates parked in a key's line", ["task"], **kw)
        self.line_length = prom.Histogram(
            "line_length",
            "A key's line length when a duplicate was parked",
            ["task"],
            buckets=LINE_BUCKETS,
            **kw,
        )
        self.handed_over = prom.Counter(
            "handed_over", "Runs published when the key was handed to them", ["task", "by"], **kw
        )
        self.renewal_failures = prom.Counter(
            "renewal_failures",
            "Renewal round trips that failed (timeout, connection)",
            ["task"],
            **kw,
        )
        self.renewal_latency = prom.Histogram(
            "renewal_latency_seconds",
            "Round trip of a confirmed renewal",
            ["task"],
            buckets=LATENCY_BUCKETS,
            **kw,
        )
        self.renewal_margin = prom.Histogram(
            "renewal_margin_seconds",
            "Time left to the local deadline when a renewal was confirmed",
            ["task"],
            buckets=MARGIN_BUCKETS,
            **kw,
        )

    # -- signal receivers (weak=False: they are bound methods of a long-lived object) ----------

    def on_acquired(self, sender: Any = None, **kw: Any) -> None:
        task = _task_name(sender)
        self.acquired.labels(task).inc()
        self.held.labels(task).inc()

    def on_released(self, sender: Any = None, **kw: Any) -> None:
        self.held.labels(_task_name(sender)).dec()

    def on_conflict(self, sender: Any = None, policy: str = "", **kw: Any) -> None:
        self.conflicts.labels(_task_name(sender), policy or "unknown").inc()

    def on_published(self, sender: Any = None, disposition: str = "", **kw: Any) -> None:
        self.publishes.labels(_task_name(sender), disposition or "unknown").inc()

    def on_coalesced(self, sender: Any = None, **kw: Any) -> None:
        task = _task_name(sender)
        self.coalesced.labels(task).inc()
        self.line_length.labels(task).observe(1)

    def on_queued(self, sender: Any = None, position: int = 0, **kw: Any) -> None:
        task = _task_name(sender)
        self.queued.labels(task).inc()
        self.line_length.labels(task).observe(position)

    def on_handed_over(self, sender: Any = None, by: str = "", **kw: Any) -> None:
        self.handed_over.labels(_task_name(sender), by or "unknown").inc()

    def on_lost(self, sender: Any = None, cause: str = "", **kw: Any) -> None:
        self.lost.labels(_task_name(sender), cause or "unknown").inc()

    def on_renewal_failed(self, sender: Any = None, **kw: Any) -> None:
        self.renewal_failures.labels(_task_name(sender)).inc()

    def on_renewed(
        self, sender: Any = None, latency: float = 0.0, margin: float = 0.0, **kw: Any
    ) -> None:
        task = _task_name(sender)
        self.renewal_latency.labels(task).observe(latency)
        self.renewal_margin.labels(task).observe(max(margin, 0.0))

    def connect(self) -> None:
        """Connect the receivers to :mod:`celery_lease.base.signals`."""
        signals.lease_acquired.connect(self.on_acquired, weak=False)
        signals.lease_released.connect(self.on_released, weak=False)
        signals.lease_conflict.connect(self.on_conflict, weak=False)
        signals.lease_published.connect(self.on_published, weak=False)
        signals.lease_lost.connect(self.on_lost, weak=False)
        signals.lease_coalesced.connect(self.on_coalesced, weak=False)
        signals.lease_queued.connect(self.on_queued, weak=False)
        signals.lease_handed_over.connect(self.on_handed_over, weak=False)
        signals.lease_renewal_failed.connect(self.on_renewal_failed, weak=False)
        signals.lease_renewed.connect(self.on_renewed, weak=False)


def metrics() -> LeaseMetrics | None:
    """The metrics :func:`install` created in this process, or ``None``."""
    return _instance


# -- reaping the live-gauge files of dead processes -----------------------------------------


def _process_start(pid: int) -> float | None:
    """Start time of ``pid`` (epoch seconds), ``None`` if it is gone or a zombie.

    Linux only (``/proc``); elsewhere the answer is "alive, start unknown" (``0.0``) when a
    signal 0 reaches it. A zombie is a child that is dead but not yet reaped by its parent.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()  # the name in parentheses may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return _boot_time() + int(fields[19]) / ticks


def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0  # pragma: no cover - every Linux /proc/stat has btime


def reap_dead_processes(path: str) -> list[int]:
    """Remove the live-gauge files of the processes in ``path`` that no longer exist.

    A file belongs to a dead process when its pid is gone or a zombie, or when the pid's
    current process started after the file was last written (the pid was reused). Counters
    and histograms are left alone: their totals must survive the process.

    Args:
        path: the ``PROMETHEUS_MULTIPROC_DIR`` directory (str).

    Returns:
        The pids whose files were removed (list of int).
    """
    from prometheus_client import multiprocess

    reaped = []
    for entry in os.scandir(path):
        name = entry.name
        if not (name.startswith("gauge_live") and name.endswith(".db")):
            continue
        try:
            pid = int(name[:-3].rsplit("_", 1)[1])
            written = entry.stat().st_mtime
        except (ValueError, IndexError, FileNotFoundError):
            continue
        started = _process_start(pid)
        # The owner started before it created the file; a process that started after the
        # last write has reused the pid (1 s of slack: /proc's boot time is whole seconds).
        if started is None or started > written + 1.0:
            try:
                multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
            except FileNotFoundError:  # reaped by a concurrent scrape
                continue
            reaped.append(pid)
    return reaped


class _ReapingCollector:
    """prometheus-client's multiprocess collector, reaping dead processes before each read."""

    def __init__(self, path: str) -> None:
        from prometheus_client import multiprocess

        self.path = path
        self._inner = multiprocess.MultiProcessCollector(None, path)  # type: ignore[no-untyped-call]

    def collect(self) -> Any:
        reap_dead_processes(self.path)
        return self._inner.collect()  # type: ignore[no-untyped-call]


# -- serving --------------------------------------------------------------------------------

_served: tuple[str, int] | None = None


def _serve(port: int, addr: str) -> None:
    prom = _import_prometheus()
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    registry = prom.REGISTRY
    if path:
        registry = prom.CollectorRegistry()
        registry.register(_ReapingCollector(path))
    try:
        prom.start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        logger.error(
            "lease metrics: cannot serve on %s:%d (%s); /metrics is not available. "
            "Pick another port in metrics.install(app, port=...)",
            addr,
            port,
            exc,
        )
        return
    logger.info("lease metrics served on http://%s:%d/metrics", addr, port)


def install(app: Any = None, port: int | None = None, addr: str = "0.0.0.0") -> LeaseMetrics:
    """Create the lease metrics in this process and keep them updated; idempotent.

    Args:
        app: the Celery app. With ``port``, the HTTP server starts in the worker's main
            process when it is ready (``worker_ready``), never in a prefork child.
        port: TCP port for ``/metrics`` (int), or ``None`` to serve them yourself (e.g. with
            Flower's or your web app's registry).
        addr: address to bind (str, default ``"0.0.0.0"``: every IPv4 interface; ``"::"``
            for every IPv6 one).

    Calling it again with the same ``port`` and ``addr`` does nothing more: one server.

    Raises:
        ImportError: prometheus-client is not installed (the message names the extra).
        ValueError: ``port`` or ``addr`` differ from those of an earlier call in this
            process (one process serves one ``/metrics``), or ``addr`` is empty.
    """
    global _instance, _served
    if not addr:
        raise ValueError(
            "metrics.install(addr=...) must name an address to bind, e.g. "
            "'0.0.0.0' (every IPv4 interface) or '127.0.0.1'"
        )
    if _instance is None:
        _instance = LeaseMetrics()
        _instance.connect()
    if port is None or app is None:
        return _instance
    if _served is not None:
        if _served != (addr, port):
            raise ValueError(
                f"metrics.install: /metrics is already set up on {_served[0]}:{_served[1]} in "
                f"this process; call install() with the same port and addr, or only once"
            )
        return _instance
    _served = (addr, port)
    from celery.signals import worker_ready

    def _start(sender: Any = None, **kw: Any) -> None:
        pool = getattr(getattr(sender, "controller", None), "pool", None)
        prefork = type(pool).__module__.endswith(".prefork")
        if prefork and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            logger.warning(
                "lease metrics: PROMETHEUS_MULTIPROC_DIR is not set; with the prefork "
                "pool the leases live in the children and /metrics will miss them. Set "
                "it to an empty directory before starting the worker"
            )
        _serve(port, addr)

    worker_ready.connect(_start, weak=False)
    return _instance
