"""Raising an exception in a thread at the next instruction it runs, with ``sys.monitoring``.

Why: CPython 3.13 runs signal handlers, and raises asynchronous exceptions
(``PyThreadState_SetAsyncExc``), at a loop's backward jump before it jumps, and looks up the
``try`` of an exception raised there at the jump itself, which the compiler leaves outside the
``try`` around the loop (python/cpython#130279). Raised there, :class:`LeaseLost` would leave
the body's frame past its own ``except``, ``finally`` and ``with`` exits. The instruction that
runs next is the jump's target, inside the loop, where the lookup is right.

How: an ``INSTRUCTION`` callback (PEP 669), enabled only on the code objects the thread is
running, only until it fires or is disarmed. The same code running in another thread (or in
another frame, where one frame was named) passes through the callback untouched, a little
slower while a delivery is pending. Python 3.12 and later (:data:`AVAILABLE`); 3.10 and 3.11
have no ``sys.monitoring`` and need none (their lookup is right).
"""

from __future__ import annotations

import opcode
import sys
import threading
from types import CodeType, FrameType
from typing import Any, NamedTuple

__all__ = ["AVAILABLE", "arm", "at_backward_jump", "disarm", "stack_codes"]

_monitoring: Any = getattr(sys, "monitoring", None)
#: True where this module can deliver (Python 3.12+).
AVAILABLE = _monitoring is not None
_JUMP_BACKWARD = opcode.opmap.get("JUMP_BACKWARD")  # 3.11+
_TOOL_NAME = "celery_lease"
_tool: int | None = None


class _Pending(NamedTuple):
    error: BaseException
    codes: frozenset[CodeType]
    frame: FrameType | None  # raise only in this frame; None: in any frame of ``codes``


_pending: dict[int, _Pending] = {}  # thread id -> what to raise there


def at_backward_jump(frame: FrameType) -> bool:
    """True if ``frame`` stands at a loop's backward jump (``JUMP_BACKWARD``)."""
    code = frame.f_code.co_code  # the bytecode as compiled, which f_lasti indexes in bytes
    lasti = frame.f_lasti
    return 0 <= lasti < len(code) and code[lasti] == _JUMP_BACKWARD


def stack_codes(thread_id: int) -> frozenset[CodeType]:
    """The code objects of every frame on thread ``thread_id``'s stack (empty if it is gone)."""
    frame = sys._current_frames().get(thread_id)
    codes = set()
    while frame is not None:
        codes.add(frame.f_code)
        frame = frame.f_back
    return frozenset(codes)


def _claim_tool() -> int | None:
    """Our sys.monitoring tool id: 3 or 4, the two PEP 669 leaves unnamed (0-2 and 5 are for
    debuggers, coverage, profilers, optimizers); None when both are taken."""
    global _tool
    if _tool is None:
        for tool in (3, 4):
            if _monitoring.get_tool(tool) is None:
                _monitoring.use_tool_id(tool, _TOOL_NAME)
                _monitoring.register_callback(tool, _monitoring.events.INSTRUCTION, _on_instruction)
                _tool = tool
                break
    return _tool


def arm(
    thread_id: int, error: BaseException, codes: frozenset[CodeType], frame: FrameType | None = None
) -> bool:
    """Raise ``error`` in thread ``thread_id`` at the next instruction it runs in one of
    ``codes`` (only in ``frame`` if given). Returns False if it cannot (Python before 3.12,
    both free tool ids taken, no code): the caller delivers another way."""
    tool = _claim_tool() if AVAILABLE and codes else None
    if tool is None:
        return False
    _pending[thread_id] = _Pending(error, codes, frame)
    for code in codes:
        _monitoring.set_local_events(tool, code, _monitoring.events.INSTRUCTION)
    return True


def disarm(thread_id: int) -> bool:
    """Drop what is pending for thread ``thread_id``, if anything. Returns True if something
    was pending (it will not be raised now)."""
    pending = _pending.pop(thread_id, None)
    if pending is None:
        return False
    in_use = set().union(*(p.codes for p in _pending.values()))
    for code in pending.codes - in_use:
        _monitoring.set_local_events(_tool, code, 0)
    return True


def _on_instruction(code: CodeType, offset: int) -> None:
    thread_id = threading.get_ident()
    pending = _pending.get(thread_id)
    if (
        pending is None
        or code not in pending.codes
        or (pending.frame is not None and sys._getframe(1) is not pending.frame)
    ):
        if not any(code in p.codes for p in _pending.values()):
            _monitoring.set_local_events(_tool, code, 0)  # left over: stop the callbacks
        return
    disarm(thread_id)
    raise pending.error


def reset_after_fork() -> None:
    """Forget the parent's pending deliveries in a forked child (their threads are gone)."""
    for thread_id in list(_pending):
        disarm(thread_id)
