"""RabbitMQ's ``consumer_timeout`` against what a leased task keeps unacknowledged.

RabbitMQ closes a consumer's channel (``PRECONDITION_FAILED``, "delivery acknowledgement timed
out") when a message it delivered stays unacknowledged longer than its ``consumer_timeout``
(1 800 000 ms, 30 minutes, unless ``rabbitmq.conf`` says otherwise); every message unacknowledged
on that channel is delivered again. A Celery worker keeps a message unacknowledged for a whole
run under ``acks_late``, and any message with a countdown or ETA until it is due, whatever
``acks_late`` says. The lease policies publish such countdowns: the wait of a copy that retries
or is deferred (at most the lease's lifetime, ``lease_ttl``), a debounce timer (at most
``lease_debounce_max``), a copy retried until a cooldown is over (``lease_cooldown``).
This is the RabbitMQ counterpart of the check of Redis' ``visibility_timeout``.

How the doctor learns the value: the server's setting cannot be read over AMQP, and the
management HTTP API is an optional plugin with its own port and credentials, so the doctor does
not ask the server. It takes, in this order:

1. the ``x-consumer-timeout`` argument (integer milliseconds) the app declares on the task's
   queue (``task_queues``: ``Queue(..., queue_arguments={"x-consumer-timeout": ...})``), which
   overrides the server's value for that queue from RabbitMQ 3.12 (3.10 ignores it: there the
   server's value applies, and the doctor, which cannot tell the version, trusts the argument);
2. the setting ``lease_rabbitmq_consumer_timeout``: the server's ``consumer_timeout`` as the
   user configured it, in float seconds (``rabbitmq.conf`` states milliseconds: divide by 1000);
3. RabbitMQ's documented default, 1800 seconds.
"""

from __future__ import annotations

from typing import Any

from ...settings.config import LeaseOptions
from ..finding import Finding

__all__ = [
    "DEFAULT_CONSUMER_TIMEOUT",
    "QUEUE_ARGUMENT",
    "SETTING",
    "check_consumer_timeout",
    "consumer_timeout",
]

#: RabbitMQ's default ``consumer_timeout``, float seconds (1 800 000 ms).
DEFAULT_CONSUMER_TIMEOUT = 1800.0
#: The setting that states the server's ``consumer_timeout``, float seconds.
SETTING = "lease_rabbitmq_consumer_timeout"
#: The queue argument that sets the timeout of one queue, integer milliseconds.
QUEUE_ARGUMENT = "x-consumer-timeout"
_SCHEMES = ("amqp://", "amqps://", "pyamqp://", "librabbitmq://")
_UNITS = f"{SETTING} in float seconds, {QUEUE_ARGUMENT} in integer milliseconds"
_FIX = (
    "raise consumer_timeout in rabbitmq.conf (consumer_timeout = <milliseconds>) and state "
    f"it in {SETTING}, or for the task's queue with the {QUEUE_ARGUMENT} queue argument"
)


def consumer_timeout(app: Any, task: Any) -> tuple[float, str] | None:
    """The ``consumer_timeout`` that applies to ``task``'s messages and where it comes from.

    Returns:
        ``(seconds, source)``: float seconds and a text naming the queue argument, the setting
        or the default; None when the broker is not RabbitMQ.

    Raises:
        ValueError: ``lease_rabbitmq_consumer_timeout`` or the queue argument is not a
            positive number (the message names it and the unit).
    """
    broker = str(app.conf.get("broker_url") or "")
    if not broker.startswith(_SCHEMES):
        return None
    argument = _queue_argument(app, task)
    if argument is not None:
        return _positive(argument, f"{QUEUE_ARGUMENT} (milliseconds)") / 1000.0, (
            f"{QUEUE_ARGUMENT} on its queue"
        )
    stated = app.conf.get(SETTING)
    if stated is not None:
        return _positive(stated, f"{SETTING} (float seconds)"), SETTING
    return DEFAULT_CONSUMER_TIMEOUT, f"RabbitMQ's default; state the server's in {SETTING}"


def _positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name} must be a positive number, not {value!r}")
    return float(value)


def _queue_argument(app: Any, task: Any) -> Any:
    """The ``x-consumer-timeout`` of the queue Celery routes ``task`` to, if it declares one."""
    try:
        queue = app.amqp.router.route({}, task.name, (), {})["queue"]
    except Exception:  # a router that needs the call's arguments: no queue to look at
        return None
    return (getattr(queue, "queue_arguments", None) or {}).get(QUEUE_ARGUMENT)


def check_consumer_timeout(app: Any, task: Any, options: LeaseOptions) -> list[Finding]:
    """With a RabbitMQ broker: warn when ``task``'s ``acks_late`` runs or the countdowns its
    lease ``options`` publish can keep a message unacknowledged past ``consumer_timeout``."""
    subject = f"task {task.name}"
    try:
        found = consumer_timeout(app, task)
    except ValueError as exc:
        return [Finding("fail", subject, str(exc), _UNITS)]
    if found is None:
        return []
    timeout, source = found
    stated = f"RabbitMQ's consumer_timeout={timeout:g}s ({source})"
    findings = [
        Finding(
            "warn",
            subject,
            f"{setting}={seconds:g}s reaches {stated}: {what}, held unacknowledged by the "
            "worker until it is due; RabbitMQ then closes the worker's channel",
            f"keep {setting} below {timeout:g}s, or {_FIX}",
        )
        for setting, seconds, what in _countdowns(options)
        if seconds >= timeout
    ]
    hard = task.time_limit or app.conf.get("task_time_limit")
    acks_late = task.acks_late if task.acks_late is not None else app.conf.get("task_acks_late")
    if acks_late and (hard is None or float(hard) >= timeout):
        limit = "no time_limit" if hard is None else f"time_limit={float(hard):g}s"
        findings.append(
            Finding(
                "warn",
                subject,
                f"acks_late is on with {limit}: a run longer than {stated} keeps its message "
                "unacknowledged past it, RabbitMQ closes the worker's channel and delivers "
                "the message again (the lease refuses the copy while the run holds it)",
                f"set time_limit below {timeout:g}s, or {_FIX}",
            )
        )
    return findings


def _countdowns(options: LeaseOptions) -> list[tuple[str, float, str]]:
    """``(setting, float seconds, what)`` of each countdown the task's policies can publish."""
    found = [("lease_ttl", options.ttl, "a deferred or retried copy waits up to the lease's TTL")]
    if options.debounce is not None:
        found.append(
            ("lease_debounce_max", options.debounce.cap, "a debounce timer waits up to the cap")
        )
    if options.cooldown is not None and options.on_conflict == "retry":
        found.append(
            ("lease_cooldown", options.cooldown, "a copy is retried once the cooldown is over")
        )
    return found
