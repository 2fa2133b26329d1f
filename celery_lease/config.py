"""Lease settings: names, defaults, validation and how per-task options override them.

Every setting is a Celery setting (``app.conf.lease_ttl``) and, except the process-wide ones
(``lease_signal``, ``lease_require_noeviction``), also a task option of the same name
(``@app.task(base=LeasedTask, lease_ttl=10.0)``). Durations are float seconds.

The sizing rules come from the design notes in ``docs/concepts.md``: the renew interval is at
most half the TTL (a third or less is recommended, so two consecutive failed renewals still
leave time to recover), and each store call times out before the next renewal is due.
"""

from __future__ import annotations

import logging
import math
import signal as _signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import connection
from .errors import LeaseConfigError

__all__ = ["DEFAULTS", "TASK_OPTIONS", "LeaseOptions", "resolve_backend", "resolve_options"]

logger = logging.getLogger("celery_lease")

#: Setting name -> default. ``None`` for a derived default.
DEFAULTS: dict[str, Any] = {
    "lease_backend": None,  # Redis URL; falls back to a Redis broker_url
    "lease_backend_options": None,  # dict: TLS, Sentinel and Cluster options (connection.py)
    "lease_min_replicas": 0,  # int >= 0: replicas that must acknowledge a grant (WAIT)
    "lease_ttl": 30.0,  # float seconds
    "lease_renew_interval": None,  # float seconds; default lease_ttl / 3
    "lease_store_timeout": None,  # float seconds; default min(interval / 2, 2.0)
    "lease_key_prefix": "lease",
    "lease_on_conflict": "skip",  # skip | retry | fail
    "lease_on_store_error": "retry",  # retry | fail
    "lease_require_noeviction": False,
    "lease_signal": "SIGUSR2",
}

#: The settings a task may override with a task option of the same name.
TASK_OPTIONS = (
    "lease_backend",
    "lease_backend_options",
    "lease_min_replicas",
    "lease_ttl",
    "lease_renew_interval",
    "lease_store_timeout",
    "lease_key_prefix",
    "lease_on_conflict",
    "lease_on_store_error",
)

#: Settings read elsewhere (the beat leader lease, celery_lease.beat) and the task-only option.
OTHER_NAMES = ("lease_key", "lease_beat_scheduler", "lease_beat_ttl",
               "lease_beat_renew_interval", "lease_beat_key")

ON_CONFLICT = ("skip", "retry", "fail")
ON_STORE_ERROR = ("retry", "fail")
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+socket://", "sentinel://")
_FALLBACK = "lease_backend (unset, so broker_url)"
# Signals that Celery, billiard or the OS already use, or that cannot be caught.
_RESERVED_SIGNALS = {"SIGUSR1", "SIGINT", "SIGTERM", "SIGQUIT", "SIGHUP", "SIGKILL", "SIGSTOP",
                     "SIGCHLD", "SIGALRM", "SIGTTIN", "SIGTTOU", "SIGSEGV", "SIGBUS", "SIGFPE"}


@dataclass(frozen=True)
class LeaseOptions:
    """The effective lease settings of one task, validated.

    Attributes:
        backend: Redis URL of the lease store, or ``None`` until resolved at worker start.
        ttl: lease lifetime, float seconds (> 0).
        renew_interval: float seconds between renewals (<= ttl / 2).
        store_timeout: timeout of each store call, float seconds (< renew_interval).
        key_prefix: prefix of every lease key (no ``{`` or ``}``).
        on_conflict: ``"skip"``, ``"retry"`` or ``"fail"``.
        on_store_error: ``"retry"`` or ``"fail"``.
        backend_options: ``lease_backend_options`` (dict; empty when unset).
        min_replicas: replicas that must acknowledge a grant (int >= 0).
    """

    backend: str | None
    ttl: float
    renew_interval: float
    store_timeout: float
    key_prefix: str
    on_conflict: str
    on_store_error: str
    backend_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    min_replicas: int = 0

    @property
    def ttl_ms(self) -> int:
        """The TTL in whole milliseconds, as sent to Redis (1.9 s is 1900 ms)."""
        return round(self.ttl * 1000)

    @property
    def drift_margin(self) -> float:
        """Float seconds kept off the local deadline for clock drift between client and server.

        1% of the TTL plus 2 ms, the allowance the Redlock description uses.
        """
        return self.ttl * 0.01 + 0.002


_MAX_SECONDS = 366 * 24 * 3600.0  # a lease that long is a configuration mistake


def _duration(name: str, value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LeaseConfigError(
            f"{name}={value!r} ({where}) must be a number of seconds (float), e.g. {name}=30.0"
        )
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds) or seconds <= 0 or seconds > _MAX_SECONDS:
        raise LeaseConfigError(
            f"{name}={value!r} ({where}) must be a finite number of seconds above zero and at "
            f"most a year ({_MAX_SECONDS:.0f})"
        )
    if round(seconds * 1000) < 1:
        raise LeaseConfigError(f"{name}={value!r} ({where}) is below Redis' 1 ms resolution")
    return seconds


def check_names(names: Any, kind: str, where: str) -> None:
    """Refuse unknown ``lease_*`` names (a typo such as ``lease_tll`` would be ignored).

    Raises:
        LeaseConfigError: naming the unknown option and the closest known one.
    """
    import difflib

    known = (*DEFAULTS, *OTHER_NAMES)
    for name in names:
        if isinstance(name, str) and name.startswith("lease_") and name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise LeaseConfigError(f"unknown {kind} {name} ({where}){hint}")


def check_process_settings(conf: Mapping[str, Any], where: str) -> int:
    """Validate the process-wide settings; return the ``lease_signal`` number.

    Raises:
        LeaseConfigError: ``lease_signal`` unusable, or ``lease_require_noeviction`` not a bool.
    """
    require = conf.get("lease_require_noeviction")
    if require is not None and not isinstance(require, bool):
        raise LeaseConfigError(
            f"lease_require_noeviction={require!r} ({where}) must be True or False (a bool: "
            f"the string 'false' would count as true)"
        )
    return resolve_signal(conf.get("lease_signal") or DEFAULTS["lease_signal"])


def _choice(name: str, value: Any, allowed: tuple[str, ...], where: str) -> str:
    if value not in allowed:
        raise LeaseConfigError(
            f"{name}={value!r} ({where}) is not one of {', '.join(map(repr, allowed))}"
        )
    return str(value)


def resolve_options(
    conf: Mapping[str, Any], task_options: Mapping[str, Any], where: str
) -> LeaseOptions:
    """Merge app settings and task options and validate them.

    Args:
        conf: the app's configuration (``app.conf``), read with ``.get``.
        task_options: per-task values; ``None`` means "not set, use the app setting".
        where: what to name in error messages, e.g. ``"task proj.tasks.sync"``.

    Raises:
        LeaseConfigError: a value is invalid; the message names the option and the fix.
    """

    def pick(name: str) -> Any:
        value = task_options.get(name)
        if value is None:
            value = conf.get(name)
        return DEFAULTS[name] if value is None else value

    ttl = _duration("lease_ttl", pick("lease_ttl"), where)
    raw_interval = pick("lease_renew_interval")
    interval = ttl / 3 if raw_interval is None else _duration(
        "lease_renew_interval", raw_interval, where)
    if interval > ttl / 2:
        raise LeaseConfigError(
            f"lease_renew_interval={interval!r} ({where}) is above half of lease_ttl={ttl!r}: one "
            f"slow renewal would lose the lease. Use at most lease_ttl / 3 "
            f"(lease_renew_interval={ttl / 3:.3f}) or leave it unset"
        )
    if interval > ttl / 3 + 1e-9:
        logger.warning(
            "lease_renew_interval=%r (%s) is above a third of lease_ttl=%r: two failed renewals "
            "in a row will lose the lease; consider lease_renew_interval=%.3f",
            interval, where, ttl, ttl / 3,
        )
    raw_timeout = pick("lease_store_timeout")
    timeout = min(interval / 2, 2.0) if raw_timeout is None else _duration(
        "lease_store_timeout", raw_timeout, where)
    if timeout >= interval:
        raise LeaseConfigError(
            f"lease_store_timeout={timeout!r} ({where}) must be shorter than "
            f"lease_renew_interval={interval!r}, or a hanging renewal silently becomes no "
            f"renewal; use at most {interval / 2:.3f}"
        )
    prefix = pick("lease_key_prefix")
    if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
        raise LeaseConfigError(
            f"lease_key_prefix={prefix!r} ({where}) must be a non-empty string without "
            f"'{{' or '}}' (braces are reserved for the Redis Cluster hash tag)"
        )
    backend, backend_options = pick("lease_backend"), pick("lease_backend_options") or {}
    broker = conf.get("broker_url")
    if backend is not None:
        connection.validate_backend(backend, backend_options, where)
    elif isinstance(broker, str) and broker.startswith(_REDIS_SCHEMES):  # the fallback
        connection.validate_backend(broker, backend_options, where, _FALLBACK)
    min_replicas = pick("lease_min_replicas")
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 0:
        raise LeaseConfigError(f"lease_min_replicas={min_replicas!r} ({where}) must be a whole "
                               f"number of replicas >= 0 (0: do not wait for replicas)")
    return LeaseOptions(
        backend=backend,
        ttl=ttl,
        renew_interval=interval,
        store_timeout=timeout,
        key_prefix=prefix,
        on_conflict=_choice("lease_on_conflict", pick("lease_on_conflict"), ON_CONFLICT, where),
        on_store_error=_choice(
            "lease_on_store_error", pick("lease_on_store_error"), ON_STORE_ERROR, where),
        backend_options=backend_options,
        min_replicas=min_replicas,
    )


def resolve_backend(options: LeaseOptions, conf: Mapping[str, Any], where: str) -> str:
    """The Redis URL leases live in: ``lease_backend``, else a Redis ``broker_url``.

    Raises:
        LeaseConfigError: neither is a Redis URL; the message names ``lease_backend``.
    """
    if options.backend:
        return options.backend
    broker = conf.get("broker_url")
    if isinstance(broker, str) and broker.startswith(_REDIS_SCHEMES):
        connection.validate_backend(broker, options.backend_options, where, _FALLBACK)
        return broker
    raise LeaseConfigError(
        f"lease_backend is not set ({where}) and broker_url {connection.safe_url(broker)!r} is "
        f"not a Redis URL: set "
        f"app.conf.lease_backend = 'redis://host:6379/1' to say where leases live"
    )


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


def validate_lease_key(spec: Any, parameters: Callable[[], list[str]], where: str) -> None:
    """Check a ``lease_key`` task option at registration.

    Args:
        spec: ``None``, a sequence of parameter names, or a callable.
        parameters: returns the task's parameter names (called only when needed).

    Raises:
        LeaseConfigError: a string, a non-sequence, or a name the task does not take.
    """
    if spec is None or callable(spec):
        return
    if isinstance(spec, (str, bytes)) or not isinstance(spec, (list, tuple)):
        raise LeaseConfigError(
            f"lease_key={spec!r} ({where}) must be None, a callable, or a list/tuple of "
            f"parameter names, e.g. lease_key=({spec!r},)"
        )
    known = parameters()
    for name in spec:
        if name not in known:
            raise LeaseConfigError(
                f"lease_key names {name!r} ({where}), which is not a parameter of the task; "
                f"its parameters are {known}"
            )
