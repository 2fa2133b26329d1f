"""``celery_lease.hold()``: a lease around any block of code, in or out of a Celery task.

::

    with celery_lease.hold(f"invoice:{invoice_id}", ttl=20.0) as lease:
        ...  # renewed while inside; LeaseLost raised here if lost; lease.fencing_token

The same machinery as a leased task: :func:`celery_lease.core.lifecycle.take` and the release half
of :func:`~celery_lease.core.lifecycle.end`, the process's one heartbeat (every hold and task lease
of a process shares its round trip), :class:`~celery_lease.errors.LeaseLost` delivered to the
thread or greenlet that entered the block (:func:`celery_lease.core.interrupt.for_current_context`),
fencing tokens, signals and metrics.

What the store holds: the key ``<lease_key_prefix>:{hold:<name>}``; as the holder, the task
name and id of the enclosing Celery task, else ``celery_lease.hold`` and the thread's name
(a low-cardinality name: metrics are labelled with it; the key says which resource).

Waiting for a release (``on_conflict="wait"``): :mod:`celery_lease.holds.core`; when a hold
waits (``timeout``, ``blocking``, ``on_conflict`` read together): :mod:`celery_lease.holds.options`;
the decorator on each shape of callable (generators held step by step, async generators
refused): :mod:`celery_lease.holds.shapes`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import wrapt

from ..base import clock
from ..core import interrupt, lifecycle
from ..core.lease import Lease
from ..errors import LeaseLost
from . import core as hold_core
from . import options as hold_options
from . import shapes as hold_shapes
from .aio import AsyncHold
from .core import HOLD_TASK_NAME, HoldCore, end

__all__ = ["HOLD_TASK_NAME", "Hold", "hold"]

F = TypeVar("F", bound=Callable[..., Any])


class Hold(HoldCore):
    """A lease on ``name`` for a block of code; made by :func:`hold` (see it for the options).

    A context manager (``with``), a decorator (each call holds the lease), and a lock-like
    object (:meth:`acquire` / :meth:`release`). One entry at a time per object; the decorator
    makes a fresh object per call, so a decorated function may run in many threads.

    Attributes:
        name: the hold name (str).
        lease: the :class:`~celery_lease.core.lease.Lease` while held, else ``None``.
    """

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take the lease, as :meth:`threading.Lock.acquire` does: ``blocking=True`` or a
        ``timeout`` waits for a release (up to ``timeout`` float seconds), ``blocking=False``
        answers at once, neither does what :func:`hold` was given. Returns False when the lease
        is held elsewhere and not (or no longer) waited for.

        Raises:
            LeaseConfigError: ``blocking=False`` with a ``timeout``, or a bad ``timeout``.
            RuntimeError: this object holds the lease already.
            LeaseStoreUnavailable: the store could not be reached.
        """
        return self._enter(
            hold_options.for_call(self.name, self.waiting, blocking, timeout), raise_conflict=False
        )

    def _enter(self, waiting: hold_options.Waiting, *, raise_conflict: bool) -> bool:
        if self.lease is not None:
            raise RuntimeError(
                f"hold {self.name!r} is held by this object already; use a new "
                f"hold() for a nested block"
            )
        # Filled at the grant: an exit that lands anywhere after it (a time limit,
        # KeyboardInterrupt, SystemExit) ends the lease here instead of leaving it renewed.
        claim = lifecycle.Claim()
        tracing = hold_core.spans
        if tracing is not None:  # a generator's steps run in their caller's context
            self._span = (tracing, tracing.open(self.name, not self._by_steps))
        try:
            took = self._take_or_wait(waiting, raise_conflict, claim)
            self.lease = claim.lease
        except BaseException as exc:
            if claim.lease is not None:
                self.lease = claim.lease
                self._release(exc)
            elif self._span is not None:
                self._close_span(exc)
            raise
        if self._span is not None:
            if self.lease is not None:
                self._span[0].held(self._span[1], self.lease)
            else:
                self._close_span(None)
        return took

    def _take_or_wait(
        self, waiting: hold_options.Waiting, raise_conflict: bool, claim: lifecycle.Claim
    ) -> bool:
        wait, timeout = waiting.wait, waiting.timeout
        started = clock.now()
        deadline = None if timeout is None else started + timeout
        while True:
            got = self.try_take(self._target(), claim)
            if isinstance(got, Lease):
                return True
            seconds = self.wait_time(got, deadline) if wait else 0.0
            if seconds <= 0:
                if raise_conflict:
                    raise self.conflict(got, clock.now() - started if wait else 0.0)
                return False
            self.wait_released(seconds)

    _by_steps = False  # a generator's run: its loss goes to the step running (hold_shapes)

    def _target(self) -> interrupt.Target:
        if self._by_steps:
            return hold_shapes.StepTarget(self.settings.signum)
        return interrupt.for_current_context(self.settings.signum)

    def release(self) -> bool:
        """End the lease: stop renewing it, release it (waking one waiter), announce it.

        Returns True when the release deleted the key (False: it was lost or had expired).

        Raises:
            RuntimeError: the lease is not held by this object.
            LeaseLost: it was lost while held and the loss was not raised in the block.
        """
        try:
            ending = self._release()
        except BaseException:
            if self.lease is not None:  # an exit as the end began: end it, then go on
                self._release()
            raise
        if ending.loss is not None:
            raise ending.loss
        return bool(ending.released)

    def _release(self, error: BaseException | None = None) -> lifecycle.Ending:
        """End the lease; ``error``: what ended the block, for the hold's span."""
        lease = self.lease
        if lease is None:
            raise RuntimeError(f"hold {self.name!r} is not held")
        self.lease = None
        ending: lifecycle.Ending | None = None
        try:
            lease.target.finish()
            ending = end(lease, sender=lease.task_name)
            return ending
        except BaseException as exc:
            error = error or exc
            if not lease.retired:  # the exit landed before the end began: end it, go on
                end(lease, sender=lease.task_name)
            raise
        finally:
            if self._span is not None:
                self._close_span(error or (ending.loss if ending is not None else None))

    _span: tuple[hold_core.HoldSpans, Any] | None = None  # (tracer, its span) while entered

    def _close_span(self, error: BaseException | None) -> None:
        assert self._span is not None
        (tracing, opened), self._span = self._span, None
        tracing.close(opened, error)

    # -- with / decorator ---------------------------------------------------------------------

    def __enter__(self) -> Lease:
        self._enter(self.waiting, raise_conflict=True)
        assert self.lease is not None
        return self.lease

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        try:
            ending = self._release(exc)
        finally:
            if self.lease is not None:  # an exit landed as the end began: end it all the same
                self._release(exc)
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
        """Decorate ``func``: each run holds a fresh hold (signature kept by ``wrapt``).

        Every shape is held for its real run (:mod:`celery_lease.holds.shapes`): a function,
        method, classmethod, staticmethod, ``functools.partial`` or callable object for the
        call; a coroutine function while its coroutine is awaited
        (:func:`celery_lease.hold_async`); a generator function from its first ``next()`` until
        it finishes or is closed.

        Raises:
            TypeError: ``func`` is an async generator function (here); or a call returned a
                coroutine or generator that would run without the lease (at that call).
        """
        hold_shapes.refuse_async_generator(self.name, func)
        body = hold_shapes.body_of(func)
        if inspect.iscoroutinefunction(body):

            @wrapt.decorator
            async def run_async(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
                async with AsyncHold(self.name, settings=self.settings, **self._params):
                    return await wrapped(*args, **kwargs)

            return run_async(func)  # type: ignore[return-value]

        if inspect.isgeneratorfunction(body):

            @wrapt.decorator
            def run_generator(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
                held = self.fresh()
                held._by_steps = True
                with held as lease:  # at the first next(): nothing runs before it
                    assert isinstance(lease.target, hold_shapes.StepTarget)
                    return (
                        yield from hold_shapes.run_steps(
                            lease.target, lambda: wrapped(*args, **kwargs)
                        )
                    )

            return run_generator(func)  # type: ignore[return-value]

        @wrapt.decorator
        def run(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            with self.fresh():
                result = wrapped(*args, **kwargs)
                hold_shapes.refuse_unheld_result(self.name, wrapped, result)
                return result

        return run(func)  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<Hold {self.key} {'held' if self.lease is not None else 'not held'}>"


def hold(  # noqa: PLR0913 - hold()'s documented keyword options
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
) -> Hold:
    """A lease on ``name`` for a block of code: ``with hold(name) as lease:`` or ``@hold(name)``
    (held for the real run of each shape of callable: :meth:`Hold.__call__`).

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
            ``"wait"`` (until released, or ``timeout``; then :class:`LeaseConflict`). Default:
            ``"wait"`` when ``timeout`` or ``blocking=True`` is given, else ``"raise"``.
        timeout: the most float seconds to wait (``None``: no limit); giving one means waiting,
            as for :meth:`threading.Lock.acquire`.
        blocking: True waits (as ``on_conflict="wait"``), False answers at once. The rule for
            the three together, and the combinations refused: :mod:`celery_lease.holds.options`.
        renew_interval: float seconds between renewals (default: ``ttl / 3``).
        key_prefix: overrides ``lease_key_prefix``.
        limit: up to this many holders at once (int >= 1; default 1, the plain lease), each
            in a slot of its own that expires on its own (:mod:`celery_lease.policies.limit`); a
            hold waiting for a slot is woken by a slot's release.

    Entering returns the :class:`~celery_lease.core.lease.Lease` (``fencing_token``, ``check()``).
    A loss raises :class:`LeaseLost` in the thread or greenlet that entered the block (a
    signal on the main thread, an asynchronous exception in another thread, a throw into a
    greenlet); a loss that could not be raised inside is raised when the block ends.

    Raises:
        LeaseConfigError: an invalid ``on_conflict`` or ``timeout``, or a combination of them
            and ``blocking`` in which one would do nothing (here); an invalid setting,
            or no Redis URL from ``url``, ``app`` or the current app (on entry, or at the first
            call of a decorated function, before anything is sent).
        LeaseKeyError: an invalid ``name`` (here); LeaseConfigError for a ``limit`` that is
            not an int >= 1 (here).
        LeaseConflict: (on entry) held elsewhere, and not or no longer waited for.
        LeaseStoreUnavailable: (on entry) the store could not be reached.
        LeaseLost: the lease was lost while held.
    """
    return Hold(
        name,
        ttl=ttl,
        url=url,
        app=app,
        on_conflict=on_conflict,
        timeout=timeout,
        blocking=blocking,
        renew_interval=renew_interval,
        key_prefix=key_prefix,
        limit=limit,
    )
