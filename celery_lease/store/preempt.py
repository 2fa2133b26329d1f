"""Newest wins (``lease_on_conflict="preempt"``): the store's side of taking a lease over.

- :func:`take_over`: one script (``scripts/preempt/preempt-4.lua``) replaces the holder's token
  with the newcomer's and issues a higher fencing token;
- :func:`was_preempted`: whether a refused renewal was a take-over (the newcomer's holder JSON
  names the token it replaced), for an old holder whose notice was lost;
- :func:`publish_preempted` / :func:`subscribe` / :func:`next_message`: the notification the
  old holder's process listens to (``PUBLISH`` on the channel its holder value names), so that
  ``LeaseLost`` lands at once rather than at its next renewal (the fallback);
- :func:`wake_preempter` / :func:`wait_preempted_end`: with ``lease_preempt_grace``, the old
  holder's end wakes the newcomer, which waits for it at most the grace.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis
from redis.exceptions import RedisError

from ..base.keys import claim_key, fence_key, reservation_key, wake_key
from . import lua, primary, routing
from .protocol import FENCE_COUNTER_EXTRA_MS, WAKE_LIFETIME_MS, AcquireResult
from .value import Holder, parse_value

__all__ = [
    "next_message",
    "preempt_channel",
    "publish_preempted",
    "subscribe",
    "take_over",
    "wait_preempted_end",
    "wake_preempter",
    "was_preempted",
]

_take_over = lua.load("preempt/preempt-4.lua")
_wake_preempter = lua.load("preempt/wake_preempter-1.lua")


def preempt_channel(prefix: str, hostname: str, pid: int) -> str:
    """The channel a process holding leases under ``prefix`` listens on for preemptions:
    ``<prefix>:preempt:<hostname>:<pid>`` (the host and pid its holder values name)."""
    return f"{prefix}:preempt:{hostname}:{pid}"


def take_over(  # noqa: PLR0913 - store.acquire's grant signature (lifecycle.take)
    client: redis.Redis,
    key: str,
    token: str,
    ttl_ms: int,
    holder: str,
    min_replicas: int = 0,
    task_id: str = "",
    handed_over: bool = False,
    claimed: bool = False,
    *,
    from_token: str,
) -> AcquireResult:
    """Take lease ``key`` over from the holder ``from_token`` for ``token`` (lifetime
    ``ttl_ms``, int milliseconds), in one script; a free key is granted as by
    :func:`celery_lease.store.acquire`, whose arguments and answer it shares (so
    :func:`celery_lease.core.lifecycle.take` can send it, with its same-token retry).
    ``min_replicas`` is not waited for: the take-over is answered by the primary alone;
    ``handed_over`` does not apply to ``"preempt"``; a ``claimed`` message's claim
    (``lease_dedupe``) is cleared by the take-over when it names ``task_id``, in the same
    script, as :func:`celery_lease.store.acquire` clears it.

    Not granted when the key changed hands since ``from_token`` was seen, holds a cooldown
    record (``lease_cooldown``), or is free but reserved for another task id (a hand-over): the
    answer then names the holder found.

    Raises:
        PrimaryUnconfirmed: a Sentinel-managed client's take-over the sentinels did not confirm
            (:func:`celery_lease.store.primary.confirmed_grant`); the caller releases the
            token, as after any failed acquire.
        redis.exceptions.RedisError: on store errors.
    """
    keys: tuple[str, ...] = (key, fence_key(key), reservation_key(key))
    if claimed:
        keys = (*keys, claim_key(key))
    argv = (token, ttl_ms, holder, ttl_ms + FENCE_COUNTER_EXTRA_MS, task_id, "0", from_token)
    try:
        # Confirmed as every grant is (a Sentinel-managed client): a take-over written on a
        # primary a failover demoted would run a body beside the new primary's holder.
        granted, value, pttl = primary.confirmed_grant(
            client, lambda: _take_over(client, keys, argv)
        )
    except RedisError as exc:
        raise routing.note(exc, client, key) from None
    if granted and b":" not in value:
        return AcquireResult(True, Holder(token, int(value)), ttl_ms / 1000)
    return AcquireResult(
        bool(granted), parse_value(value), (int(pttl) if int(pttl) >= 0 else ttl_ms) / 1000
    )


def was_preempted(client: redis.Redis, key: str, token: str) -> bool:
    """True when lease ``key`` is now held by an execution that took it over from ``token``
    (its holder JSON's ``"preempted"``, written by ``preempt/preempt-4.lua``): a renewal of
    ``token`` refused because of a take-over, not an expiry. One ``GET``; False for anything else (a
    free key, another value, a store error: the loss then stays ``refused``)."""
    try:
        value = client.get(key)
    except RedisError:
        return False
    if not isinstance(value, bytes | str):
        return False
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    _, _, rest = text.partition(":")
    _, _, meta = rest.partition(":")
    try:
        info = json.loads(meta)
    except ValueError:
        return False
    return isinstance(info, dict) and info.get("preempted") == token


def publish_preempted(client: redis.Redis, channel: str, token: str) -> int:
    """Tell the process listening on ``channel`` that its lease with ``token`` was taken over.
    Returns how many subscribers got it (0: none listened; the old holder then learns it at
    its next renewal).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    return int(client.publish(channel, token))


def subscribe(client: redis.Redis, channel: str) -> Any:
    """A ``PubSub`` subscribed to ``channel`` (the subscription confirmed), for
    :func:`next_message`.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    pubsub.subscribe(channel)
    return pubsub


def next_message(pubsub: Any, timeout: float) -> str | None:
    """The next message's text on ``pubsub``, or None after ``timeout`` float seconds.

    Raises:
        redis.exceptions.RedisError: the connection broke (subscribe again).
    """
    message = pubsub.get_message(timeout=timeout)
    if message is None or message.get("type") != "message":
        return None
    data = message["data"]
    return data.decode() if isinstance(data, bytes) else str(data)


def wake_preempter(client: redis.Redis, key: str, token: str) -> bool:
    """The preempted execution ``token`` of lease ``key`` ended: wake the newcomer waiting out
    its grace (:func:`wait_preempted_end`). False when the store refused the push (the
    newcomer then waits the whole grace).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    try:
        reply = _wake_preempter(client, (wake_key(key),), (token, WAKE_LIFETIME_MS))
    except RedisError as exc:
        raise routing.note(exc, client, key) from None
    return bool(reply == 1)


def wait_preempted_end(client: redis.Redis, key: str, token: str, timeout: float) -> bool:
    """Block up to ``timeout`` float seconds for the end of the preempted execution ``token``
    of lease ``key`` (:func:`wake_preempter`). True when it ended, False on the timeout.
    ``client`` must time out later than ``timeout``.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            found = client.blpop([wake_key(key)], max(left, 0.001))
        except RedisError as exc:
            raise routing.note(exc, client, key) from None
        if found is None:
            return False
        element = found[1]
        if (element.decode() if isinstance(element, bytes) else str(element)) == token:
            return True
    return False
