"""Debounce at publish (``lease_debounce``): a burst of publishes of one key runs once.

With ``lease_debounce=delay`` (and ``lease_debounce_max=cap``, float seconds), each
``apply_async`` / ``delay`` of a :class:`~celery_lease.LeasedTask` makes one scripted decision
in the lease store (:func:`send`, :func:`celery_lease.store.debounce.trigger`): the first
publish of a key starts a *burst* and publishes its *timer* message (the burst's task id,
``countdown=delay``); every publish moves the burst's due time to ``min(now + delay, first +
cap)`` and keeps its arguments as the latest. Every caller gets the burst's ``AsyncResult``
(``lease_disposition == "debounced"``), whose ``.get()`` returns the result of its one run.

Celery cannot move a message's ETA, so the timer is checked when a worker receives it
(:func:`on_timer`, :func:`celery_lease.store.debounce.fire`): a timer whose burst is gone does
nothing; one that arrives before the due time publishes itself again for the remainder (same
task id) and ends; one at or past it runs, under the normal lease, with the burst's latest
arguments. If the key is still held then (the previous run), the burst waits in the key's line
for the release, as a queued run does, so two runs of a key never overlap.

Crashes: the record lives until the burst's deadline plus a day; the first publish notes the
key for the hand-over sweep (:mod:`celery_lease.ops.sweep`), whose pass publishes the timer again
when a burst is more than one TTL past its due time (:func:`sweep_look`), as does a publish
that joins such a burst: a lost timer costs at most a TTL and a sweep pass. A fire marks the
record fired (a tombstone): a second timer does nothing, the same timer again (redelivered,
or retried after a store error: :data:`AGAIN_HEADER`) fires again. Every timer message has
its own id (:data:`TIMER_HEADER`; the burst's copies share its task id), which the fire keeps:
a copy published again by the sweep, redelivered or retried, is a second timer. A publish
that could not ask the store runs at once (:data:`NOW_HEADER`), firing its own burst if its
trigger landed after all; a timer whose record the store lost runs as published.

Where the idea comes from: lodash's ``debounce`` with ``maxWait`` (a maximum wait), and
BullMQ's debounce mode of deduplication, which has none (docs/howto/shaping/debounce.md).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

from celery.exceptions import Ignore
from celery.utils import uuid
from kombu.utils import json
from redis.exceptions import RedisError

from ... import store
from ...base import process, signals
from ...base.headers import DEBOUNCE_HEADER, HANDOFF_HEADER, REDELIVERY_HEADER
from ...base.keys import burst_key
from ...errors import LeaseStoreUnavailable
from ...settings import publish as publish_settings
from ...settings.config import LeaseOptions
from ...store import debounce as stored
from ...store import handoff as stored_handoff
from ..base import PASS, Arguments, Policy, adopt, mark, sent_key
from . import eager as debounce_eager

__all__ = [
    "AGAIN_HEADER",
    "DEBOUNCE_HEADER",
    "NOW_HEADER",
    "RECORD_MARGIN",
    "TIMER_HEADER",
    "Debounce",
    "enabled",
    "on_timer",
    "passes",
    "send",
    "sweep_look",
]

logger = logging.getLogger("celery_lease")

#: Message header of a publish that could not ask the store, published to run at once: it
#: fires its own burst if its trigger landed all the same (:func:`on_timer`).
NOW_HEADER = "lease_debounce_now"
#: Message header of a timer retried after a store error (its fire's reply may have been
#: lost): it fires again from its own burst's tombstone, as a redelivered timer does.
AGAIN_HEADER = "lease_debounce_again"
#: Message header of a timer message: its own id (a uuid, str), new for each message published
#: (a burst's copies share the task id); only the timer that fired fires again, retried or
#: redelivered (debounce/debounce_fire-1.lua).
TIMER_HEADER = "lease_debounce_timer"
#: Float seconds a burst's record outlives its deadline (first publish plus cap): a day.
RECORD_MARGIN = 24 * 3600.0  # as long as a key's line lives without a look
#: Options of a message that is part of a canvas: folding it would drop that work.
_CANVAS = ("link", "link_error", "chain", "chord", "group_id", "parent_id")
#: Headers of a message published again (a handed-over run, a timer, a redelivery check).
_AGAIN = (DEBOUNCE_HEADER, HANDOFF_HEADER, REDELIVERY_HEADER)


def enabled(task: Any) -> bool:
    """Whether ``task`` (a :class:`~celery_lease.LeasedTask`) has ``lease_debounce``, as a task
    option or the app setting (validated at registration); read without resolving the store,
    so a publisher of other tasks needs no lease settings; the setting is read once per task
    class (:func:`celery_lease.settings.publish.app_setting`)."""
    value = getattr(type(task), "lease_debounce", None)
    return (
        publish_settings.app_setting(task, "lease_debounce") if value is None else value
    ) is not None


def passes(task: Any, options: dict[str, Any]) -> bool:
    """True when a publish with ``options`` is not a new trigger of a burst: a message
    published again (a timer, a handed-over run, a retry under its own task id), or part of a
    canvas. It is published as it is."""
    headers = options.get("headers") or {}
    if any(name in headers for name in _AGAIN) or any(options.get(n) for n in _CANVAS):
        return True
    own = task.request.id
    return bool(own) and options.get("task_id") == own


def _grace_ms(options: LeaseOptions) -> int:
    """How late past its due time a timer may be before the sweep publishes it again: a TTL."""
    return options.ttl_ms


def send(
    task: Any,
    key: str | None,
    args: Any,
    kwargs: Any,
    options: dict[str, Any],
    publish: Callable[..., Any],
) -> Any:
    """Start or join the burst of lease ``key`` with this call's arguments; return the burst's
    ``AsyncResult`` (``lease_disposition`` ``"debounced"``; ``"published"`` when ``key`` is
    None, ``"unguarded"`` when the store could not be asked: published at once).

    Args:
        key: the call's lease key, or None when its arguments give none (published as is:
            the execution fails with the real error).
        options: the ``apply_async`` options; ``countdown`` and ``eta`` are the debounce's.
        publish: Celery's own ``apply_async`` of the call, taking options.

    Raises:
        TypeError: the arguments cannot be kept as JSON (the record holds the latest).
        LeaseStoreUnavailable: the store could not be asked and ``lease_on_store_error`` is
            ``"fail"``.
        Exception: what ``publish`` raises for a new burst's timer (the sweep publishes it
            once the burst is a TTL past due).
    """
    if key is None:
        return mark(publish(**options), "published")
    settings = task.lease_settings()
    lease_options = settings.options
    config = lease_options.debounce
    assert config is not None
    try:
        payload = {"task": task.name, "args": list(args or ()), "kwargs": dict(kwargs or {})}
        arguments = json.dumps(payload)  # type: ignore[no-untyped-call]
    except TypeError as exc:
        raise TypeError(
            f"task {task.name} has lease_debounce, which keeps a burst's latest "
            f"arguments as JSON: {exc}"
        ) from None
    task_id = options.pop("task_id", None) or uuid()
    options.pop("countdown", None)
    options.pop("eta", None)
    publisher = store.holder_json(task.name, task_id, socket.gethostname(), process.pid())
    try:
        client = store.client_for(
            settings.url, lease_options.store_timeout, lease_options.backend_options
        )
        got = stored.trigger(
            client,
            key,
            task_id,
            config.delay_ms,
            config.cap_ms,
            arguments,
            publisher,
            round(RECORD_MARGIN * 1000),
            _grace_ms(lease_options),
            lease_options.min_replicas,
        )
    except RedisError as exc:
        error = LeaseStoreUnavailable(key, "publish", store.describe(exc))
        if lease_options.on_store_error == "fail":
            raise error from None
        logger.warning(
            "task %s[%s] published to run at once, not debounced (the execution lease "
            "still guards it): %s",
            task.name,
            task_id,
            error,
        )
        # Its trigger may have landed all the same (a lost reply): the message then fires
        # that burst; else it runs as published and leaves a tombstone
        # (debounce/debounce_fire-1.lua).
        headers = {**(options.get("headers") or {}), DEBOUNCE_HEADER: key, NOW_HEADER: "1"}
        headers[TIMER_HEADER] = uuid()
        now = publish(**{**options, "task_id": task_id, "headers": headers})
        return _announce(task, key, now, "unguarded")
    if got.foreign:
        logger.warning(
            "task %s[%s] published at once, not debounced: %s holds %s "
            "(`celery lease doctor` says more)",
            task.name,
            task_id,
            burst_key(key),
            got.foreign,
        )
        return _announce(task, key, publish(task_id=task_id, **options), "unguarded")
    eager = bool(task.app.conf.task_always_eager)  # the timer: a thread, not a message
    if not got.started:
        logger.debug(
            "lease debounce: task %s joined burst %s (key=%s, %d publishes, due in %.3fs)",
            task.name,
            got.task_id,
            key,
            got.count,
            got.due_in,
        )
        if got.late and not eager:  # its timer was lost: published again, as the sweep does
            _publish_timer(task.app, task.name, key, got.task_id, args, kwargs)
        joined = (debounce_eager.result_of if eager else _published)(task, got.task_id)
        return _announce(task, key, joined, "debounced")
    if eager:
        return _announce(
            task,
            key,
            debounce_eager.arm(
                task,
                client,
                key,
                task_id,
                got.due_in,
                (list(args or ()), dict(kwargs or {})),
                round(RECORD_MARGIN * 1000),
            ),
            "debounced",
        )
    try:  # first the note, so that a timer lost from here on is published again
        stored_handoff.watch(
            client,
            lease_options.key_prefix,
            key,
            config.cap_ms + _grace_ms(lease_options),
            keep_earlier=True,
        )
    except RedisError as exc:
        logger.warning(
            "lease debounce: burst %s of %s not noted for the sweep (a lost timer "
            "is not published again): %s",
            task_id,
            key,
            store.describe(exc),
        )
    headers = {**(options.get("headers") or {}), DEBOUNCE_HEADER: key, TIMER_HEADER: uuid()}
    timer = publish(
        **{**options, "task_id": task_id, "countdown": config.delay, "headers": headers}
    )
    return _announce(task, key, timer, "debounced")


def _published(task: Any, task_id: str) -> Any:
    return task.AsyncResult(task_id)


def _publish_timer(app: Any, name: str, key: str, task_id: str, args: Any, kwargs: Any) -> bool:
    """Publish the timer of burst ``task_id`` of ``key`` again (its arguments are the
    record's at fire time); True when published. Never raises."""
    try:
        app.signature(
            name,
            args=args,
            kwargs=kwargs,
            task_id=task_id,
            headers={DEBOUNCE_HEADER: key, TIMER_HEADER: uuid()},  # a timer of its own
        ).apply_async()
    except Exception as exc:
        logger.warning(
            "could not publish again the timer of burst %s of %s (%s: %s): the next sweep "
            "look or publish tries again",
            task_id,
            key,
            type(exc).__name__,
            exc,
        )
        return False
    logger.warning("lease %s: the timer of burst %s is late (lost?); published again", key, task_id)
    return True


def _announce(task: Any, key: str, result: Any, disposition: str) -> Any:
    if signals.lease_published.receivers:
        signals.lease_published.send(
            sender=task, key=key, task_id=result.id, disposition=disposition
        )
    return mark(result, disposition)


def on_timer(task: Any, request: Any, args: Any, kwargs: Any) -> tuple[Any, Any]:
    """What a worker does with the timer message ``request`` of a burst (header
    :data:`DEBOUNCE_HEADER`), before the lease is taken.

    Returns:
        The burst's latest ``(args, kwargs)`` to run with (``request`` now carries them, so
        a copy of it parked in the key's line or retried runs them too).

    Raises:
        celery.exceptions.Ignore: nothing to run now: the burst is gone (it ran; this is a
            second timer) or not due (the timer was published again for the remainder).
        LeaseStoreUnavailable, celery.exceptions.Retry: the store could not be asked (as
            ``lease_on_store_error`` says).
    """
    key = str((request.headers or {})[DEBOUNCE_HEADER])
    settings = task.lease_settings()
    options = settings.options
    try:
        client = store.client_for(settings.url, options.store_timeout, options.backend_options)
        headers = request.headers or {}
        now = NOW_HEADER in headers
        again = AGAIN_HEADER in headers or bool((request.delivery_info or {}).get("redelivered"))
        timer = str(headers.get(TIMER_HEADER, ""))
        margin = round(RECORD_MARGIN * 1000)
        decided = stored.fire(
            client, key, request.id, margin, now, again, timer, options.min_replicas
        )
    except RedisError as exc:
        # The fire may have happened with its reply lost: the retried timer fires again.
        request.headers = {**(request.headers or {}), AGAIN_HEADER: "1"}
        task._store_error(options, key, exc)
    if decided.outcome == "missing":  # published at once; or the store lost the record
        if not now:
            logger.warning(
                "debounce timer %s[%s]: the record of its burst is gone (the "
                "store lost it?): run with the arguments it was published with",
                task.name,
                request.id,
            )
        _strip(request)
        return args, kwargs
    if decided.outcome == "stale":
        logger.info(
            "debounce timer %s[%s] not run: its burst already ran (a second timer)",
            task.name,
            request.id,
        )
        raise Ignore()
    if decided.outcome == "early":  # a new message: a timer of its own
        request.headers = {**(request.headers or {}), TIMER_HEADER: uuid()}
        task.signature_from_request(
            request, countdown=decided.due_in, retries=request.retries
        ).apply_async()
        logger.debug(
            "debounce timer %s[%s] early: published again for %.3fs",
            task.name,
            request.id,
            decided.due_in,
        )
        task._event("task-lease-debounced", lease_key=key, lease_due_in=decided.due_in)
        raise Ignore()
    latest_args, latest_kwargs = adopt(request, decided.arguments)
    _strip(request)
    logger.info(
        "debounced: task %s[%s] runs for %d publishes of %s (%.3fs after the first)",
        task.name,
        request.id,
        decided.count,
        key,
        decided.waited,
    )
    task._event(
        "task-lease-debounce-fired",
        lease_key=key,
        lease_triggers=decided.count,
        lease_waited=decided.waited,
    )
    return latest_args, latest_kwargs


def _strip(request: Any) -> None:
    """Take the timer's headers off ``request``: a retry of the run is no timer."""
    headers = request.headers or {}
    timer = (DEBOUNCE_HEADER, NOW_HEADER, AGAIN_HEADER, TIMER_HEADER)
    request.headers = {k: v for k, v in headers.items() if k not in timer}


def sweep_look(app: Any, client: Any, prefix: str, key: str, options: LeaseOptions) -> bool:
    """The crash sweep's look at lease ``key``'s burst: publish its timer again when it is a
    TTL past due, and note the key for the next look. Returns True when it published one.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    found = stored.look(client, key, _grace_ms(options))
    if found.again_in is None:
        return False
    stored_handoff.watch(client, prefix, key, round(found.again_in * 1000), keep_earlier=True)
    if not found.lost:
        return False
    body = json.loads(found.arguments)  # type: ignore[no-untyped-call]
    return _publish_timer(app, body["task"], key, found.lost, body["args"], body["kwargs"])


class Debounce(Policy):
    """``lease_debounce``: a burst of publishes of one key runs once (the module docstring)."""

    name = "lease_debounce"
    order = 50  # its sweep looks after the hand-over's: its note is kept if sooner
    triggers = {"prepare": DEBOUNCE_HEADER, "acquires_apart": DEBOUNCE_HEADER}  # a timer

    def applies(self, options: LeaseOptions, limit: Any) -> bool:
        return options.debounce is not None

    def applies_at_publish(self, task: Any) -> bool:
        return enabled(task)

    def publish(
        self,
        task: Any,
        args: Any,
        kwargs: Any,
        options: dict[str, Any],
        publish: Callable[..., Any],
    ) -> Any:
        if passes(task, options):
            return PASS
        return send(task, sent_key(task, args, kwargs, options), args, kwargs, options, publish)

    def acquires_apart(self, task: Any, headers: Any) -> bool:
        return DEBOUNCE_HEADER in headers  # a timer decides its burst before its acquire

    def sweep(
        self, app: Any, client: Any, prefix: str, key: str, score: int, options: LeaseOptions
    ) -> int:
        return int(sweep_look(app, client, prefix, key, options))

    def prepare(self, task: Any, request: Any, args: Any, kwargs: Any) -> Arguments:
        if DEBOUNCE_HEADER in (request.headers or {}) and not request.is_eager:
            return on_timer(task, request, args, kwargs)  # type: ignore[no-any-return]
        return args, kwargs
