"""Deduplication at publish (``lease_dedupe``): at most one waiting copy per lease key.

With ``lease_dedupe=True``, ``apply_async`` / ``delay`` of a :class:`~celery_lease.LeasedTask`
(and so beat's sends and canvas signatures of the task) makes one scripted decision in the
lease store before publishing (:func:`send`, :func:`celery_lease.store.claim`): the first
publish of a key claims the key's *waiting slot* for its task id and is published; a publish
while that copy waits (published, not started) publishes nothing and returns an ``AsyncResult``
for the waiting copy's task id, whose ``.get()`` returns the result of the execution that serves
this request too. The execution's acquire clears the claim when the lease is granted
(``lease/acquire-4.lua``, same round trip), so once the waiting copy runs the next publish is queued
again: at most one running and one waiting per key. The idea is sidekiq-unique-jobs'
``until_and_while_executing`` and BullMQ's deduplication, kept to the lease's invariants
(docs/howto/shaping/dedupe.md).

Every result a leased task's ``apply_async`` returns carries ``lease_disposition``:
``"published"``, ``"deduplicated"`` or ``"unguarded"`` (the store could not be asked: published
without a claim, the execution lease still guards; with ``lease_on_store_error="fail"``
:class:`~celery_lease.errors.LeaseStoreUnavailable` is raised instead).

With ``lease_min_replicas`` above 0 the decision waits for that many replicas, as a grant
does (``WAIT`` in the same round trip, :func:`celery_lease.store.claim`): a claim or a fold
fewer acknowledged in time does not count. The claim is taken back and the message is
published without a claim (``"unguarded"``, a warning logged, whatever
``lease_on_store_error`` says): a fold that a failover may undo could lose the request, a
publish too many costs one more execution, which the lease still keeps to one at a time.

A claim never outlives its message for long: it is written with a provisional lifetime (at
most ``lease_ttl``) and given its full one (the message's ``expires``, else its countdown plus
``lease_dedupe_ttl``) once the message is published (:func:`celery_lease.store.confirm_claim`,
one round trip more per claiming publish), so the claim of a publisher killed before its
publish lapses within ``lease_ttl``. It is removed when its publish fails, when a worker
drops its message as revoked or expired (``task_revoked``), and when its execution ends on a
conflict without a copy sent on (:func:`forget`). Always published, never folded, and claiming
the slot for themselves: a message published again under its own task id (a retry, a copy a
conflict policy sends on) and one the lease's holder publishes for its own key (a
self-requeue, which runs after the holder). Published without a claim: a message that is part
of a canvas (a chain's task, a group or chord member, ``link=``), which folding would drop.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from celery.signals import task_revoked
from celery.utils import uuid
from celery.utils.time import maybe_make_aware
from dateutil.parser import isoparse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import store
from ..base import process, signals
from ..base.headers import CLAIM_HEADER
from ..base.keys import claim_key
from ..core import lifecycle
from ..errors import LeaseStoreUnavailable
from ..settings import publish as publish_settings
from .base import DISPOSITIONS, Policy, mark

__all__ = [
    "CLAIM_HEADER",
    "DISPOSITIONS",
    "Dedupe",
    "claim_lifetime",
    "enabled",
    "forget",
    "mark",
    "send",
]

logger = logging.getLogger("celery_lease")

#: Options of a message that is part of a canvas (linked work, a group or chord member, a
#: chain's next task published by its parent, whose frozen task id a caller already holds):
#: folding it would drop that work or strand that id.
_CANVAS = ("link", "link_error", "chain", "chord", "group_id", "parent_id")


def claim_lifetime(options: Mapping[str, Any], default_expires: Any, ttl: float) -> float:
    """The float seconds a claim for a message published with ``options`` lives: until its
    ``expires`` (``default_expires``: the task's) when it has one, else its countdown or ETA
    plus ``ttl`` (``lease_dedupe_ttl``); at least 1 ms."""
    expires = options.get("expires", default_expires)
    if expires is not None:
        return max(_seconds_until(expires), 0.001)
    delay = options.get("countdown")
    if delay is None and options.get("eta") is not None:
        delay = _seconds_until(options["eta"])
    return max(float(delay or 0.0), 0.0) + ttl


def _seconds_until(when: Any) -> float:
    if isinstance(when, str):
        when = isoparse(when)
    if isinstance(when, datetime):
        return float((maybe_make_aware(when) - datetime.now(timezone.utc)).total_seconds())
    return float(when)


def send(
    task: Any,
    key: str | None,
    options: dict[str, Any],
    publish: Callable[..., Any],
    take_over: bool = False,
) -> Any:
    """Publish a message of ``task`` (``publish(**options)``) unless a copy of lease ``key`` is
    waiting; return its result, with ``lease_disposition`` set.

    Args:
        key: the lease key of the call, or None when its arguments give none (published: the
            execution fails with the real error).
        options: the ``apply_async`` options (``task_id`` taken from them, or made here).
        publish: publishes the message: Celery's own ``apply_async`` with the call's
            arguments.
        take_over: claim the slot whoever holds it (the holder's self-requeue, a message
            published again under its own task id).

    Raises:
        LeaseStoreUnavailable: the store could not be asked and ``lease_on_store_error`` is
            ``"fail"`` (never for a decision too few replicas acknowledged: published then).
        Exception: whatever ``publish`` raises (the claim is removed first).
    """
    headers = {k: v for k, v in (options.get("headers") or {}).items() if k != CLAIM_HEADER}
    if key is None or (not take_over and any(options.get(name) for name in _CANVAS)):
        return _published(task, key or "", options, headers, publish, "published")
    settings = task.lease_settings()
    requested = options.pop("task_id", None)
    task_id = requested or uuid()
    lifetime = claim_lifetime(options, getattr(task, "expires", None), settings.options.dedupe_ttl)
    # Provisional until the message is out: a publisher that dies before its publish leaves
    # a claim that lapses within lease_ttl, not one that folds requests onto nothing.
    provisional = min(lifetime, settings.options.ttl)
    confirm = False
    claimer = store.holder_json(task.name, task_id, socket.gethostname(), process.pid())
    headers[CLAIM_HEADER] = key  # the execution clears a claim naming it, if one is there
    try:
        decision = store.claim(
            _client(task),
            key,
            task_id,
            _ms(provisional),
            claimer,
            take_over,
            settings.options.min_replicas,
        )
    except RedisError as exc:
        # A lost reply (a broken connection, a timeout) may hide a claim that was written.
        ambiguous = isinstance(exc, (RedisConnectionError, RedisTimeoutError))
        error = LeaseStoreUnavailable(key, "publish", store.describe(exc))
        # A decision too few replicas acknowledged (lease_min_replicas; a claim was taken
        # back) may not survive a failover: this request is published, never folded on it.
        if settings.options.on_store_error == "fail" and not isinstance(exc, store.NotReplicated):
            if ambiguous:
                forget(task, key, task_id, "its publish was refused")
            raise error from None
        logger.warning(
            "task %s[%s] published without a waiting-copy claim (the execution "
            "lease still guards it): %s",
            task.name,
            task_id,
            error,
        )
        disposition = "unguarded"
    else:
        if not (decision.claimed or decision.foreign):
            return _deduplicated(task, key, requested, decision)
        disposition = "published" if decision.claimed else "unguarded"
        confirm = decision.claimed and lifetime > provisional
        if decision.foreign:
            logger.warning(
                "task %s[%s] published without a waiting-copy claim: %s holds %s "
                "(`celery lease doctor` says more)",
                task.name,
                task_id,
                claim_key(key),
                decision.foreign,
            )
    try:
        result = _published(
            task, key, {**options, "task_id": task_id}, headers, publish, disposition
        )
    except BaseException:
        forget(task, key, task_id, "its publish failed")
        raise
    if confirm:
        _confirm(task, key, task_id, lifetime)
    return result


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _confirm(task: Any, key: str, task_id: str, lifetime: float) -> None:
    """Give the claim of ``task_id``, now published, its full ``lifetime`` (float seconds).
    Never raises: a claim not confirmed keeps its provisional lifetime (``lease_ttl``), after
    which a publish of the key is queued again (a second copy, which the lease still keeps to
    one at a time)."""
    try:
        store.confirm_claim(_client(task), key, task_id, _ms(lifetime))
    except Exception as exc:
        logger.warning(
            "lease dedupe: the claim of task %s[%s] keeps its provisional lifetime "
            "(at most lease_ttl): %s",
            task.name,
            task_id,
            store.describe(exc),
        )


def _client(task: Any) -> Any:
    settings = task.lease_settings()
    return store.client_for(
        settings.url, settings.options.store_timeout, settings.options.backend_options
    )


def _published(
    task: Any,
    key: str,
    options: dict[str, Any],
    headers: dict[str, Any],
    publish: Callable[..., Any],
    disposition: str,
) -> Any:
    result = mark(publish(**{**options, "headers": headers}), disposition)
    _announce(task, key, result.id, disposition)
    return result


def _deduplicated(task: Any, key: str, requested: str | None, decision: store.Decision) -> Any:
    _announce(task, key, decision.task_id, "deduplicated")
    if signals.lease_deduplicated.receivers:
        signals.lease_deduplicated.send(
            sender=task,
            key=key,
            task_id=decision.task_id,
            requested_task_id=requested,
            age=decision.age,
        )
    return mark(task.AsyncResult(decision.task_id), "deduplicated")


def _announce(task: Any, key: str, task_id: str, disposition: str) -> None:
    logger.debug("lease dedupe: task %s[%s] %s (key=%s)", task.name, task_id, disposition, key)
    if signals.lease_published.receivers:
        signals.lease_published.send(sender=task, key=key, task_id=task_id, disposition=disposition)


def forget(task: Any, key: str, task_id: str, why: str) -> None:
    """Remove lease ``key``'s claim while it names ``task_id``, a message that will not run
    (``why`` says why, for the log). Best effort, never raises: a claim not removed lapses at
    its lifetime."""
    try:
        if store.unclaim(_client(task), key, task_id):
            logger.debug("lease dedupe: claim of task %s[%s] removed: %s", task.name, task_id, why)
    except Exception as exc:
        logger.warning(
            "lease dedupe: the claim of task %s[%s] (%s) was not removed, it lapses "
            "at its lifetime: %s",
            task.name,
            task_id,
            why,
            store.describe(exc),
        )


def _on_revoked(sender: Any = None, request: Any = None, expired: bool = False, **kw: Any) -> None:
    """A worker dropped a message (revoked, expired, terminated): its claim goes with it."""
    key = (getattr(request, "headers", None) or {}).get(CLAIM_HEADER)
    task_id = getattr(request, "id", None)
    if key and task_id and sender is not None:
        forget(sender, str(key), str(task_id), "expired" if expired else "revoked")


task_revoked.connect(_on_revoked, weak=False)


def enabled(task: Any) -> bool:
    """Whether ``task`` (a :class:`~celery_lease.LeasedTask`) has ``lease_dedupe``, as a task
    option or the app setting (validated at registration; the setting read once per task
    class: :func:`celery_lease.settings.publish.app_setting`)."""
    value = type(task).lease_dedupe
    return (publish_settings.app_setting(task, "lease_dedupe") if value is None else value) is True


class Dedupe(Policy):
    """``lease_dedupe``: at publish, at most one waiting copy per key (the module docstring);
    at the execution, a claimed message's acquire clears its claim, and a message that ends on
    a conflict without a copy sent on removes it."""

    name = "lease_dedupe"
    triggers = {"shape": CLAIM_HEADER}  # a claimed message says so in a header
    always = frozenset({"on_message_end"})

    def applies_at_publish(self, task: Any) -> bool:
        return enabled(task)

    def send(
        self,
        task: Any,
        key: str | None,
        options: dict[str, Any],
        publish: Callable[..., Any],
        take_over: bool,
    ) -> Any:
        return send(task, key, options, publish, take_over)

    def shape(
        self, task: Any, request: Any, args: Any, kwargs: Any, asked: lifecycle.AcquireRequest
    ) -> None:
        asked.claimed = CLAIM_HEADER in (request.headers or {})  # the grant clears its claim

    def on_message_end(self, task: Any, request: Any, policy: str) -> None:
        key_claimed = (request.headers or {}).get(CLAIM_HEADER)
        if key_claimed:
            forget(task, str(key_claimed), request.id, f"it ended on a conflict ({policy})")
