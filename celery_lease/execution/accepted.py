"""The acquire of a leased execution, written as the worker's pool accepts its request.

Celery's pool calls a request's ``on_accepted`` right before it runs the task; Celery then
records the start, schedules the message's acknowledgement, sends ``task-started`` when events
are on (a round trip to a Redis broker), and runs its tracer's set-up, ``task_prerun`` and the
task's ``before_start``. :class:`LeasedRequest`, the request class of
:class:`~celery_lease.LeasedTask`, writes the execution's acquire before all that and leaves its
reply unread (:mod:`celery_lease.store.written`); the execution reads it where it takes its
lease (:func:`celery_lease.core.lifecycle.take`), and waits only for what is left of its round trip.
The lease is still taken as the execution starts: at the accept, the moment Celery itself
records as the task's start (``time_start``, ``task-started``), never while the message waits
in the worker.

Written only where the accept and the execution happen in one process (the solo, threads,
gevent and eventlet pools; prefork's accept runs in the parent, so its child acquires when it
runs the task), and only for a plain acquire (see :func:`_write_plain`); every
other execution acquires when it reaches the lease, as before. A written acquire goes to its
execution by task id. One its execution never took is abandoned (its reply read, its token
released) when the request fails (``before_start`` raised), or else by the next accept in the
process once older than its renewal interval (a task class whose own ``__call__`` never
reaches the lease); until then it holds the key, as a crashed holder would, within its TTL.
Anything that goes wrong while writing it is left to the execution's own acquire, which meets
the same error and handles it as configured.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from celery.worker.request import Request
from kombu.utils.compat import detect_environment

from .. import store
from ..base import clock, process
from ..base.headers import CLAIM_HEADER, HANDOFF_HEADER
from ..policies import compose
from ..store import written

__all__ = ["LeasedRequest"]

logger = logging.getLogger("celery_lease")


class LeasedRequest(Request):  # type: ignore[misc]
    """Celery's worker request, writing the leased execution's acquire at its accept."""

    def on_accepted(self, pid: int, time_accepted: float) -> None:
        """Write the acquire (where this process runs the task), then Celery's own accept.

        Args:
            pid: the process (prefork), or the greenlet id (gevent, eventlet), that runs it.
            time_accepted: Celery's monotonic time of the accept (float seconds).
        """
        mine = None
        green = detect_environment() != "default"  # type: ignore[no-untyped-call]
        if pid == process.pid() or green:
            written.abandon_stale(clock.now())
            mine = _write(self)
        try:
            super().on_accepted(pid, time_accepted)
        except BaseException:
            if mine is not None and written.take(self.id) is mine:
                mine.abandon()  # the acknowledgement failed: the task does not run
            raise

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        """Celery's end of a failed request (a success ends in Celery's own subclass); first
        abandons an acquire the execution never took (``before_start`` raised)."""
        _abandon(self.id)
        return super().on_failure(
            exc_info, send_failed_event=send_failed_event, return_ok=return_ok
        )


def _write(request: Request) -> written.WrittenAcquire | None:
    """The request's acquire, written and kept for its execution; None when none was."""
    task = request.task
    if not hasattr(task, "_lease_key") or request.id is None:  # no LeasedTask: nothing to do
        return None
    try:
        found = _write_plain(task, request)
    except Exception as exc:  # the execution's own acquire meets it and handles it
        logger.debug(
            "acquire not written at accept: task %s[%s]: %s",
            request.name,
            request.id,
            store.describe(exc),
        )
        return None
    if found is None:
        return None
    mine, stale_at = found
    if not written.keep(request.id, mine, stale_at):
        mine.abandon()  # a copy of this message accepted at the same moment keeps its own
        return None
    return mine


def _write_plain(task: Any, request: Request) -> tuple[written.WrittenAcquire, float] | None:
    """Write the execution's acquire when it is a plain one, as
    :meth:`~celery_lease.LeasedTask._acquire` would send it first, and return it with the
    :func:`celery_lease.base.clock.now` time (float seconds) at which it goes stale untaken (its
    renewal interval after it was sent); None (nothing sent) for a limited key, replicas to
    wait for, a redelivered or debounced message (each acquires its own way), or a client that
    is not standalone.

    Raises:
        LeaseConfigError, LeaseKeyError, redis.exceptions.RedisError: as the execution's own
            acquire would raise them.
    """
    headers = request.request_dict
    _, settings, steps = task._lease_resolve()
    options = settings.options
    if compose.acquires_apart(steps, task, headers, options):
        return None
    key = task._lease_key(options, request.args, request.kwargs)
    client = store.client_for(settings.url, options.store_timeout, options.backend_options)
    holder = store.holder_json(
        task.name, request.id, request.hostname or socket.gethostname(), process.pid()
    )
    mine = written.write(
        client,
        key,
        options.ttl_ms,
        holder,
        request.id,
        HANDOFF_HEADER in headers,
        CLAIM_HEADER in headers,
    )
    return None if mine is None else (mine, mine.sent_at + options.renew_interval)


def _abandon(task_id: str) -> None:
    found = written.take(task_id)
    if found is not None:
        found.abandon()
