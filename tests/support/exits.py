"""Injecting an exit (a ``BaseException``, as a time limit is) at any point of celery-lease code.

:class:`ExitAt` raises :class:`Exit` at the n-th point, in the calling thread, where CPython
lets an asynchronous exception land in ``celery_lease`` code (``sys.settrace`` with opcode
events; an exception raised by a trace function is raised in the traced frame, and tracing
stops there). A signal handler's exception, ``PyThreadState_SetAsyncExc`` and the like land
only where the interpreter checks for them: at a function's entry, after a call returned and
at a jump back; gevent and eventlet throw at a switch, which is inside a call, so it comes out
of that call. The points are therefore:

- the entry of a ``celery_lease`` function called from ``celery_lease`` code (an entry called
  from outside, a ``with``'s ``__exit__`` or a task's ``__call__``, is the caller's code being
  interrupted: Python gives no way to protect it, see PEP 419);
- the instruction after each call of code outside ``celery_lease`` (after a return from a
  Python function CPython does not check: the points inside ours are counted instead), and
  each jump back.

:func:`every_exit` runs a call once per point it passes, an exit injected at each, so a test
covers them all: between a command's send and the read of its reply, between the grant and
the registration with the heartbeat, inside the release.
"""

from __future__ import annotations

import dis
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType, TracebackType
from typing import Any, TypeVar

import celery_lease

T = TypeVar("T")
PACKAGE = str(Path(celery_lease.__file__).parent)


#: The call instructions of every CPython this runs on: 3.10 has CALL_FUNCTION(_KW) and
#: CALL_METHOD, 3.11 and 3.12 CALL, 3.13 CALL and CALL_KW; CALL_FUNCTION_EX in all.
_CALLS = ("CALL", "CALL_KW", "CALL_FUNCTION", "CALL_FUNCTION_KW", "CALL_METHOD", "CALL_FUNCTION_EX")


def _ours(frame: FrameType) -> bool:
    return frame.f_code.co_filename.startswith(PACKAGE)


@functools.cache
def _landings(code: CodeType) -> frozenset[int]:
    """The offsets in ``code`` where an asynchronous exception can land (see the module doc)."""
    found, after_call = set(), False
    for ins in dis.get_instructions(code):
        # A jump back: JUMP_BACKWARD from 3.11 on, a JUMP_ABSOLUTE to an earlier offset in 3.10.
        backward = ins.opname == "JUMP_BACKWARD" or (
            ins.opname == "JUMP_ABSOLUTE"
            and isinstance(ins.argval, int)
            and ins.argval < ins.offset
        )
        if after_call or backward:
            found.add(ins.offset)
        after_call = ins.opname in _CALLS
    return frozenset(found)


class Exit(BaseException):
    """The injected exit: a ``BaseException`` nothing catches by accident (like
    ``SoftTimeLimitExceeded`` under a broad handler, ``SystemExit``, gevent's ``Timeout``)."""


class ExitAt:
    """``with ExitAt(n):`` raise :class:`Exit` at the ``n``-th line (1-based) this thread runs in
    the ``celery_lease`` package. ``where`` names the line it was raised at (None: not reached).
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.lines = 0
        self.where: str | None = None
        self._returned_to: FrameType | None = None

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not _ours(frame):
            return None
        # The local trace function first: 3.13 turns on opcode events for a frame only once
        # it has one (earlier versions do it either way).
        frame.f_trace = self._opcode
        frame.f_trace_opcodes = True
        if event == "call" and frame.f_back is not None and _ours(frame.f_back):
            self._point(frame, "entry")
        return self._opcode

    def _opcode(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "return":  # back into a caller of ours: no check there (its points were)
            self._returned_to = frame.f_back
        elif event == "opcode":
            returned, self._returned_to = self._returned_to is frame, None
            if not returned and frame.f_lasti in _landings(frame.f_code):
                self._point(frame, "after a call")
        return self._opcode

    def _point(self, frame: FrameType, kind: str) -> None:
        self.lines += 1
        if self.lines == self.n:
            code = frame.f_code
            self.where = f"{Path(code.co_filename).name}:{frame.f_lineno} ({code.co_name} {kind})"
            raise Exit(self.where)

    def __enter__(self) -> ExitAt:
        sys.settrace(self._call)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        sys.settrace(None)


def untraced(call: Callable[[], T]) -> T:
    """``call()`` with no exit injected in it (the preparation of the step under test)."""
    tracer = sys.gettrace()
    sys.settrace(None)
    try:
        return call()
    finally:
        sys.settrace(tracer)


def every_exit(
    run: Callable[[], object],
    check: Callable[[str], None],
    finished: Callable[[object], None],
    limit: int = 5000,
) -> list[str]:
    """Run ``run()`` with an exit injected at its 1st, 2nd, ... line until it runs to its end.

    Args:
        run: the call under test.
        check: called after each injected exit with where it was raised; asserts the state.
        finished: called with what ``run()`` returned once no exit was reached.
        limit: most lines tried (a call that never ends is a failure).

    Returns:
        Where each exit was raised, in order.

    Raises:
        AssertionError: the exit was swallowed, or replaced by another exception.
    """
    places: list[str] = []
    for n in range(1, limit + 1):
        injection = ExitAt(n)
        try:
            with injection:
                returned = run()
        except Exit as exc:
            assert str(exc) == injection.where, f"another exit than the one at {injection.where}"
            places.append(str(exc))
            check(str(exc))
            continue
        assert injection.where is None, f"the exit at {injection.where} was swallowed"
        finished(returned)
        return places
    raise AssertionError(f"{limit} lines and still running")
