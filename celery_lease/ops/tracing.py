"""OpenTelemetry: the lease on the spans of ``opentelemetry-instrumentation-celery``
(``pip install 'celery-lease[otel]'``; docs/howto/tracing.md).

Switched on when ``import celery_lease`` finds the ``opentelemetry`` package: it imports this
module and calls :func:`install`. Without the package nothing of it is imported and the
signals it listens to keep no receiver (a leased execution does no work for it). With the
package but no tracer provider, the first signal received finds none and switches it off in
that process (a receiver of Celery's signals costs more than the rest of a lease's signals:
none is left connected for spans that would not be recorded); a forked child decides again,
as it sets its own provider (``worker_process_init``). So set the tracer provider before the
process's first leased execution, hold or publish, or call :func:`install` after setting it.
:func:`uninstall` switches it off for good.

What is recorded, and where (durations are float seconds):

- On the span current when a task's lease is granted, the task run's span that the Celery
  instrumentation opened: ``celery_lease.key``, ``celery_lease.fencing_token``,
  ``celery_lease.wait_seconds`` (from the span's start to the grant), then, at the release,
  ``celery_lease.renewals`` (renewals confirmed while held, counted from
  :data:`~celery_lease.base.signals.lease_renewed` on the heartbeat thread) and
  ``celery_lease.held_seconds``.
- On a duplicate's run span: ``celery_lease.conflict`` (how the conflict ended: ``skipped``,
  ``retried``, ``failed``, ``coalesced``, ``queued``, ``preempted``, ``redelivered``,
  ``successor``, ``handed_over``), ``celery_lease.holder_task_id``; when its message was put
  aside, ``celery_lease.disposition`` (``coalesced``, or ``parked`` with
  ``celery_lease.position``); after a take-over, ``celery_lease.preempted_task_id`` and
  ``celery_lease.preempted_fencing_token``.
- A loss: an exception event (``span.record_exception``) with the :class:`LeaseLost`, and
  ``celery_lease.cause`` (:class:`~celery_lease.errors.LostCause`) and
  ``celery_lease.late_seconds``, on the span of the execution (or hold) that held the lease,
  whichever thread learnt of it.
- On the publisher's current span, one event ``celery_lease.publish`` per publish of a task
  with ``lease_dedupe`` or ``lease_debounce`` (an event: one span may publish many, and a
  leased publisher's own ``celery_lease.key`` must stay its own): ``celery_lease.key``,
  ``celery_lease.disposition`` (``published``, ``deduplicated``, ``debounced``,
  ``unguarded``), ``celery_lease.task_id``.
- :func:`celery_lease.hold` and :func:`celery_lease.hold_async` open a span of their own,
  ``lease.hold`` (``celery_lease.hold``: the hold's name), current inside the block, with the
  lease's attributes above; a hold that did not get the key ends it with the error.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from ..base import signals
from ..core.lease import Lease
from ..errors import LeaseLost
from ..holds import core as hold_core

__all__ = ["HOLD_SPAN", "PREFIX", "HoldSpans", "install", "installed", "uninstall"]

#: The namespace of every attribute recorded here.
PREFIX = "celery_lease."
#: The name of a hold's span (its hold name is an attribute: names often carry ids).
HOLD_SPAN = "lease.hold"

#: How a conflict ended, per the policy :data:`~celery_lease.base.signals.lease_conflict` names.
_ENDINGS = {
    "skip": "skipped",
    "retry": "retried",
    "fail": "failed",
    "coalesce": "coalesced",
    "queue": "queued",
    "preempt": "preempted",
}

_tracer = trace.get_tracer("celery_lease")
logger = logging.getLogger("celery_lease")

#: Whether this process looked for a tracer provider since the last :func:`install`.
_checked = False
#: Whether it found none and switched itself off (a forked child looks again).
_off_for_now = False


def _tracing_on() -> bool:
    """At the first signal since :func:`install`: whether a tracer provider is set; without
    one, everything is disconnected (no receiver is left to pay for)."""
    global _checked, _off_for_now
    _checked = True
    provider = trace.get_tracer_provider()
    if not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return True
    uninstall()
    _off_for_now = True
    logger.debug("lease tracing off in process %d: no OpenTelemetry tracer provider", os.getpid())
    return False


class _Traced:
    """A held lease's span, and its renewals (counted on the heartbeat thread only, read at
    the release, once the heartbeat no longer has the lease)."""

    __slots__ = ("renewals", "span")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.renewals = 0


#: token -> the span of the execution or hold that holds it (recording spans only).
_held: dict[str, _Traced] = {}


def _wait_seconds(span: Any) -> float | None:
    """Float seconds from the start of ``span`` to now (the SDK's spans know their start)."""
    started = getattr(span, "start_time", None)
    return None if started is None else max(time.time_ns() - started, 0) / 1e9


def _granted(span: Any, key: str, token: str, fencing_token: int) -> None:
    _held[token] = _Traced(span)
    span.set_attribute(PREFIX + "key", key)
    span.set_attribute(PREFIX + "fencing_token", fencing_token)
    waited = _wait_seconds(span)
    if waited is not None:
        span.set_attribute(PREFIX + "wait_seconds", waited)


# -- receivers (task-side ones find the task run's span current; holds register their own) -----


def _on_acquired(
    sender: Any = None, key: str = "", token: str = "", fencing_token: int = 0, **kw: Any
) -> None:
    if isinstance(sender, str) or not (_checked or _tracing_on()):
        return  # a hold (registered by HoldSpans.held), or beat's leader lease
    span = trace.get_current_span()
    if span.is_recording():
        _granted(span, key, token, fencing_token)


def _on_renewed(sender: Any = None, token: str = "", **kw: Any) -> None:
    traced = _held.get(token)
    if traced is not None:
        traced.renewals += 1


def _on_lost(
    sender: Any = None, token: str = "", cause: str = "", late: float = 0.0, **kw: Any
) -> None:
    traced = _held.get(token)
    error = kw.get("error")
    if traced is not None and isinstance(error, BaseException):
        traced.span.record_exception(
            error, attributes={PREFIX + "cause": cause, PREFIX + "late_seconds": late}
        )


def _on_released(sender: Any = None, token: str = "", held: float = 0.0, **kw: Any) -> None:
    traced = _held.pop(token, None)
    if traced is not None:
        traced.span.set_attribute(PREFIX + "renewals", traced.renewals)
        traced.span.set_attribute(PREFIX + "held_seconds", held)


def _on_conflict(sender: Any = None, policy: str = "", holder_task_id: str = "", **kw: Any) -> None:
    if isinstance(sender, str) or not (_checked or _tracing_on()):
        return  # beat's standby: no task span
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute(PREFIX + "conflict", _ENDINGS.get(policy, policy))
    span.set_attribute(PREFIX + "holder_task_id", holder_task_id or "")


def _on_coalesced(sender: Any = None, **kw: Any) -> None:
    span = trace.get_current_span()
    if (_checked or _tracing_on()) and span.is_recording():
        span.set_attribute(PREFIX + "disposition", "coalesced")


def _on_queued(sender: Any = None, position: int = 0, **kw: Any) -> None:
    span = trace.get_current_span()
    if (_checked or _tracing_on()) and span.is_recording():
        span.set_attribute(PREFIX + "disposition", "parked")
        span.set_attribute(PREFIX + "position", position)


def _on_preempted(
    sender: Any = None,
    preempted_task_id: str = "",
    preempted_fencing_token: int = 0,
    **kw: Any,
) -> None:
    span = trace.get_current_span()
    if (_checked or _tracing_on()) and span.is_recording():
        span.set_attribute(PREFIX + "preempted_task_id", preempted_task_id or "")
        span.set_attribute(PREFIX + "preempted_fencing_token", preempted_fencing_token)


def _on_published(
    sender: Any = None, key: str = "", task_id: str = "", disposition: str = "", **kw: Any
) -> None:
    span = trace.get_current_span()
    if (_checked or _tracing_on()) and span.is_recording():
        span.add_event(
            PREFIX + "publish",
            {
                PREFIX + "key": key,
                PREFIX + "disposition": disposition,
                PREFIX + "task_id": task_id or "",
            },
        )


_RECEIVERS = (
    (signals.lease_acquired, _on_acquired),
    (signals.lease_renewed, _on_renewed),
    (signals.lease_lost, _on_lost),
    (signals.lease_released, _on_released),
    (signals.lease_conflict, _on_conflict),
    (signals.lease_coalesced, _on_coalesced),
    (signals.lease_queued, _on_queued),
    (signals.lease_preempted, _on_preempted),
    (signals.lease_published, _on_published),
)


# -- holds: a span of their own -----------------------------------------------------------------


class _Opened:
    """A hold's span, and the context token that made it current (None: not made current)."""

    __slots__ = ("span", "token")

    def __init__(self, span: Any, token: object | None) -> None:
        self.span = span
        self.token = token


class HoldSpans:
    """What :mod:`celery_lease.holds` calls to trace a hold
    (:class:`celery_lease.holds.core.HoldSpans`): a ``lease.hold`` span from the entry to the
    end of the release."""

    def open(self, name: str, current: bool) -> _Opened:
        """Start the span of hold ``name``; make it current when ``current`` (a block, not
        the steps of a generator, which run in their caller's context)."""
        if not (_checked or _tracing_on()):
            return _Opened(trace.INVALID_SPAN, None)
        span = _tracer.start_span(HOLD_SPAN, attributes={PREFIX + "hold": name})
        token = otel_context.attach(trace.set_span_in_context(span)) if current else None
        return _Opened(span, token)

    def held(self, opened: _Opened, lease: Lease) -> None:
        """The hold was granted ``lease``."""
        if opened.span.is_recording():
            _granted(opened.span, lease.key, lease.token, lease.fencing_token)

    def close(self, opened: _Opened, error: BaseException | None) -> None:
        """End the span (``error``: what ended the hold or its block, recorded on it; a
        :class:`LeaseLost` was recorded at the loss, with its cause)."""
        span = opened.span
        try:
            if error is not None and span.is_recording():
                if not isinstance(error, LeaseLost):
                    span.record_exception(error)
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(error)))
        finally:
            if opened.token is not None:
                otel_context.detach(opened.token)  # type: ignore[arg-type]
            span.end()


def install() -> None:
    """Record leases on the current spans and give holds a span of their own (idempotent;
    ``import celery_lease`` calls it when OpenTelemetry is importable). The first signal
    received looks for a tracer provider, and switches it off again without one."""
    global _checked, _off_for_now
    _checked = _off_for_now = False
    for signal, receiver in _RECEIVERS:
        signal.connect(receiver, weak=False)
    hold_core.spans = HoldSpans()


def uninstall() -> None:
    """Switch it off: no receiver, no hold span (idempotent)."""
    global _off_for_now
    _off_for_now = False
    for signal, receiver in _RECEIVERS:
        signal.disconnect(receiver)
    hold_core.spans = None
    _held.clear()


def _after_fork_in_child() -> None:
    """A forked child (a prefork pool's) sets its own tracer provider: it looks again."""
    if _off_for_now:
        install()


os.register_at_fork(after_in_child=_after_fork_in_child)


def installed() -> bool:
    """Whether leases are recorded on spans in this process."""
    return hold_core.spans is not None
