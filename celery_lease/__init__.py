"""celery-lease: singleton Celery tasks with a renewed Redis lease.

``@app.task(base=LeasedTask)`` takes a lease keyed by the task name and arguments before the
body runs, renews it from a heartbeat thread while the body runs, releases it when the
execution ends, and raises :class:`LeaseLost` inside the body the moment it is lost.

The map, bottom layer first; each subpackage imports only from itself and those below it, no
policy imports another policy, and the core imports none (tests/test_layout.py checks all
three, and that this map names every module)::

    base/        clock, process, keys, key_encoding, signals, headers (the message headers)
    errors       the exceptions (at the root: a stored failure names this module)
    store/       the Redis side: protocol, lua, wire, connection, routing, topology, url,
                 primary, sentinels, replicated, renewal, pending, written, value, records,
                 errors, permissions, async_wait, health (whether the store answers, logged
                 once per outage), and each policy's store half: claims, debounce,
                 handoff, preempt, slots, cooldown; shape (a key: plain, or N slots)
    settings/    config, names, timing, signal_setting, publish, debounce
    core/        lease, lifecycle, heartbeat, interrupt, next_instruction, eager
    policies/    base (the Policy interface), compose (the one place that composes them and
                 holds every combination rule); one unit each: skip (+ fail), redelivery
                 (successor, handed-over copy), dedupe, debounce (+ eager), handoff (+ waiting:
                 coalesce, queue, retry), preempt, limit, cooldown
    execution/   task, accepted, publishing, lease_tasks, outage
    holds/       plain, aio, core, options, shapes
    beat/        scheduler, leader
    ops/         cli, doctor (+ claims, sentinels, consumer_timeout), finding, inspection,
                 flower, metrics, tracing (OpenTelemetry, switched on below when importable),
                 acl, worker, sweep, testing
    (root)       signals, flower, metrics, testing: the documented import paths, re-exported
"""

from __future__ import annotations

import importlib.util

from .base.keys import hold_name
from .core.lease import Lease, current_lease
from .errors import (
    LeaseConfigError,
    LeaseConflict,
    LeaseError,
    LeaseKeyError,
    LeaseLost,
    LeaseStartRefused,
    LeaseStoreUnavailable,
    LostCause,
)
from .execution.lease_tasks import (
    apply_lease_tasks,  # also: applies app.conf.lease_tasks at finalize
)
from .execution.task import LeasedTask
from .holds.aio import AsyncHold, hold_async
from .holds.plain import Hold, hold
from .policies.handoff import follow, is_coalesced
from .policies.skip import is_skipped

__all__ = [
    "AsyncHold",
    "Hold",
    "Lease",
    "LeaseConfigError",
    "LeaseConflict",
    "LeaseError",
    "LeaseKeyError",
    "LeaseLost",
    "LeaseStartRefused",
    "LeaseStoreUnavailable",
    "LeasedTask",
    "LostCause",
    "apply_lease_tasks",
    "current_lease",
    "follow",
    "hold",
    "hold_async",
    "hold_name",
    "is_coalesced",
    "is_skipped",
]

__version__ = "0.1.0"


def _opentelemetry_importable() -> bool:
    try:  # a top-level name: nothing is imported to answer
        return importlib.util.find_spec("opentelemetry") is not None
    except (ImportError, ValueError):  # an import hook refusing it, a None in sys.modules
        return False


# The `otel` extra: spans carry the lease. Without OpenTelemetry nothing of it is imported and
# no signal gets a receiver: a leased execution does no work for it.
if _opentelemetry_importable():
    from .ops import tracing as _tracing

    _tracing.install()
