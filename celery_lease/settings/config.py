"""Lease settings: names, defaults, validation and how per-task options override them.

Every setting is a Celery setting (``app.conf.lease_ttl``) and, except the process-wide ones
(``lease_signal``, ``lease_require_noeviction``), also a task option of the same name
(``@app.task(base=LeasedTask, lease_ttl=10.0)``). Durations are float seconds.

The sizing rules come from the design notes in ``docs/concepts.md``: the renew interval is at
most half the TTL (a third or less is recommended, so two consecutive failed renewals still
leave time to recover), and each store call times out before the next renewal is due
(:mod:`celery_lease.settings.timing`). Every invalid value is reported in one error, as unknown
names are (:mod:`celery_lease.settings.names`), and the fix suggested for the durations passes every
rule.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..base.keys import DEFAULT_PREFIX
from ..errors import LeaseConfigError
from ..store import url as backend_url
from . import debounce as debounce_settings
from . import timing
from .signal_setting import resolve_signal
from .timing import MIN_STORE_TIMEOUT, MIN_TTL

__all__ = [
    "BEAT_WHERE",
    "DEFAULTS",
    "HANDOFF_POLICIES",
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
    "lease_on_conflict": "skip",  # skip | retry | fail | coalesce | queue
    "lease_queue_max": 100,  # int >= 1: waiters in one key's line (lease_on_conflict="queue")
    "lease_queue_timeout": None,  # float seconds a waiter may wait (queue); None: no limit
    "lease_on_store_error": "retry",  # retry | fail
    "lease_store_outage_max": 300.0,  # float seconds a "retry" waits out a store outage
    "lease_dedupe": False,  # bool: at most one waiting copy per key, decided at publish
    "lease_dedupe_ttl": 300.0,  # float seconds a claim lives (a message's expires instead)
    "lease_cooldown": None,  # float seconds the key stays taken after a success; None: none
    "lease_cooldown_after": "success",  # success | any (a failure too)
    "lease_preempt_grace": 0.0,  # float seconds a preempted holder may checkpoint
    "lease_require_noeviction": False,
    "lease_signal": "SIGUSR2",
    **debounce_settings.DEFAULTS,  # lease_debounce, lease_debounce_max: float seconds
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
    "lease_store_outage_max",
    "lease_dedupe",
    "lease_dedupe_ttl",
    "lease_queue_max",
    "lease_queue_timeout",
    "lease_cooldown",
    "lease_cooldown_after",
    "lease_preempt_grace",
    *debounce_settings.DEFAULTS,
)

#: Settings read elsewhere (the beat leader lease, celery_lease.beat.scheduler; lease_tasks,
#: celery_lease.execution.lease_tasks; the doctor's RabbitMQ check) and the task-only options
#: (lease_limit: celery_lease.policies.limit).
OTHER_NAMES = (
    "lease_key",
    "lease_tasks",
    "lease_beat_scheduler",
    "lease_beat_ttl",
    "lease_beat_renew_interval",
    "lease_beat_key",
    "lease_limit",
    "lease_rabbitmq_consumer_timeout",  # float seconds (celery_lease.ops.doctor.consumer_timeout)
)

ON_CONFLICT = ("skip", "retry", "fail", "coalesce", "queue", "preempt")
#: The policies whose release hands the key over to a waiting run (retry waits in line too).
HANDOFF_POLICIES = ("coalesce", "queue", "retry")
ON_STORE_ERROR = ("retry", "fail")
COOLDOWN_AFTER = ("success", "any")
#: The settings that take one of a few words -> those words.
_CHOICES = {
    "lease_on_conflict": ON_CONFLICT,
    "lease_on_store_error": ON_STORE_ERROR,
    "lease_cooldown_after": COOLDOWN_AFTER,
}
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+socket://", "sentinel://")
_FALLBACK = "lease_backend (unset, so broker_url)"


@dataclass(frozen=True)
class LeaseOptions:
    """The effective lease settings of one task, validated.

    Attributes:
        backend: Redis URL of the lease store, or ``None`` until resolved at worker start.
        ttl: lease lifetime, float seconds (> 0).
        renew_interval: float seconds between renewals (<= ttl / 2).
        store_timeout: timeout of each store call, float seconds (< renew_interval).
        key_prefix: prefix of every lease key (no ``{`` or ``}``).
        on_conflict: ``"skip"``, ``"retry"``, ``"fail"``, ``"coalesce"`` or ``"queue"``.
        on_store_error: ``"retry"`` or ``"fail"``.
        backend_options: ``lease_backend_options`` (dict; empty when unset).
        min_replicas: replicas that must acknowledge a grant, and each renewal (int >= 0).
        store_outage_max: float seconds an execution waits out a store outage, its retries not
            counted in ``max_retries``, with ``on_store_error="retry"`` (:mod:`.outage`).
        dedupe: ``lease_dedupe`` (bool): a publish of a key whose copy is waiting publishes
            nothing (:mod:`celery_lease.policies.dedupe`).
        dedupe_ttl: ``lease_dedupe_ttl``, the lifetime of a waiting copy's claim, float
            seconds (> 0), for a message without ``expires``.
        queue_max: the most runs one key's line holds (``lease_queue_max``, int >= 1).
        queue_timeout: float seconds a parked run may wait (``lease_queue_timeout``), or None.
        cooldown: float seconds the key stays taken after an execution ended
            (``lease_cooldown``), or None for no cooldown.
        cooldown_after: which endings start it: ``"success"`` or ``"any"`` (a failure too).
        preempt_grace: float seconds (>= 0) a holder taken over by ``"preempt"`` may use to
            checkpoint before the newcomer's body starts.
        debounce: ``lease_debounce`` and ``lease_debounce_max``
            (:class:`~celery_lease.settings.debounce.Debounce`), or None.
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
    store_outage_max: float = DEFAULTS["lease_store_outage_max"]
    dedupe: bool = False
    dedupe_ttl: float = 300.0
    cooldown: float | None = None
    cooldown_after: str = "success"
    preempt_grace: float = 0.0
    queue_max: int = 100
    queue_timeout: float | None = None
    debounce: debounce_settings.Debounce | None = None

    @property
    def hands_over(self) -> bool:  # True when the release hands the key over (a burst waits)
        return self.on_conflict in HANDOFF_POLICIES or self.debounce is not None

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


_DERIVED = object()  # an interval override meaning "a third of the TTL given", whatever conf says


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


#: One problem of a setting: ``("name=value", why)``, ``why`` the end of the sentence; an empty
#: head when ``why`` is a whole message of its own (a backend error names its setting).
_Problem = tuple[str, str]


def resolve_options(
    conf: Mapping[str, Any],
    task_options: Mapping[str, Any],
    where: str,
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

    # Every invalid value at once (as unknown names are), each timing fix one that passes.
    durations, problems = _durations(pick, label, where)
    prefix = pick("lease_key_prefix")
    problems += _key_prefix_problems(prefix)
    backend, backend_options = pick("lease_backend"), pick("lease_backend_options") or {}
    problems += _backend_problems(backend, backend_options, conf.get("broker_url"), where)
    problems += _value_problems(pick)
    debounce = debounce_settings.resolve(pick, problems)
    if problems:
        raise LeaseConfigError(_refusal(where, problems))
    ttl, interval, timeout = durations.effective
    queue_timeout, cooldown = pick("lease_queue_timeout"), pick("lease_cooldown")
    return LeaseOptions(
        backend=backend,
        ttl=ttl,
        renew_interval=interval,
        store_timeout=timeout,
        key_prefix=prefix,
        on_conflict=pick("lease_on_conflict"),
        on_store_error=pick("lease_on_store_error"),
        backend_options=backend_options,
        min_replicas=pick("lease_min_replicas"),
        store_outage_max=float(pick("lease_store_outage_max")),
        dedupe=pick("lease_dedupe"),
        dedupe_ttl=float(pick("lease_dedupe_ttl")),
        queue_max=pick("lease_queue_max"),
        queue_timeout=None if queue_timeout is None else float(queue_timeout),
        cooldown=None if cooldown is None else float(cooldown),
        cooldown_after=pick("lease_cooldown_after"),
        preempt_grace=float(pick("lease_preempt_grace")),
        debounce=debounce,
    )


def _durations(
    pick: Callable[[str], Any], label: Callable[[str], str], where: str
) -> tuple[timing.Durations, list[_Problem]]:
    """The TTL, renew interval and store timeout (float seconds) the settings give, with their
    problems (:func:`celery_lease.settings.timing.resolve`); logs a warning when they are
    valid but the interval is above a third of the TTL.

    Args:
        pick: the value of a setting, task option first, then ``conf``, then the default.
        label: the name to show for a setting (``lease_beat_ttl`` for beat's own value).
        where: what to name in messages.
    """
    labels = (label("lease_ttl"), label("lease_renew_interval"), "lease_store_timeout")
    raw_interval = pick("lease_renew_interval")
    durations, problems = timing.resolve(
        (
            pick("lease_ttl"),
            None if raw_interval is _DERIVED else raw_interval,
            pick("lease_store_timeout"),
        ),
        labels,
    )
    if not problems:
        _warn_if_above_a_third(durations, labels, where)
    return durations, problems


def _warn_if_above_a_third(
    durations: timing.Durations, labels: tuple[str, str, str], where: str
) -> None:
    """Log a warning when the renew interval (float seconds) is above a third of the TTL: valid
    (at most half), but two failed renewals in a row then lose the lease. The fix suggested is
    a third of the TTL when that passes every rule, else a longer TTL."""
    ttl, interval, _ = durations.effective
    if interval <= ttl / 3 + 1e-9:
        return
    third = durations._replace(interval=timing.round_down(ttl / 3))
    logger.warning(
        "%s=%r (%s) is above a third of %s=%r: two failed renewals in a row will lose the "
        "lease; consider %s",
        labels[1],
        interval,
        where,
        labels[0],
        ttl,
        f"{labels[1]}={third.interval!r}"
        if not timing.check(third, labels)
        else f"a longer {labels[0]}",
    )


def _key_prefix_problems(prefix: Any) -> list[_Problem]:
    """``lease_key_prefix``'s problem, if any: it must be a non-empty string without braces."""
    if isinstance(prefix, str) and prefix and "{" not in prefix and "}" not in prefix:
        return []
    return [
        (
            f"lease_key_prefix={prefix!r}",
            "must be a non-empty string without "
            "'{' or '}' (braces are reserved for the Redis Cluster hash tag)",
        )
    ]


def _backend_problems(
    backend: Any, backend_options: Mapping[str, Any], broker: Any, where: str
) -> list[_Problem]:
    """The problem of ``lease_backend`` (or, unset, of a Redis ``broker_url``, the fallback)
    with ``lease_backend_options``, if any. No URL at all is not one here: that is for
    :func:`resolve_backend`, once the worker knows its broker."""
    try:
        if backend is not None:
            backend_url.validate_backend(backend, backend_options, where)
        elif isinstance(broker, str) and broker.startswith(_REDIS_SCHEMES):  # the fallback
            backend_url.validate_backend(broker, backend_options, where, _FALLBACK)
    except LeaseConfigError as exc:
        return [("", str(exc))]  # names the setting and the fix, credentials masked
    return []


def _value_problems(pick: Callable[[str], Any]) -> list[_Problem]:
    """The problems of the settings checked one by one (counts, durations, choices, bools),
    in the order the refusal lists them; ``pick(name)`` reads a setting.

    An unset duration is not checked: ``lease_queue_timeout`` and ``lease_cooldown`` None,
    ``lease_preempt_grace`` 0 (but False, which equals 0, is refused as a bool)."""
    queue_timeout, cooldown, grace = (
        pick("lease_queue_timeout"),
        pick("lease_cooldown"),
        pick("lease_preempt_grace"),
    )
    found = [
        _count_problem(
            "lease_min_replicas",
            pick("lease_min_replicas"),
            0,
            "must be a whole number of replicas >= 0 (0: do not wait for replicas)",
        ),
        _duration_problem(
            "lease_store_outage_max",
            pick("lease_store_outage_max"),
            f", e.g. lease_store_outage_max={DEFAULTS['lease_store_outage_max']}",
        ),
        *(_choice_problem(name, pick(name), allowed) for name, allowed in _CHOICES.items()),
        _bool_problem("lease_dedupe", pick("lease_dedupe")),
        _duration_problem(
            "lease_dedupe_ttl",
            pick("lease_dedupe_ttl"),
            f", e.g. lease_dedupe_ttl={DEFAULTS['lease_dedupe_ttl']}",
        ),
        _count_problem(
            "lease_queue_max",
            pick("lease_queue_max"),
            1,
            "must be a whole number of waiting runs >= 1, e.g. lease_queue_max=100",
        ),
        None
        if queue_timeout is None
        else _duration_problem("lease_queue_timeout", queue_timeout, ", or None (no wait timeout)"),
        None
        if cooldown is None
        else _duration_problem("lease_cooldown", cooldown, ", e.g. lease_cooldown=60.0"),
        None
        if grace == 0 and not isinstance(grace, bool)
        else _duration_problem("lease_preempt_grace", grace, ", e.g. lease_preempt_grace=60.0"),
    ]
    return [problem for problem in found if problem is not None]


def _count_problem(name: str, value: Any, minimum: int, why: str) -> _Problem | None:
    """``name``'s problem unless ``value`` is an int (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        return (f"{name}={value!r}", why)
    return None


def _duration_problem(name: str, value: Any, suggestion: str) -> _Problem | None:
    """``name``'s problem unless ``value`` is a usable duration (float seconds); the
    ``suggestion`` (such as ``", e.g. lease_cooldown=60.0"``) ends the sentence."""
    problem = timing.duration_problem(value)
    return None if problem is None else (f"{name}={value!r}", f"{problem}{suggestion}")


def _choice_problem(name: str, value: Any, allowed: tuple[str, ...]) -> _Problem | None:
    """``name``'s problem unless ``value`` is one of ``allowed``."""
    if value in allowed:
        return None
    return (f"{name}={value!r}", f"is not one of {', '.join(map(repr, allowed))}")


def _bool_problem(name: str, value: Any) -> _Problem | None:
    """``name``'s problem unless ``value`` is True or False (a string 'false' is refused: it
    would count as true)."""
    if isinstance(value, bool):
        return None
    return (
        f"{name}={value!r}",
        "must be True or False (a bool: the string 'false' would count as true)",
    )


def _refusal(where: str, problems: list[_Problem]) -> str:
    """One line for every problem (``(name=value, why)``; a message of its own when the
    first is empty), as unknown names are reported: all at once."""
    if len(problems) == 1:
        head, why = problems[0]
        return f"{head} ({where}) {why}" if head else why
    return f"{len(problems)} invalid lease settings ({where}): " + "; ".join(
        f"{head} {why}" if head else why for head, why in problems
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
    conf: Mapping[str, Any],
    task_options: Mapping[str, Any],
    where: str,
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
    return LeaseSettings(
        options, resolve_backend(options, conf, where), check_process_settings(conf, where)
    )


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
        interval = _DERIVED  # a third of lease_beat_ttl, not the tasks' lease_renew_interval
    overrides = {"lease_ttl": ttl, "lease_renew_interval": interval}
    return resolve_options(conf, overrides, BEAT_WHERE, _BEAT_NAMES)


def beat_settings(conf: Mapping[str, Any]) -> LeaseSettings:
    """:func:`beat_options` with the store URL and the signal number.

    Raises:
        LeaseConfigError: as :func:`beat_options`; or no Redis URL, or an unusable
            ``lease_signal``.
    """
    options = beat_options(conf)
    return LeaseSettings(
        options,
        resolve_backend(options, conf, BEAT_WHERE),
        check_process_settings(conf, BEAT_WHERE),
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
        backend_url.validate_backend(broker, options.backend_options, where, _FALLBACK)
        return broker
    broker_is = (
        "is not set either"
        if broker is None
        else f"{backend_url.safe_url(broker)!r} is not a Redis URL"
    )
    raise LeaseConfigError(
        f"lease_backend is not set ({where}) and broker_url {broker_is}: set "
        f"app.conf.lease_backend = 'redis://host:6379/1' to say where leases live"
    )
