"""The ``lease_signal`` setting: which signal raises ``LeaseLost`` on the main thread of a
prefork or solo worker's process, and the signals it must not be."""

from __future__ import annotations

import signal as _signal
from typing import Any

from ..errors import LeaseConfigError

__all__ = ["resolve_signal"]

# Signals that Celery, billiard or the OS already use, or that cannot be caught.
_RESERVED_SIGNALS = {
    "SIGUSR1",
    "SIGINT",
    "SIGTERM",
    "SIGQUIT",
    "SIGHUP",
    "SIGKILL",
    "SIGSTOP",
    "SIGCHLD",
    "SIGALRM",
    "SIGTTIN",
    "SIGTTOU",
    "SIGSEGV",
    "SIGBUS",
    "SIGFPE",
}


def resolve_signal(value: Any) -> int:
    """The signal number for ``lease_signal`` (a name such as ``"SIGUSR2"`` or a number).

    Raises:
        LeaseConfigError: unknown, or one Celery/billiard/the OS already uses (e.g. SIGUSR1,
            billiard's soft time limit signal).
    """
    try:
        signum = _signal.Signals[value] if isinstance(value, str) else _signal.Signals(value)
    except (KeyError, ValueError):
        raise LeaseConfigError(
            f"lease_signal={value!r} is not a signal of this platform; use e.g. 'SIGUSR2'"
        ) from None
    if signum.name in _RESERVED_SIGNALS:
        raise LeaseConfigError(
            f"lease_signal={value!r} is already used by Celery, billiard or the OS; use "
            f"'SIGUSR2' or a real-time signal such as {int(_signal.SIGRTMIN) + 2}"
        )
    return int(signum)
