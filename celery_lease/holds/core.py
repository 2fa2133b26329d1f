"""What a hold does, whether it is entered from plain or from asyncio code.

Resolving its settings, one attempt at the key, waiting for a release, and the release that
wakes a waiter: :class:`HoldCore`, used by :class:`celery_lease.holds.plain.Hold` (``with``, the
decorator, the lock-like API) and :class:`celery_lease.holds.aio.AsyncHold` (``async with``).

Waiting (``on_conflict="wait"``) does not poll: a hold's release pushes one element to the
key's wake list (:func:`celery_lease.store.release_and_wake`) and a waiter blocks on it with
``BLPOP``, for at most the holder's remaining lifetime (a holder that dies never releases:
the key expires, and the waiter tries again then). One waiter is woken per release; it passes
the turn on with its own release. Fairness is not promised: a hold that arrives as the key is
freed can take it before a woken waiter.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from celery import current_app
from celery._state import get_current_task
from redis.exceptions import RedisError

from .. import store
from ..base import clock
from ..base.keys import DEFAULT_PREFIX, hold_key
from ..core import interrupt, lifecycle
from ..core.lease import Lease
from ..errors import LeaseConfigError, LeaseConflict, LeaseStoreUnavailable
from ..settings.config import LeaseSettings, resolve_settings
from . import options as hold_options

__all__ = ["EXPIRY_SLACK", "HOLD_TASK_NAME", "WAIT_CHUNK", "HoldCore", "HoldSpans", "end", "spans"]

logger = logging.getLogger("celery_lease")

#: The task name stored (and the metrics label) for a hold taken outside any Celery task.
HOLD_TASK_NAME = "celery_lease.hold"

# Longest single BLPOP, float seconds: a waiter re-reads the holder at least this often.
WAIT_CHUNK = 5.0
# Past the holder's expiry before trying again, float seconds (the key expires on the server).
EXPIRY_SLACK = 0.002


class HoldSpans(Protocol):
    """A span around each hold, from its entry to the end of its release."""

    def open(self, name: str, current: bool) -> Any:
        """Start the span of hold ``name`` (current inside the block when ``current``)."""

    def held(self, opened: Any, lease: Lease) -> None:
        """The hold whose span ``open`` returned ``opened`` was granted ``lease``."""

    def close(self, opened: Any, error: BaseException | None) -> None:
        """End the span, ``error`` ending the hold or its block (None: none)."""


#: Set by :mod:`celery_lease.ops.tracing` when OpenTelemetry is importable; None: a hold
#: opens no span (one global read per entry).
spans: HoldSpans | None = None


class HoldCore:
    """The options of a hold on ``name`` and its steps (see :func:`celery_lease.hold` for the
    options); no entering or leaving of its own.

    Attributes:
        name: the hold name (str).
        waiting: whether it waits for a release, and how long
            (:class:`celery_lease.holds.options.Waiting`, from ``on_conflict``, ``blocking`` and
            ``timeout``).
        on_conflict, timeout: as resolved (``"raise"`` or ``"wait"``; float seconds or None).
        lease: the :class:`~celery_lease.core.lease.Lease` while the object that uses these steps
            holds it, else ``None``.
    """

    def __init__(  # noqa: PLR0913 - hold()'s documented keyword options
        self,
        name: str,
        *,
        ttl: float | None = None,
        url: str | None = None,
        app: Any = None,
        on_conflict: str | None = None,
        timeout: float | None = None,
        blocking: bool | None = None,
        renew_interval: float | None = None,
        key_prefix: str | None = None,
        limit: int = 1,
    ) -> None:
        if type(limit) is not int or limit < 1:  # no arguments here for a callable to read
            raise LeaseConfigError(
                f"limit={limit!r} (hold {name!r}) must be a whole number of "
                f"holders >= 1 at once, e.g. limit=3"
            )
        self.limit = limit
        self.waiting = hold_options.resolve(name, on_conflict, blocking, timeout)
        # Kept resolved: a copy (fresh()) re-reads them without a second deprecation warning.
        self._params: dict[str, Any] = dict(
            ttl=ttl,
            url=url,
            app=app,
            on_conflict=self.waiting.on_conflict,
            timeout=self.waiting.timeout,
            renew_interval=renew_interval,
            key_prefix=key_prefix,
            limit=limit,
        )
        hold_key(DEFAULT_PREFIX, name)  # a bad name fails here, at once
        self.name = name
        self.on_conflict = self.waiting.on_conflict
        self.timeout = self.waiting.timeout
        self.lease: Lease | None = None

    @functools.cached_property
    def settings(self) -> LeaseSettings:
        """The resolved settings, on first use: a decorator applied at import time reads the
        app's configuration when the function is first called, not before it is configured.

        Raises:
            LeaseConfigError: an invalid option, or no Redis URL.
        """
        p = self._params
        return _settings(
            self.name, p["app"], p["url"], p["ttl"], p["renew_interval"], p["key_prefix"]
        )

    @functools.cached_property
    def key(self) -> str:
        """The Redis key: ``<lease_key_prefix>:{hold:<name>}`` (resolves the settings)."""
        return hold_key(self.settings.options.key_prefix, self.name)

    # -- taking and ending ----------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The store's client (process-wide, per URL and timeout)."""
        options = self.settings.options
        return store.client_for(self.settings.url, options.store_timeout, options.backend_options)

    def _wait_client(self) -> Any:
        # BLPOP blocks longer than a store call may: a client whose reads outlast it.
        options = self.settings.options
        return store.client_for(
            self.settings.url, WAIT_CHUNK + options.store_timeout, options.backend_options
        )

    def try_take(
        self, target: interrupt.Target, claim: lifecycle.Claim | None = None
    ) -> Lease | store.AcquireResult:
        """One attempt: the granted lease, or what the holder looks like.

        Args:
            target: where a loss is delivered.
            claim: set to the lease at the grant (:class:`celery_lease.core.lifecycle.Claim`), so
                an exit that lands before the caller stored the returned lease finds it.

        Raises:
            LeaseStoreUnavailable: the store could not be reached.
        """
        holder = _holder()
        # Above 1, one of the key's slots (store.slots); its task id is no reason to refuse.
        asked = lifecycle.AcquireRequest(store.key_shape(self.limit, same_task_id=False))
        try:
            return lifecycle.take(
                self.settings,
                self.client,
                self.key,
                holder,
                target,
                sender=holder.task_name,
                claim=claim,
                request=asked,
            )
        except RedisError as exc:
            raise LeaseStoreUnavailable(self.key, "acquire", store.describe(exc)) from None

    def conflict(self, found: store.AcquireResult, waited: float = 0.0) -> LeaseConflict:
        """The :class:`LeaseConflict` describing ``found`` (after ``waited`` float seconds)."""
        holder = found.holder
        if waited:
            logger.info("hold %r: still held after waiting %.3fs", self.name, waited)
        return LeaseConflict(self.key, holder.task_id, holder.where, found.remaining)

    def wait_time(self, found: store.AcquireResult, deadline: float | None) -> float:
        """How long to wait for a release before trying again (float seconds, <= 0: give up)."""
        # At least 10 ms: never a tight loop, whatever the remaining time read (a key without a
        # lifetime, not ours, counts as held for one TTL: store.acquire).
        chunk = min(max(found.remaining + EXPIRY_SLACK, 0.01), WAIT_CHUNK)
        if deadline is None:
            return chunk
        left = deadline - clock.now()
        return min(chunk, left) if left > 0 else 0.0

    def wait_released(self, seconds: float) -> bool:
        """Block up to ``seconds`` for a release of the key (True if woken by one).

        Raises:
            LeaseStoreUnavailable: the store could not be reached.
        """
        try:
            return store.wait_for_release(self._wait_client(), self.key, seconds)
        except RedisError as exc:
            raise LeaseStoreUnavailable(self.key, "wait", store.describe(exc)) from None


def end(lease: Lease, *, sender: Any) -> lifecycle.Ending:
    """:func:`celery_lease.core.lifecycle.end` with the release that wakes a waiting hold (of one
    slot only, for a hold with a ``limit`` above 1)."""
    release = store.key_shape(lease.limit, same_task_id=False).release_and_wake
    return lifecycle.end(lease, sender=sender, release=release)


def _settings(
    name: str,
    app: Any,
    url: str | None,
    ttl: float | None,
    renew_interval: float | None,
    key_prefix: str | None,
) -> LeaseSettings:
    conf: Mapping[str, Any] = (app if app is not None else current_app).conf
    where = f"hold {name!r}"
    overrides = {
        "lease_ttl": ttl,
        "lease_renew_interval": renew_interval,
        "lease_key_prefix": key_prefix,
        "lease_backend": url,
    }
    try:
        return resolve_settings(conf, overrides, where)
    except LeaseConfigError as exc:
        if "lease_backend is not set" not in str(exc):
            raise
        raise LeaseConfigError(
            f"{where}: no Redis URL for the lease store: pass url='redis://host:6379/1' or "
            f"app=<a Celery app with lease_backend or a Redis broker_url>, or set "
            f"lease_backend on the current Celery app (Celery's current app is per thread: "
            f"in a thread that did not create the app, pass app= or call app.set_default())"
        ) from None


def _holder() -> lifecycle.HolderInfo:
    """The enclosing Celery task (name, id, worker node), else this thread in this host."""
    task = get_current_task()
    request = getattr(task, "request", None) if task is not None else None
    if request is not None and getattr(request, "id", None):
        return lifecycle.HolderInfo(task.name, request.id, request.hostname or socket.gethostname())
    return lifecycle.HolderInfo(
        HOLD_TASK_NAME, threading.current_thread().name, socket.gethostname()
    )
