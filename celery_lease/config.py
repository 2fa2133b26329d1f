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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .errors import LeaseConfigError
from .keys import DEFAULT_PREFIX
from .store import url as backend_url

__all__ = [
    "BEAT_WHERE",
    "DEFAULTS",
    "MIN_STORE_TIMEOUT",
    "MIN_TTL",
    "TASK_OPTIONS",
    "LeaseOptions",
    "LeaseSettings",
    "beat_options",
    "beat_settings",
    "resolve_backend",
    "resolve_options",
    "resolve_settings",
]

logger = logging.getLogger("celery_lease")

#: Setting name -> default. ``None`` for a derived default.
DEFAULTS: dict[str, Any] = {
    "lease_backend": None,  # Redis URL; falls back to a Redis broker_url
    "lease_backend_options": None,  # dict: TLS, Sentinel, Cluster options (store/url.py)
    "lease_min_replicas": 0,  # int >= 0: replicas that must acknowledge a grant or renewal
    "lease_ttl": 30.0,  # float seconds
    "lease_renew_interval": None,  # float seconds; default lease_ttl / 3
    "lease_store_timeout": None,  # float seconds; default min(interval / 2, 2.0)
    "lease_key_prefix": DEFAULT_PREFIX,
    "lease_on_conflict": "skip",  # skip | retry | fail
    "lease_on_store_error": "retry",  # retry | fail
    "lease_cooldown": None,  # float seconds the key stays taken after a success; None: none
    "lease_cooldown_after": "success",  # success | any (a failure too)
    "lease_preempt_grace": 0.0,  # float seconds a preempted holder may checkpoint
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
    "lease_cooldown",
    "lease_cooldown_after",
    "lease_preempt_grace",
)

#: Settings read elsewhere (the beat leader lease, celery_lease.beat; lease_tasks,
#: celery_lease.lease_tasks) and the task-only option.
OTHER_NAMES = ("lease_key", "lease_tasks", "lease_beat_scheduler", "lease_beat_ttl",
               "lease_beat_renew_interval", "lease_beat_key")

ON_CONFLICT = ("skip", "retry", "fail", "preempt")
ON_STORE_ERROR = ("retry", "fail")
COOLDOWN_AFTER = ("success", "any")
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
        min_replicas: replicas that must acknowledge a grant, and each renewal (int >= 0).
        cooldown: float seconds the key stays taken after an execution ended
            (``lease_cooldown``), or None for no cooldown.
        cooldown_after: which endings start it: ``"success"`` or ``"any"`` (a failure too).
        preempt_grace: float seconds (>= 0) a holder taken over by ``"preempt"`` may use to
            checkpoint before the newcomer's body starts.
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
    cooldown: float | None = None
    cooldown_after: str = "success"
    preempt_grace: float = 0.0

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
#: The shortest store timeout accepted, float seconds: below it a healthy round trip plus a
#: garbage collection or scheduling pause times out (docs/reference/settings.md).
MIN_STORE_TIMEOUT = 0.05
#: The smallest ``lease_ttl`` whose derived store timeout (``lease_ttl / 6``) reaches the floor.
MIN_TTL = round(MIN_STORE_TIMEOUT * 6, 3)


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
    conf: Mapping[str, Any], task_options: Mapping[str, Any], where: str,
    names: Mapping[str, str] | None = None,
) -> LeaseOptions:
    """Merge app settings and task options and validate them.

    Args:
        conf: the app's configuration (``app.conf``), read with ``.get``.
        task_options: per-task values; ``None`` means "not set, use the app setting".
        where: what to name in error messages, e.g. ``"task proj.tasks.sync"``.
        names: the setting name to show in errors for a value taken from ``task_options``
            (beat passes ``{"lease_ttl": "lease_beat_ttl", ...}``).

    Raises:
        LeaseConfigError: a value is invalid; the message names the option and the fix.
    """
    relabel = names or {}

    def label(name: str) -> str:
        return relabel.get(name, name) if task_options.get(name) is not None else name

    def pick(name: str) -> Any:
        value = task_options.get(name)
        if value is None:
            value = conf.get(name)
        return DEFAULTS[name] if value is None else value

    ttl_name, interval_name = label("lease_ttl"), label("lease_renew_interval")
    ttl = _duration(ttl_name, pick("lease_ttl"), where)
    raw_interval = pick("lease_renew_interval")
    interval = ttl / 3 if raw_interval is None else _duration(
        interval_name, raw_interval, where)
    if interval > ttl / 2:
        raise LeaseConfigError(
            f"{interval_name}={interval!r} ({where}) is above half of {ttl_name}={ttl!r}: one "
            f"slow renewal would lose the lease. Use at most {ttl_name} / 3 "
            f"({interval_name}={ttl / 3:.3f}) or leave it unset"
        )
    if interval > ttl / 3 + 1e-9:
        logger.warning(
            "%s=%r (%s) is above a third of %s=%r: two failed renewals "
            "in a row will lose the lease; consider %s=%.3f",
            interval_name, interval, where, ttl_name, ttl, interval_name, ttl / 3,
        )
    raw_timeout = pick("lease_store_timeout")
    timeout = min(interval / 2, 2.0) if raw_timeout is None else _duration(
        "lease_store_timeout", raw_timeout, where)
    if timeout < MIN_STORE_TIMEOUT - 1e-9:
        given = (f"lease_store_timeout={raw_timeout!r} ({where}) is" if raw_timeout is not None
                 else f"{ttl_name}={ttl!r} ({where}) gives a store timeout (min({interval_name} "
                      f"/ 2, 2.0) with {interval_name}={interval:.4g}) of")
        raise LeaseConfigError(
            f"{given} {timeout * 1000:.0f} ms, below the {MIN_STORE_TIMEOUT * 1000:.0f} ms floor: "
            f"a healthy store call (a network round trip plus a GC or scheduling pause) would "
            f"time out and renewals fail. The smallest {ttl_name} that works is {MIN_TTL} (with "
            f"{interval_name} and lease_store_timeout unset)"
        )
    if timeout >= interval:
        raise LeaseConfigError(
            f"lease_store_timeout={timeout!r} ({where}) must be shorter than "
            f"{interval_name}={interval!r}, or a hanging renewal silently becomes no "
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
        backend_url.validate_backend(backend, backend_options, where)
    elif isinstance(broker, str) and broker.startswith(_REDIS_SCHEMES):  # the fallback
        backend_url.validate_backend(broker, backend_options, where, _FALLBACK)
    min_replicas = pick("lease_min_replicas")
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 0:
        raise LeaseConfigError(f"lease_min_replicas={min_replicas!r} ({where}) must be a whole "
                               f"number of replicas >= 0 (0: do not wait for replicas)")
    cooldown, grace = pick("lease_cooldown"), pick("lease_preempt_grace")
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
        cooldown=None if cooldown is None else _duration("lease_cooldown", cooldown, where),
        cooldown_after=_choice("lease_cooldown_after", pick("lease_cooldown_after"),
                               COOLDOWN_AFTER, where),
        preempt_grace=0.0 if grace == 0 else _duration("lease_preempt_grace", grace, where),
    )


class LeaseSettings(NamedTuple):
    """Everything needed to take a lease, resolved and validated once: the one settings object.

    A named tuple, so ``options, url, signum = task.lease_settings()`` keeps working.

    Attributes:
        options: the validated :class:`LeaseOptions` (durations in float seconds).
        url: the Redis URL of the lease store (``lease_backend``, else a Redis ``broker_url``).
        signum: the ``lease_signal`` number.
    """

    options: LeaseOptions
    url: str
    signum: int


def resolve_settings(
    conf: Mapping[str, Any], task_options: Mapping[str, Any], where: str,
    names: Mapping[str, str] | None = None,
) -> LeaseSettings:
    """Resolve options, store URL and signal number in one go (tasks, worker, CLI, beat).

    Args:
        conf: the app's configuration (``app.conf``).
        task_options: per-task (or per-use) overrides; ``None`` values fall back to ``conf``.
        where: what to name in error messages.
        names: see :func:`resolve_options`.

    Raises:
        LeaseConfigError: an invalid value, no Redis URL, or an unusable ``lease_signal``.
    """
    options = resolve_options(conf, task_options, where, names)
    return LeaseSettings(options, resolve_backend(options, conf, where),
                         check_process_settings(conf, where))


#: What errors about the beat leader lease name as the place of the mistake.
BEAT_WHERE = "celery beat leader lease"
_BEAT_NAMES = {"lease_ttl": "lease_beat_ttl", "lease_renew_interval": "lease_beat_renew_interval"}


def beat_options(conf: Mapping[str, Any]) -> LeaseOptions:
    """The beat leader lease's options: ``lease_beat_ttl`` and ``lease_beat_renew_interval``
    (float seconds) over the ``lease_*`` settings, validated by the tasks' rules.

    With ``lease_beat_ttl`` set and no ``lease_beat_renew_interval``, the interval is a third of
    ``lease_beat_ttl`` (not the tasks' ``lease_renew_interval``).

    Raises:
        LeaseConfigError: an invalid value, naming the ``lease_beat_*`` setting at fault.
    """
    ttl = conf.get("lease_beat_ttl")
    interval = conf.get("lease_beat_renew_interval")
    if interval is None and ttl is not None:
        interval = _duration("lease_beat_ttl", ttl, BEAT_WHERE) / 3
    overrides = {"lease_ttl": ttl, "lease_renew_interval": interval}
    return resolve_options(conf, overrides, BEAT_WHERE, _BEAT_NAMES)


def beat_settings(conf: Mapping[str, Any]) -> LeaseSettings:
    """:func:`beat_options` with the store URL and the signal number.

    Raises:
        LeaseConfigError: as :func:`beat_options`; or no Redis URL, or an unusable
            ``lease_signal``.
    """
    options = beat_options(conf)
    return LeaseSettings(options, resolve_backend(options, conf, BEAT_WHERE),
                         check_process_settings(conf, BEAT_WHERE))


def resolve_backend(options: LeaseOptions, conf: Mapping[str, Any], where: str) -> str:
    """The Redis URL leases live in: ``lease_backend``, else a Redis ``broker_url``.

    Raises:
        LeaseConfigError: neither is a Redis URL; the message names ``lease_backend``.
    """
    if options.backend:
        return options.backend
    broker = conf.get("broker_url")
    if isinstance(broker, str) and broker.startswith(_REDIS_SCHEMES):
        backend_url.validate_backend(broker, options.backend_options, where, _FALLBACK)
        return broker
    broker_is = "is not set either" if broker is None else \
        f"{backend_url.safe_url(broker)!r} is not a Redis URL"
    raise LeaseConfigError(
        f"lease_backend is not set ({where}) and broker_url {broker_is}: set "
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
