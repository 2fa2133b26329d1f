"""Raising :class:`LeaseLost` inside a running task body, the way a soft time limit is raised.

The mechanism is chosen per execution context when the lease is taken, never by pool name
(``app.conf.worker_pool`` does not follow ``-P``):

- a gevent or eventlet greenlet: the exception is thrown into the task greenlet from the hub;
  it cannot reach a greenlet that never yields (a CPU-bound loop starves the heartbeat too);
- the main thread (prefork children, solo): ``pthread_kill`` with ``lease_signal`` (default
  ``SIGUSR2``; billiard owns ``SIGUSR1``); it interrupts ``sleep``, socket reads and lock waits,
  but not C code that holds the GIL; a signal that arrives at a loop's backward jump is raised
  one instruction later (see :func:`_raise_after_jump`);
- any other thread (the threads pool): ``PyThreadState_SetAsyncExc``; it lands at the next
  bytecode, so it cannot interrupt a blocking call (``sleep``, ``recv``) until that returns;
- an asyncio task (``hold_async``, :func:`for_asyncio_task`): the task is cancelled from its
  loop (``call_soon_threadsafe``); the block's exit turns that cancellation into the loss.

In each case the exception lands at the first point the runtime allows; where it cannot land
(see the table), :meth:`Lease.check <celery_lease.lease.Lease.check>` raises it as soon as the
task looks. Every target is disarmed under a lock when the body ends, so an exception can never
fire in Celery's own code after the body returned, or in the next task.
"""

from __future__ import annotations

import _signal
import ctypes
import opcode
import signal
import sys
import threading
from types import CodeType, FrameType
from typing import Any, Protocol

from kombu.utils.compat import detect_environment

from .errors import LeaseLost

__all__ = ["AsyncioTarget", "Target", "for_asyncio_task", "for_current_context"]


class Target(Protocol):
    """Where a lost lease is delivered: one running execution."""

    mechanism: str

    def deliver(self, error: LeaseLost) -> bool:
        """Raise ``error`` in the execution if it still runs. Returns True if sent."""

    def finish(self) -> None:
        """The body has ended: never deliver after this, and drop anything still pending."""


class _OneExecution:
    """A target bound to one running execution: ``running`` turns False at ``finish()``, after
    which nothing is delivered; ``lock`` orders a delivery against that."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = True


# --- main thread: a signal -------------------------------------------------------------------

_armed: _SignalTarget | None = None  # the execution a sent signal is meant for
_previous: Any = None  # the handler we replaced, chained for stray signals


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _armed
    target = _armed
    # Runs on the main thread, which is the task's thread: `running` cannot change under us.
    if target is not None and target.running and target.error is not None:
        _armed = None
        if frame is not None and _raise_after_jump(frame, target.error):
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

    def finish(self) -> None:
        global _armed
        # Not under the lock: the heartbeat holds it while it signals this very thread, and
        # the handler (on this thread) must see `running` False from here on.
        self.running = False
        if _armed is self:
            _armed = None
        if _after_jump is not None and _after_jump[2] is self.error:
            _drop_after_jump()


# --- a backward jump: raise at the instruction it jumps to -----------------------------------
# CPython 3.13 runs signal handlers at a loop's backward jump before it jumps, and looks up the
# `try` of an exception raised there at the jump itself, which the compiler leaves outside the
# `try` around the loop (python/cpython#130279): raised there, LeaseLost would leave the frame
# past its own `except`, `finally` and `with` exits. The next instruction, the jump's target,
# is inside the loop: the handler raises it there instead, from a sys.monitoring (PEP 669)
# INSTRUCTION callback enabled on that code object only until it fires. Python 3.12, which
# looks the `try` up at the target, gets the same treatment (the same place, one path);
# 3.10 and 3.11 have no sys.monitoring and raise right away, which is correct there.

_monitoring: Any = getattr(sys, "monitoring", None)  # Python 3.12+
_JUMP_BACKWARD = opcode.opmap.get("JUMP_BACKWARD")  # 3.11+; 3.10 has no such instruction
_TOOL_NAME = "celery_lease"
_tool: int | None = None
#: (frame, code, error): the loss to raise at ``frame``'s next instruction.
_after_jump: tuple[FrameType, CodeType, LeaseLost] | None = None


def _claim_tool() -> int | None:
    """A sys.monitoring tool id for the callback (3 or 4: the others are named for debuggers,
    coverage, profilers and optimizers); None when both are taken."""
    global _tool
    if _tool is None:
        for tool in (3, 4):
            if _monitoring.get_tool(tool) is None:
                _monitoring.use_tool_id(tool, _TOOL_NAME)
                _monitoring.register_callback(
                    tool, _monitoring.events.INSTRUCTION, _on_instruction)
                _tool = tool
                break
    return _tool


def _raise_after_jump(frame: FrameType, error: LeaseLost) -> bool:
    """If ``frame`` stands at a backward jump, arrange for ``error`` to be raised at its next
    instruction and return True; otherwise return False (the caller raises it now)."""
    global _after_jump
    code = frame.f_code
    lasti = frame.f_lasti  # a byte offset into co_code, the bytecode as compiled
    if (_monitoring is None or not 0 <= lasti < len(code.co_code)
            or code.co_code[lasti] != _JUMP_BACKWARD):
        return False
    tool = _claim_tool()
    if tool is None:
        return False
    _after_jump = (frame, code, error)
    _monitoring.set_local_events(tool, code, _monitoring.events.INSTRUCTION)
    return True


def _on_instruction(code: CodeType, offset: int) -> None:
    pending = _after_jump
    if pending is None:
        _monitoring.set_local_events(_tool, code, 0)
        return
    if sys._getframe(1) is not pending[0]:
        return  # the same code running in another frame (recursion, another thread)
    _drop_after_jump()
    raise pending[2]


def _drop_after_jump() -> None:
    global _after_jump
    if _after_jump is not None:
        _monitoring.set_local_events(_tool, _after_jump[1], 0)
        _after_jump = None


# --- another thread: an asynchronous exception -----------------------------------------------

def _set_async_exc(thread_id: int, exc_type: type[BaseException] | None) -> int:
    """Schedule ``exc_type`` in thread ``thread_id`` (``None`` clears a pending one)."""
    exc = ctypes.py_object(exc_type) if exc_type is not None else None  # None is NULL
    return int(ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), exc))


class _ThreadTarget(_OneExecution):
    mechanism = "async-exception"

    def __init__(self) -> None:
        super().__init__()
        self.thread_id = threading.get_ident()
        self.sent = False

    def deliver(self, error: LeaseLost) -> bool:
        # CPython instantiates an asynchronous exception from its class with no arguments, so
        # the details travel in a throwaway subclass whose constructor fills them in.
        args = error.args
        carrier = type("LeaseLost", (LeaseLost,), {
            "__init__": lambda self, *_: LeaseLost.__init__(self, *args),
            "__module__": LeaseLost.__module__,
        })
        with self.lock:
            if not self.running:
                return False
            if _set_async_exc(self.thread_id, carrier) > 1:  # cannot happen; undo if it does
                _set_async_exc(self.thread_id, None)
                return False
            self.sent = True
            return True

    def finish(self) -> None:
        with self.lock:
            self.running = False
            if self.sent:  # clear it if it has not fired yet
                _set_async_exc(self.thread_id, None)


# --- gevent / eventlet: throw into the greenlet ----------------------------------------------

class _GeventTarget(_OneExecution):
    mechanism = "greenlet"

    def __init__(self) -> None:
        super().__init__()
        import gevent

        self.glet = gevent.getcurrent()
        self.hub = gevent.get_hub()

    def deliver(self, error: LeaseLost) -> bool:
        if not self.running:
            return False

        def throw() -> None:
            # Runs in the hub: nothing else runs between this check and the throw.
            if self.running and not self.glet.dead:
                self.glet.throw(error)

        self.hub.loop.run_callback_threadsafe(throw)
        return True

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
        if self.running and not self.task.done() and not self.cancelled:
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
    global _armed, _after_jump
    _armed = None
    _after_jump = None
