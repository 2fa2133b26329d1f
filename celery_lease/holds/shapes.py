"""Which callables ``@celery_lease.hold(...)`` can hold for their real run, and how.

The lease must cover the code that runs, not the call that makes an object to run later:

- a function, method, ``classmethod``, ``staticmethod``, ``functools.partial`` or callable
  object: held for the call;
- a coroutine function (also a partial of one, or an object whose ``__call__`` is one): the
  call returns a coroutine that holds the lease, with :func:`celery_lease.hold_async`, while it
  is awaited;
- a generator function: the call returns a generator that takes the lease at its first
  ``next()`` and holds it until the body finishes, raises, or the generator is closed
  (``close()``, or its collection). Between two steps the consumer's code runs, not the
  body's: a loss found then is kept and raised inside the body at its next step
  (:class:`StepTarget`), never in the consumer's code;
- an async generator function: refused (:class:`TypeError` at decoration). A loss cancels the
  task that runs a step, which between two steps is the consumer, and an abandoned async
  generator is closed by a task of the event loop's own: neither lands in the body. Hold the
  lease inside the body (``async with hold_async(...)``), around the steps that need it.

A callable of another shape whose call returns a coroutine, a generator or an async generator
(a plain function wrapping one) is caught when it returns: the object is closed unrun, the
lease released, and :class:`TypeError` raised, naming the fix.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Generator
from typing import Any

from ..core import interrupt
from ..errors import LeaseLost

__all__ = ["StepTarget", "body_of", "refuse_async_generator", "refuse_unheld_result", "run_steps"]


def body_of(func: Any) -> Any:
    """The function whose code a call of ``func`` runs, for telling shapes apart."""
    if isinstance(func, (classmethod, staticmethod)):
        return body_of(func.__func__)
    if isinstance(func, functools.partial):
        return body_of(func.func)
    if not inspect.isroutine(func) and not inspect.isclass(func) and callable(func):
        return body_of(type(func).__call__)  # a callable object: its __call__
    return func


def refuse_async_generator(name: str, func: Any) -> None:
    """Raise :class:`TypeError` if ``func`` is an async generator function (see the module
    docstring for why)."""
    if inspect.isasyncgenfunction(body_of(func)):
        raise TypeError(
            f"hold({name!r}) cannot decorate the async generator function "
            f"{getattr(func, '__qualname__', func)!r}: its body runs at each step after the "
            f"call returned, and a loss could not be raised in it. Fix: hold the lease inside "
            f"the body, around the steps that need it: async with "
            f"celery_lease.hold_async({name!r}): ..."
        )


def refuse_unheld_result(name: str, func: Any, result: Any) -> None:
    """Raise :class:`TypeError` (after closing ``result`` unrun) if the held call returned a
    coroutine, generator or async generator: its body would run after the lease ended."""
    if not (
        inspect.iscoroutine(result) or inspect.isgenerator(result) or inspect.isasyncgen(result)
    ):
        return
    close = getattr(result, "close", None)
    if close is not None and not inspect.isasyncgen(result):
        close()  # never run: no "coroutine was never awaited" warning either
    raise TypeError(
        f"hold({name!r}): {getattr(func, '__qualname__', func)!r} returned a "
        f"{type(result).__name__} whose body would run after the call, without the lease "
        f"(it was not started). Fix: decorate the coroutine or generator function itself, or "
        f"hold the lease inside its body"
    )


class StepTarget:
    """Where a generator's loss goes: the execution running its current step (a target from
    :func:`celery_lease.core.interrupt.for_current_context` per step, so a step may run in another
    thread than the first), or, while it is suspended, kept for its next step
    (:attr:`pending`).

    Args:
        signum: the ``lease_signal`` number used on the main thread.
    """

    mechanism = "generator-step"

    def __init__(self, signum: int) -> None:
        self._signum = signum
        self._lock = threading.Lock()
        self._step: interrupt.Target | None = None
        self._running = True
        self.pending: LeaseLost | None = None

    def begin_step(self) -> LeaseLost | None:
        """A step starts in the calling thread; returns a loss kept since the last one."""
        with self._lock:
            self._step = interrupt.for_current_context(self._signum)
            pending, self.pending = self.pending, None
        return pending

    def end_step(self) -> None:
        """The step returned (the generator is suspended): keep any loss for the next."""
        with self._lock:
            step, self._step = self._step, None
        if step is not None:
            step.finish()

    def deliver(self, error: LeaseLost) -> bool:
        """Raise ``error`` in the running step, or keep it for the next one."""
        with self._lock:
            if not self._running:
                return False
            if self._step is not None:
                return self._step.deliver(error)
            self.pending = error
            return True

    def finish(self) -> None:
        """The body ended: deliver nothing after this."""
        with self._lock:
            self._running = False
            step, self._step = self._step, None
        if step is not None:
            step.finish()


def run_steps(
    gate: StepTarget, make: Callable[[], Generator[Any, Any, Any]]
) -> Generator[Any, Any, Any]:
    """Run the generator ``make()`` step by step under ``gate``: each ``next()``, ``send()``
    and ``throw()`` of the caller is one step; a kept loss is thrown in at the next step.
    Closing this generator closes the inner one (its ``finally`` blocks run)."""
    gen = make()
    sent: Any = None
    thrown: BaseException | None = None
    try:
        while True:
            pending = gate.begin_step()
            try:
                thrown = pending if pending is not None else thrown
                item = gen.throw(thrown) if thrown is not None else gen.send(sent)
            except StopIteration as stop:
                return stop.value
            finally:
                gate.end_step()
            sent, thrown = None, None
            try:
                sent = yield item
            except GeneratorExit:
                raise
            except BaseException as exc:  # the caller's throw(): into the body
                thrown = exc
    finally:
        gen.close()
