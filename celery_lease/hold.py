"""``celery_lease.hold()``: a lease around any block of code, in or out of a Celery task.

::

    with celery_lease.hold(f"invoice:{invoice_id}", ttl=20.0) as lease:
        ...  # renewed while inside; LeaseLost raised here if lost; lease.fencing_token

The same machinery as a leased task: :func:`celery_lease.lifecycle.take` and the release half
of :func:`~celery_lease.lifecycle.end`, the process's one heartbeat (every hold and task lease
of a process shares its round trip), :class:`~celery_lease.errors.LeaseLost` delivered to the
thread or greenlet that entered the block (:func:`celery_lease.interrupt.for_current_context`),
fencing tokens, signals and metrics.

What the store holds: the key ``<lease_key_prefix>:{hold:<name>}``; as the holder, the task
name and id of the enclosing Celery task, else ``celery_lease.hold`` and the thread's name
(a low-cardinality name: metrics are labelled with it; the key says which resource).

Waiting (``on_conflict="wait"``) does not poll: a hold's release pushes one element to the
key's wake list (:func:`celery_lease.store.release_and_wake`) and a waiter blocks on it with
``BLPOP``, for at most the holder's remaining lifetime (a holder that dies never releases:
the key expires, and the waiter tries again then). One waiter is woken per release; it passes
the turn on with its own release. Fairness is not promised: a hold that arrives as the key is
freed can take it before a woken waiter.
"""

from __future__ import annotations

import functools
import inspect
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

import wrapt
from celery import current_app
from celery._state import get_current_task
from redis.exceptions import RedisError

from . import clock, interrupt, lifecycle, store
from .config import LeaseSettings, resolve_settings
from .errors import LeaseConfigError, LeaseConflict, LeaseLost, LeaseStoreUnavailable
from .keys import DEFAULT_PREFIX, hold_key
from .lease import Lease

__all__ = ["HOLD_TASK_NAME", "Hold", "hold"]

logger = logging.getLogger("celery_lease")

#: The task name stored (and the metrics label) for a hold taken outside any Celery task.
HOLD_TASK_NAME = "celery_lease.hold"

F = TypeVar("F", bound=Callable[..., Any])

ON_CONFLICT = ("raise", "wait")
# Longest single BLPOP, float seconds: a waiter re-reads the holder at least this often.
WAIT_CHUNK = 5.0
# Past the holder's expiry before trying again, float seconds (the key expires on the server).
EXPIRY_SLACK = 0.002


class Hold:
    """A lease on ``name`` for a block of code; made by :func:`hold` (see it for the options).

    A context manager (``with``), a decorator (each call holds the lease), and a lock-like
    object (:meth:`acquire` / :meth:`release`). One entry at a time per object; the decorator
    makes a fresh object per call, so a decorated function may run in many threads.

    Attributes:
        name: the hold name (str).
        lease: the :class:`~celery_lease.lease.Lease` while held, else ``None``.
    """

    def __init__(self, name: str, *, ttl: float | None = None, url: str | None = None,
                 app: Any = None, on_conflict: str = "raise", timeout: float | None = None,
                 blocking: bool = True, renew_interval: float | None = None,
                 key_prefix: str | None = None) -> None:
        if on_conflict not in ON_CONFLICT:
            raise LeaseConfigError(
                f"on_conflict={on_conflict!r} (hold {name!r}) is not one of "
                f"{', '.join(map(repr, ON_CONFLICT))}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(
                timeout, (int, float)) or timeout < 0):
            raise LeaseConfigError(
                f"timeout={timeout!r} (hold {name!r}) must be None (wait as long as it takes) "
                f"or a number of seconds >= 0")
        self._params: dict[str, Any] = dict(
            ttl=ttl, url=url, app=app, on_conflict=on_conflict, timeout=timeout,
            blocking=blocking, renew_interval=renew_interval, key_prefix=key_prefix)
        hold_key(DEFAULT_PREFIX, name)  # a bad name fails here, at once
        self.name = name
        self.on_conflict = on_conflict
        self.timeout = timeout
        self.blocking = blocking
        self.lease: Lease | None = None

    @functools.cached_property
    def settings(self) -> LeaseSettings:
        """The resolved settings, on first use: a decorator applied at import time reads the
        app's configuration when the function is first called, not before it is configured.

        Raises:
            LeaseConfigError: an invalid option, or no Redis URL.
        """
        p = self._params
        return _settings(self.name, p["app"], p["url"], p["ttl"], p["renew_interval"],
                         p["key_prefix"])

    @functools.cached_property
    def key(self) -> str:
        """The Redis key: ``<lease_key_prefix>:{hold:<name>}`` (resolves the settings)."""
        return hold_key(self.settings.options.key_prefix, self.name)

    # -- taking and ending ----------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The store's client (process-wide, per URL and timeout)."""
        options = self.settings.options
        return store.client_for(self.settings.url, options.store_timeout,
                                     options.backend_options)

    def _wait_client(self) -> Any:
        # BLPOP blocks longer than a store call may: a client whose reads outlast it.
        options = self.settings.options
        return store.client_for(self.settings.url, WAIT_CHUNK + options.store_timeout,
                                     options.backend_options)

    def try_take(self, target: interrupt.Target) -> Lease | store.AcquireResult:
        """One attempt: the granted lease, or what the holder looks like.

        Raises:
            LeaseStoreUnavailable: the store could not be reached.
        """
        holder = _holder()
        try:
            return lifecycle.take(self.settings, self.client, self.key, holder, target,
                                  sender=holder.task_name)
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
        # At least 10 ms: a foreign key without a lifetime (remaining 0) is no tight loop.
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

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take the lease. Returns False when it is held elsewhere and not (or no longer) waited
        for: at once with ``blocking=False`` or ``on_conflict="raise"``, else after ``timeout``.

        Args:
            blocking: override the ``blocking`` given to :func:`hold`.
            timeout: override the ``timeout`` given to :func:`hold` (float seconds).

        Raises:
            RuntimeError: this object holds the lease already.
            LeaseStoreUnavailable: the store could not be reached.
        """
        return self._enter(blocking, timeout, raise_conflict=False)

    def _enter(self, blocking: bool | None, timeout: float | None, *,
               raise_conflict: bool) -> bool:
        if self.lease is not None:
            raise RuntimeError(f"hold {self.name!r} is held by this object already; use a new "
                               f"hold() for a nested block")
        blocking = self.blocking if blocking is None else blocking
        timeout = self.timeout if timeout is None else timeout
        wait = blocking and self.on_conflict == "wait"
        started = clock.now()
        deadline = None if timeout is None else started + timeout
        while True:
            got = self.try_take(interrupt.for_current_context(self.settings.signum))
            if isinstance(got, Lease):
                self.lease = got
                return True
            seconds = self.wait_time(got, deadline) if wait else 0.0
            if seconds <= 0:
                if raise_conflict:
                    raise self.conflict(got, clock.now() - started if wait else 0.0)
                return False
            self.wait_released(seconds)

    def release(self) -> bool:
        """End the lease: stop renewing it, release it (waking one waiter), announce it.

        Returns True when the release deleted the key (False: it was lost or had expired).

        Raises:
            RuntimeError: the lease is not held by this object.
            LeaseLost: it was lost while held and the loss was not raised in the block.
        """
        ending = self._release()
        if ending.loss is not None:
            raise ending.loss
        return bool(ending.released)

    def _release(self) -> lifecycle.Ending:
        lease = self.lease
        if lease is None:
            raise RuntimeError(f"hold {self.name!r} is not held")
        self.lease = None
        lease.target.finish()
        return end(lease, sender=lease.task_name)

    # -- with / decorator ---------------------------------------------------------------------

    def __enter__(self) -> Lease:
        self._enter(None, None, raise_conflict=True)
        assert self.lease is not None
        return self.lease

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        ending = self._release()
        if isinstance(exc, LeaseLost) and type(exc) is not LeaseLost:
            # The threads' per-delivery carrier: surface the public class.
            raise LeaseLost(*exc.args).with_traceback(tb) from None
        if exc is None and ending.loss is not None:
            raise ending.loss  # lost where it could not be raised (e.g. in a blocking call)
        return False

    def fresh(self) -> Hold:
        """A new, unheld object with the same options (the decorator uses one per call)."""
        copy = type(self)(self.name, **self._params)
        copy.settings = self.settings  # resolved once per decorated function, not per call
        return copy

    def __call__(self, func: F) -> F:
        """Decorate ``func``: each call runs inside a fresh hold (signature kept by ``wrapt``).

        A coroutine function gets :func:`celery_lease.hold_async` instead.
        """
        if inspect.iscoroutinefunction(func):
            from .hold_async import AsyncHold

            @wrapt.decorator
            async def run_async(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
                async with AsyncHold(self.name, settings=self.settings, **self._params):
                    return await wrapped(*args, **kwargs)

            return run_async(func)  # type: ignore[return-value]

        @wrapt.decorator
        def run(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            with self.fresh():
                return wrapped(*args, **kwargs)

        return run(func)  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<Hold {self.key} {'held' if self.lease is not None else 'not held'}>"


def hold(name: str, *, ttl: float | None = None, url: str | None = None, app: Any = None,
         on_conflict: str = "raise", timeout: float | None = None, blocking: bool = True,
         renew_interval: float | None = None, key_prefix: str | None = None) -> Hold:
    """A lease on ``name`` for a block of code: ``with hold(name) as lease:`` or ``@hold(name)``.

    Usable in any Celery task (leased or not), in beat, and in plain Python with no worker.

    Args:
        name: what is held (no braces or control characters; see
            :func:`celery_lease.hold_name` to build one from values). The key is
            ``<lease_key_prefix>:{hold:<name>}``.
        ttl: lease lifetime, float seconds (default: the app's ``lease_ttl``).
        url: the store's Redis URL (default: the app's ``lease_backend``, else its Redis
            ``broker_url``).
        app: the Celery app whose ``lease_*`` settings apply (default: ``celery.current_app``,
            which is per thread: the default app in a thread that did not create the app).
        on_conflict: ``"raise"`` (:class:`LeaseConflict` with the holder and its time left) or
            ``"wait"`` (until released, or ``timeout``; then :class:`LeaseConflict`).
        timeout: with ``"wait"``, the most float seconds to wait (``None``: no limit).
        blocking: False answers at once whatever ``on_conflict`` says.
        renew_interval: float seconds between renewals (default: ``ttl / 3``).
        key_prefix: overrides ``lease_key_prefix``.

    Entering returns the :class:`~celery_lease.lease.Lease` (``fencing_token``, ``check()``).
    A loss raises :class:`LeaseLost` in the thread or greenlet that entered the block (a
    signal on the main thread, an asynchronous exception in another thread, a throw into a
    greenlet); a loss that could not be raised inside is raised when the block ends.

    Raises:
        LeaseConfigError: an invalid ``on_conflict`` or ``timeout`` (here); an invalid setting,
            or no Redis URL from ``url``, ``app`` or the current app (on entry, or at the first
            call of a decorated function, before anything is sent).
        LeaseKeyError: an invalid ``name`` (here).
        LeaseConflict: (on entry) held elsewhere, and not or no longer waited for.
        LeaseStoreUnavailable: (on entry) the store could not be reached.
        LeaseLost: the lease was lost while held.
    """
    return Hold(name, ttl=ttl, url=url, app=app, on_conflict=on_conflict, timeout=timeout,
                blocking=blocking, renew_interval=renew_interval, key_prefix=key_prefix)


def end(lease: Lease, *, sender: Any) -> lifecycle.Ending:
    """:func:`celery_lease.lifecycle.end` with the release that wakes a waiting hold."""
    return lifecycle.end(lease, sender=sender, release=store.release_and_wake)


def _settings(name: str, app: Any, url: str | None, ttl: float | None,
              renew_interval: float | None, key_prefix: str | None) -> LeaseSettings:
    conf: Mapping[str, Any] = (app if app is not None else current_app).conf
    where = f"hold {name!r}"
    overrides = {"lease_ttl": ttl, "lease_renew_interval": renew_interval,
                 "lease_key_prefix": key_prefix, "lease_backend": url}
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
        return lifecycle.HolderInfo(
            task.name, request.id, request.hostname or socket.gethostname())
    return lifecycle.HolderInfo(
        HOLD_TASK_NAME, threading.current_thread().name, socket.gethostname())
