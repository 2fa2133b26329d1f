"""``async with celery_lease.hold_async(name)``: :func:`celery_lease.hold` for asyncio code.

The lease is taken and released by the same code as :func:`~celery_lease.hold` (one store
round trip, run in a small thread pool of the library's own, :data:`STORE_THREADS`, so it never
blocks the loop and never shares the loop's default executor with the program), renewed by the
process's one heartbeat thread. A loss cancels the task that entered the block, from its own
loop (:class:`celery_lease.core.interrupt.AsyncioTarget`); the block's exit turns that cancellation
into :class:`~celery_lease.errors.LeaseLost`. A cancellation that came from elsewhere (a
timeout, ``task.cancel()``) stays a ``CancelledError``, also when both happen at once: on
Python 3.11+ the task's cancellation count tells them apart (``Task.uncancel``); on 3.10 the
cancellation's message does.

Waiting (``on_conflict="wait"``) awaits ``BLPOP`` on a ``redis.asyncio`` client of the
waiting hold's own (:mod:`celery_lease.store.async_wait`): a waiter holds no executor thread
and no pooled connection, so the holder's release and the program's own ``run_in_executor``
work never queue behind waiters, however many (a waiter takes a store thread only for one
acquire, when woken or when its holder's lifetime ran out).

Cancellation (``task.cancel()``, a timeout) never leaves a lease that nobody holds: cancelled
while taking, the take is awaited to its end and a lease it was granted is released by its
token; while waiting, the ``BLPOP`` ends at once (and, the key having room, the next waiter
is woken: the cancelled one may have taken a release's wake-up unread; room is a free key,
or for a hold with a ``limit`` a free slot); while ending, the release is awaited to its end.
Then the ``CancelledError`` is raised. Each of these waits lasts at most a store call
(``lease_store_timeout``, twice for a connection that broke).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from redis.exceptions import RedisError

from .. import store
from ..base import clock
from ..core import interrupt
from ..core.lease import Lease
from ..core.lifecycle import Ending
from ..errors import LeaseStoreUnavailable
from ..store.async_wait import AsyncWaiter
from . import core as hold_core
from .core import WAIT_CHUNK, HoldCore, end

__all__ = ["STORE_THREADS", "AsyncHold", "hold_async"]

T = TypeVar("T")

#: Threads of the process's pool for hold_async's store calls (take, release): a pool of its
#: own, so they never queue behind the program's work in the loop's default executor, nor
#: the program's behind them. Each call lasts one round trip (at most lease_store_timeout).
STORE_THREADS = 4
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _store_threads() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="celery-lease-async")
        return _pool


def _forget_pool() -> None:
    """In a forked child: the parent's threads do not exist here."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


async def _complete(future: asyncio.Future[Any]) -> bool:
    """Await ``future`` to its end through any cancellation of the awaiting task (a store call
    ends within its timeout). Returns True if the task was cancelled meanwhile."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait([future])
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


async def _off_loop(
    call: Callable[..., T], *args: Any, abandoned: Callable[[T], Awaitable[None]] | None = None
) -> T:
    """Run ``call(*args)`` in the store threads (:data:`STORE_THREADS`). If the awaiting task
    is cancelled, the call is still awaited to its end and ``abandoned`` awaited with its
    result (e.g. a lease to release) before the ``CancelledError`` is raised."""
    future = asyncio.get_running_loop().run_in_executor(_store_threads(), call, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await _complete(future)
        if abandoned is not None and not future.cancelled() and future.exception() is None:
            await abandoned(future.result())
        raise


async def _release_abandoned(got: Lease | store.AcquireResult) -> None:
    """A lease granted to a task cancelled meanwhile: nobody runs under it, release it (by its
    token) before the cancellation goes on."""
    if isinstance(got, Lease):
        got.target.finish()
        future = asyncio.get_running_loop().run_in_executor(
            _store_threads(), lambda: end(got, sender=got.task_name)
        )
        await _complete(future)


def _pass_turn(h: HoldCore) -> None:
    """Best effort: a waiter cancelled in its BLPOP wakes the next one if the key has room (is
    free; for a hold with a ``limit``, has a free slot)."""
    try:
        store.key_shape(h.limit, same_task_id=False).pass_turn(h.client, h.key)
    except RedisError:
        pass  # the other waiters fall back to their own BLPOP's end


class AsyncHold:
    """``async with`` a lease on ``name``; made by :func:`hold_async` (same options as
    :func:`celery_lease.hold`).

    Attributes:
        name, key: as :class:`~celery_lease.holds.plain.Hold`.
        lease: the :class:`~celery_lease.core.lease.Lease` while held, else ``None``.
    """

    @property
    def key(self) -> str:
        """The Redis key (resolves the settings)."""
        return self._hold.key

    def __init__(self, name: str, *, settings: Any = None, **options: Any) -> None:
        self._hold = HoldCore(name, **options)
        if settings is not None:  # already resolved (the decorator's)
            self._hold.settings = settings
        self.name = name
        self.lease: Lease | None = None
        self._target: interrupt.AsyncioTarget | None = None
        # (tracer, its span) while entered (celery_lease.holds.core.spans)
        self._span: tuple[hold_core.HoldSpans, Any] | None = None

    async def __aenter__(self) -> Lease:
        h = self._hold
        if self.lease is not None:
            raise RuntimeError(f"hold {self.name!r} is held by this object already")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("hold_async() must be entered from an asyncio task")
        loop = asyncio.get_running_loop()
        h.settings  # noqa: B018 - resolved here: celery.current_app is per thread
        tracing = hold_core.spans
        self._span = None if tracing is None else (tracing, tracing.open(self.name, True))
        try:
            got = await self._take_or_wait(h, task, loop)
        except BaseException as exc:
            if self._span is not None:
                self._close_span(exc)
            raise
        if self._span is not None:
            self._span[0].held(self._span[1], got)
        return got

    def _close_span(self, error: BaseException | None) -> None:
        assert self._span is not None
        (tracing, opened), self._span = self._span, None
        tracing.close(opened, error)

    async def _take_or_wait(
        self, h: HoldCore, task: asyncio.Task[Any], loop: asyncio.AbstractEventLoop
    ) -> Lease:
        wait, timeout = h.waiting.wait, h.waiting.timeout
        started = clock.now()
        deadline = None if timeout is None else started + timeout
        waiter: AsyncWaiter | None = None
        try:
            while True:
                target = interrupt.for_asyncio_task(task, loop)
                got = await _off_loop(h.try_take, target, abandoned=_release_abandoned)
                if isinstance(got, Lease):
                    self.lease, self._target = got, target
                    return got
                seconds = h.wait_time(got, deadline) if wait else 0.0
                if seconds <= 0:
                    raise h.conflict(got, clock.now() - started if wait else 0.0)
                if waiter is None:  # BLPOP blocks longer than a store call may
                    options = h.settings.options
                    waiter = AsyncWaiter(
                        h.settings.url, options.backend_options, WAIT_CHUNK + options.store_timeout
                    )
                try:
                    await waiter.wait(h.key, seconds)
                except RedisError as exc:
                    raise LeaseStoreUnavailable(h.key, "wait", store.describe(exc)) from None
                except asyncio.CancelledError:
                    # A wake-up it took unread is passed on, once its BLPOP's connection is
                    # closed (else the server could hand that connection the new one too).
                    await waiter.close()  # (closing twice is nothing)
                    await _off_loop(_pass_turn, h)
                    raise
        finally:
            if waiter is not None:
                await waiter.close()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        lease, target = self.lease, self._target
        if lease is None or target is None:
            raise RuntimeError(f"hold {self.name!r} is not held")
        self.lease = self._target = None
        target.finish()  # on the loop's thread: no cancellation for the loss after this
        task = asyncio.current_task()
        ours = target.cancelled
        external = False
        if ours:
            if not isinstance(exc, asyncio.CancelledError):
                # The body ended before our cancellation landed: take it here, not later.
                try:
                    await asyncio.sleep(0)
                except asyncio.CancelledError:
                    pass
            uncancel = getattr(task, "uncancel", None)
            if uncancel is not None:
                external = uncancel() > 0
            else:  # Python 3.10: only the message tells
                external = isinstance(exc, asyncio.CancelledError) and exc.args[:1] != (
                    interrupt.CANCEL_MESSAGE,
                )
        # Cancelled meanwhile: the release is still awaited to its end, then CancelledError.
        ending = await self._end(lease, exc, target)
        if external:
            if isinstance(exc, asyncio.CancelledError):
                return False
            raise asyncio.CancelledError()
        loss = target.error or ending.loss
        if ours and (exc is None or isinstance(exc, asyncio.CancelledError)):
            assert loss is not None
            raise loss from None
        if exc is None and ending.loss is not None:
            raise ending.loss
        return False

    async def _end(
        self, lease: Lease, exc: BaseException | None, target: interrupt.AsyncioTarget
    ) -> Ending:
        """Release ``lease`` (awaited to its end through a cancellation), then end the hold's
        span with what ended the block (``exc``), or the loss."""
        try:
            ending = await _off_loop(lambda: end(lease, sender=lease.task_name))
        except BaseException as error:
            if self._span is not None:
                self._close_span(error)
            raise
        if self._span is not None:
            self._close_span(exc or target.error or ending.loss)
        return ending


def hold_async(name: str, **options: Any) -> AsyncHold:
    """``async with hold_async(name, ...) as lease:``, the asyncio form of
    :func:`celery_lease.hold` (same arguments: ``ttl``, ``url``, ``app``, ``on_conflict``,
    ``timeout``, ``blocking``, ``renew_interval``, ``key_prefix``, ``limit``; a ``timeout`` or
    ``blocking=True`` waits, as :mod:`celery_lease.holds.options` says).

    A loss cancels the task that entered the block and surfaces there as
    :class:`LeaseLost`; any other cancellation stays a ``CancelledError``.

    Raises:
        LeaseConfigError, LeaseKeyError: as :func:`celery_lease.hold` (here, at once).
        LeaseConflict, LeaseStoreUnavailable: on entry.
        LeaseLost: the lease was lost while held.
    """
    return AsyncHold(name, **options)
