"""This process's id, without a system call each time it is asked.

``os.getpid()`` is a system call on every call (glibc stopped caching the id), and a leased
execution asks about six times: its holder record, its ``Lease``, the settings cache, and
whether a lease belongs to this process or to the parent it was forked from. The id is read
once at import, and again in every forked child by a fork hook, which runs inside
``os.fork()``: the child's code after the fork sees its own id. No other fork hook of the
package asks for it, so the order the hooks run in does not matter.
"""

from __future__ import annotations

import os

__all__ = ["pid"]

_pid = os.getpid()


def pid() -> int:
    """This process's id (int), as ``os.getpid()`` returns it."""
    return _pid


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):  # no fork hooks: no fork either (Windows)
    os.register_at_fork(after_in_child=_after_fork_in_child)
