"""Raising :class:`LeaseLost` inside a running task body, the way a soft time limit is raised.

The mechanism is chosen per execution context when the lease is taken, never by pool name
(``app.conf.worker_pool`` does not follow ``-P``):

- a gevent or eventlet greenlet: the exception is thrown into the task greenlet from the hub;
  it cannot reach a greenlet that never yields (a CPU-bound loop starves the heartbeat too);
- the main thread (prefork children, solo): ``pthread_kill`` with ``lease_signal`` (default
  ``SIGUSR2``; billiard owns ``SIGUSR1``); it interrupts ``sleep``, socket reads and lock waits,
  but not C code that holds the GIL; a signal that arrives at a loop's backward jump is raised
  at the next instruction (:mod:`celery_lease.core.next_instruction`, Python 3.12+);
- any other thread (the threads pool): the next instruction the thread runs raises it
  (:mod:`celery_lease.core.next_instruction`; ``PyThreadState_SetAsyncExc`` before Python 3.12);
  it cannot interrupt a blocking call (``sleep``, ``recv``) until that returns;
- an asyncio task (``hold_async``, :func:`for_asyncio_task`): the task is cancelled from its
  loop (``call_soon_threadsafe``); the block's exit turns that cancellation into the loss.

In each case the exception lands at the first point the runtime allows; where it cannot land
(see the table), :meth:`Lease.check <celery_lease.core.lease.Lease.check>` raises it as soon as the
task looks. Every target is disarmed under a lock when the body ends, so an exception can never
fire in Celery's own code after the body returned, or in the next task.

The library's own work for the body (a publish: a retry, a requeue, a ``lease_dedupe`` claim)
runs under :class:`HeldBack`: a loss delivered meanwhile is kept and handed over once the work
is whole. Landing inside, it would leave it half done: Celery's ``Task.retry`` turns it into
``Reject(requeue=False)``, which drops the message (the fault campaign found it).
"""

from __future__ import annotations

import _signal
import ctypes
import signal
import threading
from types import FrameType, TracebackType
from typing import Any, Protocol

from kombu.utils.compat import detect_environment

from ..errors import LeaseLost
from . import next_instruction

__all__ = ["AsyncioTarget", "HeldBack", "Target", "for_asyncio_task", "for_current_context"]


class Target(Protocol):
    """Where a lost lease is delivered: one running execution."""

    mechanism: str

    def deliver(self, error: LeaseLost) -> bool:
        """Raise ``error`` in the execution if it still runs. Returns True if sent."""

    def finish(self) -> None:
        """The body has ended: never deliver after this, and drop anything still pending."""


class _OneExecution:
    """A target bound to one running execution: ``running`` turns False at ``finish()``, after
    which nothing is delivered; ``lock`` orders a delivery against that. While ``held`` (see
    :class:`HeldBack`) a delivery is kept in ``kept`` instead of raised."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = True
        self.held = False
        self.kept: LeaseLost | None = None

    def hold_back(self) -> None:
        """From here on, keep a delivered loss instead of raising it (the execution's own
        thread calls it)."""
        with self.lock:
            self.held = True

    def let_through(self) -> LeaseLost | None:
        """Deliver normally again; returns the loss kept meanwhile (raised by no one)."""
        with self.lock:
            self.held = False
            kept, self.kept = self.kept, None
        return kept


class HeldBack:
    """``with HeldBack(target) as held:`` the block runs whole: a loss delivered to ``target``
    meanwhile is kept, not raised in it, and is ``held.loss`` (a :class:`LeaseLost`, or None)
    afterwards. For the library's own work for a body (a publish), never the body's code. A
    target of no running execution (beat's, a hold's steps) holds nothing back."""

    def __init__(self, target: Any) -> None:
        self.target = target if isinstance(target, _OneExecution) else None
        self.loss: LeaseLost | None = None

    def __enter__(self) -> HeldBack:
        if self.target is not None:
            self.target.hold_back()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.target is not None:
            self.loss = self.target.let_through()


# --- main thread: a signal -------------------------------------------------------------------

_armed: _SignalTarget | None = None  # the execution a sent signal is meant for
_previous: Any = None  # the handler we replaced, chained for stray signals


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _armed
    target = _armed
    # Runs on the main thread, which is the task's thread: `running` cannot change under us.
    if target is not None and target.running and target.error is not None:
        _armed = None
        if target.held:  # the library's own work for the body (HeldBack): keep it
            target.kept = target.error
            return
        # At a backward jump, raising here would skip the frame's own `try` on 3.13.
        if (
            frame is not None
            and next_instruction.at_backward_jump(frame)
            and (
                next_instruction.arm(
                    target.thread_id, target.error, frozenset([frame.f_code]), frame
                )
            )
        ):
            return
        raise target.error
    if callable(_previous):
        _previous(signum, frame)
    # else: a stray or late signal (the body already ended): ignore it, never raise.


def _install(signum: int) -> None:
    global _previous
    # Checked at every execution (the app may have replaced it); _signal's getsignal is
    # signal.getsignal without the conversion to the Handlers enum (a tenth of the cost).
    current = _signal.getsignal(signum)
    if current is not _on_signal:
        _previous = current if current not in (signal.SIG_DFL, signal.SIG_IGN) else None
        signal.signal(signum, _on_signal)


class _SignalTarget(_OneExecution):
    mechanism = "signal"

    def __init__(self, signum: int) -> None:
        super().__init__()
        self.signum = signum
        self.error: LeaseLost | None = None
        self.thread_id = threading.main_thread().ident or 0
        _install(signum)  # we are on the main thread: the only place a handler can be set

    def deliver(self, error: LeaseLost) -> bool:
        global _armed
        with self.lock:
            if not self.running:
                return False
            self.error = error
            _armed = self
            signal.pthread_kill(self.thread_id, self.signum)
            return True

    def hold_back(self) -> None:
        # On the main thread, as the handler: it sees `held` from here on. A loss signalled
        # before, and armed for the next instruction (3.12+) but not raised yet, is kept too.
        self.held = True
        if next_instruction.disarm(self.thread_id) and self.error is not None:
            self.kept = self.error

    def let_through(self) -> LeaseLost | None:
        global _armed
        # Under the lock: a delivery in progress (error set, signal on its way) is over once
        # we hold it; one whose handler has not run yet is taken here, and its handler then
        # finds nothing armed.
        with self.lock:
            self.held = False
            kept, self.kept = self.kept, None
            if _armed is self:
                _armed = None
                kept = kept or self.error
        return kept

    def finish(self) -> None:
        global _armed
        # Not under the lock: the heartbeat holds it while it signals this very thread, and
        # the handler (on this thread) must see `running` False from here on.
        self.running = False
        if _armed is self:
            _armed = None
        next_instruction.disarm(self.thread_id)


# --- another thread: its next instruction (3.12+), or an asynchronous exception --------------


def _set_async_exc(thread_id: int, exc_type: type[BaseException] | None) -> int:
    """Schedule ``exc_type`` in thread ``thread_id`` (``None`` clears a pending one)."""
    exc = ctypes.py_object(exc_type) if exc_type is not None else None  # None is NULL
    return int(ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), exc))


class _ThreadTarget(_OneExecution):
    mechanism = "next-instruction" if next_instruction.AVAILABLE else "async-exception"

    def __init__(self) -> None:
        super().__init__()
        self.thread_id = threading.get_ident()
        self.sent = False  # an asynchronous exception is set and has not been raised yet
        self.error: LeaseLost | None = None

    def deliver(self, error: LeaseLost) -> bool:
        with self.lock:
            if not self.running:
                return False
            if self.held:
                self.kept = self.kept or error
                return True
            self.error = error
            # 3.12+: at the thread's next instruction, wherever it stands (an asynchronous
            # exception can land at a backward jump, past the frame's own `try`, on 3.13).
            if next_instruction.arm(
                self.thread_id, error, next_instruction.stack_codes(self.thread_id)
            ):
                return True
            self.sent = True  # before: the thread may raise it (and clear this) at once
            if _set_async_exc(self.thread_id, _carrier(error, self._raised)) > 1:  # undo
                _set_async_exc(self.thread_id, None)
                self.sent = False
                return False
            return True

    def _raised(self) -> None:
        self.sent = False  # the carrier was instantiated: it fired, nothing is pending

    def hold_back(self) -> None:
        with self.lock:
            # Running this, the thread has not raised a pending exception (or it caught it,
            # which instantiated the carrier): take it back, keep the loss.
            if self.sent:
                _set_async_exc(self.thread_id, None)
                self.sent = False
                self.kept = self.error
            if next_instruction.disarm(self.thread_id):
                self.kept = self.error
            self.held = True

    def finish(self) -> None:
        with self.lock:
            self.running = False
            next_instruction.disarm(self.thread_id)
            if self.sent:  # clear it if it has not fired yet
                _set_async_exc(self.thread_id, None)


def _carrier(error: LeaseLost, raised: Any = None) -> type[LeaseLost]:
    """CPython instantiates an asynchronous exception from its class with no arguments, so the
    details travel in a throwaway subclass whose constructor fills them in (and calls
    ``raised()``: the exception has fired)."""
    args = error.args

    def init(self: LeaseLost, *_: Any) -> None:
        LeaseLost.__init__(self, *args)
        if raised is not None:
            raised()

    return type("LeaseLost", (LeaseLost,), {"__init__": init, "__module__": LeaseLost.__module__})


# --- gevent / eventlet: throw into the greenlet ----------------------------------------------


class _GeventTarget(_OneExecution):
    mechanism = "greenlet"

    def __init__(self) -> None:
        super().__init__()
        import gevent

        self.glet = gevent.getcurrent()
        self.hub = gevent.get_hub()
        self.sent: LeaseLost | None = None  # scheduled in the hub, not thrown yet

    def deliver(self, error: LeaseLost) -> bool:
        if not self.running:
            return False
        self.sent = error

        def throw() -> None:
            # Runs in the hub: nothing else runs between this check and the throw.
            if self.sent is not error:  # taken by let_through() meanwhile
                return
            self.sent = None
            if self.held:
                self.kept = self.kept or error
            elif self.running and not self.glet.dead:
                self.glet.throw(error)

        self.hub.loop.run_callback_threadsafe(throw)
        return True

    def let_through(self) -> LeaseLost | None:
        kept = super().let_through()
        sent, self.sent = self.sent, None  # its throw() will find nothing
        return kept or sent

    def finish(self) -> None:
        self.running = False


class _EventletTarget(_OneExecution):
    mechanism = "greenlet"

    def __init__(self) -> None:
        super().__init__()
        from eventlet import greenthread

        self.gt = greenthread.getcurrent()

    def deliver(self, error: LeaseLost) -> bool:
        from eventlet import greenthread

        # Called from the heartbeat greenthread: no switch between the check and the kill.
        if not self.running or self.gt.dead:
            return False
        if self.held:
            self.kept = self.kept or error
            return True
        greenthread.kill(self.gt, error)
        return True

    def finish(self) -> None:
        self.running = False


# --- asyncio: cancel the task from its loop ---------------------------------------------------

#: The message of the cancellation that delivers a loss (``CancelledError.args``).
CANCEL_MESSAGE = "celery_lease: lease lost"


class AsyncioTarget(_OneExecution):
    """Delivers a loss to an asyncio task by cancelling it from its own loop.

    Attributes:
        cancelled: True once the task was cancelled for the loss (``task.cancel()`` ran).
        error: the loss delivered, if any.
    """

    mechanism = "asyncio-cancel"

    def __init__(self, task: Any, loop: Any) -> None:
        super().__init__()
        self.task = task
        self.loop = loop
        self.cancelled = False
        self.error: LeaseLost | None = None

    def _cancel(self, error: LeaseLost) -> None:
        # On the loop's thread, like finish(): nothing else runs between the check and cancel.
        if self.held:
            self.kept = self.kept or error
        elif self.running and not self.task.done() and not self.cancelled:
            self.error = error
            self.cancelled = bool(self.task.cancel(CANCEL_MESSAGE))

    def deliver(self, error: LeaseLost) -> bool:
        if not self.running:
            return False
        try:
            self.loop.call_soon_threadsafe(self._cancel, error)
        except RuntimeError:  # the loop is closed: nothing left to interrupt
            return False
        return True

    def finish(self) -> None:
        self.running = False


def for_asyncio_task(task: Any, loop: Any) -> AsyncioTarget:
    """The delivery target for asyncio ``task`` running on ``loop`` (call it on that loop)."""
    return AsyncioTarget(task, loop)


def for_current_context(signum: int) -> Target:
    """The delivery target for the execution running in the calling thread or greenlet.

    Args:
        signum: the ``lease_signal`` number used on the main thread.
    """
    env = detect_environment()  # type: ignore[no-untyped-call]
    if env == "gevent":
        return _GeventTarget()
    if env == "eventlet":
        return _EventletTarget()
    if threading.current_thread() is threading.main_thread():
        return _SignalTarget(signum)
    return _ThreadTarget()


def reset_after_fork() -> None:
    """Forget the parent's armed target in a forked child."""
    global _armed
    _armed = None
    next_instruction.reset_after_fork()
