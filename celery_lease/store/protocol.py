"""The lease protocol: acquire, release, revoke, and the wake-up of a waiting hold.

Stored value of a lease key: ``<token>:<fencing token>:<holder JSON>``
(:mod:`celery_lease.store.value`). The token (32 hex characters, unique per execution) is what
every conditional operation compares; the rest is there for the holder's successors and for
operators (``celery lease ls``). Renewal is :mod:`celery_lease.store.renewal`.

Each decision is one script (``scripts/<policy>/*.lua``, see :mod:`celery_lease.store.lua`), one
round trip; each script's header says what it does, its keys, arguments and replies, and
docs/reference/scripts.md why it is safe (conditional on the token, safe to repeat, checks before
writes, nothing left without a lifetime under ``maxmemory``). The fencing token is
``max(previous + 1, server time in microseconds)``: strictly increasing per key across every
grant, even when the counter key was evicted or the server restarted empty (as long as the server
clock does not step back further than the counter lifetime), and across a failover that lost the
counter (as long as the new primary's clock is not behind the old one's by more than the failover
took; docs/deploying/sentinel.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import RedisError

from ..base.keys import claim_key, fence_key, reservation_key, wake_key
from . import lua, primary, replicated, routing
from .errors import is_wrong_type
from .value import TOKEN_LENGTH, Holder, granted_holder, parse_value

__all__ = [
    "FENCE_COUNTER_EXTRA_MS",
    "RAN_HOLDER",
    "RESERVED_HOLDER",
    "TOKEN_LENGTH",
    "WAKE_LIFETIME_MS",
    "AcquireResult",
    "acquire",
    "pass_turn",
    "release",
    "release_and_wake",
    "released_last",
    "revoke",
    "wait_for_release",
    "woke",
]

logger = logging.getLogger("celery_lease")

# The fencing counter outlives its lease by an hour: across a longer gap the server clock
# (microseconds) alone keeps fencing tokens increasing, and per-argument keys do not pile up.
# scripts/lib/note_ended.lua writes the same lifetime for a counter that had lapsed.
FENCE_COUNTER_EXTRA_MS = 3600 * 1000
# How long a wake element waits for a waiter, int milliseconds: long enough for a waiter
# between its refused acquire and its BLPOP; a stale one costs a later waiter one acquire.
WAKE_LIFETIME_MS = 2000

#: The host a refused acquire names for a key reserved for a handed-over run.
RESERVED_HOLDER = "(reserved)"
#: The host a refused acquire names when a handed-over run's copy already ran.
RAN_HOLDER = "(already ran)"

_acquire = lua.load("lease/acquire-4.lua")
_release = lua.load("lease/release-2.lua")
_ungrant = lua.load("lease/ungrant-3.lua")
_release_wake = lua.load("lease/release_wake-3.lua")
_revoke = lua.load("lease/revoke-1.lua")
_pass_turn = lua.load("lease/pass_turn-2.lua")


@dataclass(frozen=True)
class AcquireResult:
    """What an acquire found.

    Attributes:
        granted: True when this token holds the lease now.
        holder: the holder (this token when granted).
        remaining: the lifetime left on the server, float seconds.
        joined: a grant to a handed-over ``coalesce`` run that a later duplicate joined
            before it started (``handoff/park-3.lua``): that duplicate's message (JSON str, with
            ``args`` and ``kwargs``: the latest, which the run takes); else None.
    """

    granted: bool
    holder: Holder
    remaining: float
    joined: str | None = field(default=None, kw_only=True)


def acquire(  # noqa: PLR0913 - the grant signature take_over and acquire_slot share
    client: redis.Redis,
    key: str,
    token: str,
    ttl_ms: int,
    holder: str,
    min_replicas: int = 0,
    task_id: str = "",
    handed_over: bool = False,
    claimed: bool = False,
) -> AcquireResult:
    """Take lease ``key`` for ``token`` with lifetime ``ttl_ms`` (int milliseconds).

    One round trip (two when the server lost its script cache). Safe to repeat with the same
    token after an ambiguous failure: the repeat is granted with the same fencing token.

    A free key that a hand-over release reserved for another task id (``coalesce``,
    ``queue``: :mod:`celery_lease.store.handoff`) is refused as held by that task id (host
    ``(reserved)``); the reserved ``task_id`` takes it and ends the reservation (and gets the
    latest message of a coalesced run that a later duplicate joined: ``joined``).

    Args:
        task_id: the task id of the execution taking the lease ('' for none).
        handed_over: True for a run published by a hand-over (header ``lease_handoff``): once
            its task id took its reservation, another copy of it is refused as
            :data:`RAN_HOLDER` (a double publish runs once).
        min_replicas: int; when above 0, ``WAIT min_replicas`` goes in the same round trip
            (a pipeline on the key's primary) and a grant counts only once that many replicas
            acknowledged it. ``WAIT`` waits at most half the client's socket timeout (the store
            timeout), so its reply arrives before the socket gives up.
        claimed: the execution's message claimed the key's waiting slot at publish
            (``lease_dedupe``): a grant also clears that claim when it names ``task_id``, in
            the same script (``lease/acquire-4.lua``; :mod:`celery_lease.store.claims`).

    Raises:
        NotReplicated: fewer than ``min_replicas`` replicas acknowledged the grant in time;
            the grant was released again.
        PrimaryUnconfirmed: a Sentinel-managed client's grant that the sentinels did not
            confirm landed on the primary they name now (:mod:`celery_lease.store.primary`);
            the token may hold the key: the caller releases it, as
            :func:`celery_lease.core.lifecycle.take` does after every failed acquire.
        redis.exceptions.RedisError: connection problems, timeouts, OOM and other store errors
            (the node noted by :func:`celery_lease.store.routing.note`, for
            :func:`celery_lease.store.errors.describe`).
    """
    keys, argv = acquire_call(key, token, ttl_ms, holder, task_id, handed_over, claimed)
    try:
        if min_replicas > 0:
            reply = primary.confirmed_grant(
                client, lambda: _acquire_replicated(client, keys, argv, min_replicas)
            )
        elif primary.managed(client):  # the caller releases an unconfirmed grant's token
            reply = primary.confirmed_grant(client, lambda: _acquire(client, keys, argv))
        else:
            reply = _acquire(client, keys, argv)
    except RedisError as exc:
        raise routing.note(exc, client, key) from None
    return acquire_answer(reply, token, ttl_ms)


def acquire_call(
    key: str,
    token: str,
    ttl_ms: int,
    holder: str,
    task_id: str = "",
    handed_over: bool = False,
    claimed: bool = False,
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """The keys and arguments of the acquire script (``lease/acquire-4.lua``) for :func:`acquire`'s
    arguments (the same names): for :func:`acquire` and for an acquire written ahead of its
    execution (:mod:`celery_lease.store.written`)."""
    keys: tuple[str, ...] = (key, fence_key(key), reservation_key(key))
    if claimed:
        keys = (*keys, claim_key(key))
    return keys, (
        token,
        ttl_ms,
        holder,
        ttl_ms + FENCE_COUNTER_EXTRA_MS,
        task_id,
        "1" if handed_over else "0",
    )


def acquire_answer(reply: Any, token: str, ttl_ms: int) -> AcquireResult:
    """The :class:`AcquireResult` of the acquire script's ``reply`` for ``token`` (see
    ``lease/acquire-4.lua``'s header for the replies)."""
    granted, value, pttl, *joined = reply
    if granted and b":" not in value:  # a fresh grant answers with the fencing token alone
        if joined:  # the reserved run a later duplicate joined: its latest message
            return AcquireResult(
                True,
                granted_holder(token, int(value)),
                ttl_ms / 1000,
                joined=joined[0].decode("utf-8", "replace"),
            )
        return _granted(granted_holder(token, int(value)), ttl_ms / 1000)
    if not granted and value.startswith((b"reserved:", b"ran:")):
        kind, _, reserved_for = value.decode("utf-8", "replace").partition(":")
        host = RESERVED_HOLDER if kind == "reserved" else RAN_HOLDER
        return AcquireResult(False, Holder("", 0, "", reserved_for, host), int(pttl) / 1000)
    # A key without a lifetime (pttl -1) is no lease of ours (each has one): a value or a
    # counter another tool wrote. It counts as held for one TTL more, so a retry waits a TTL.
    return AcquireResult(
        bool(granted), parse_value(value), (int(pttl) if int(pttl) >= 0 else ttl_ms) / 1000
    )


def _granted(holder: Holder, remaining: float) -> AcquireResult:
    """``AcquireResult(True, holder, remaining)`` without the frozen dataclass's ``__init__``
    (once per execution; the same object, as :func:`~celery_lease.store.value.granted_holder`)."""
    result: AcquireResult = object.__new__(AcquireResult)
    result.__dict__.update(granted=True, holder=holder, remaining=remaining, joined=None)
    return result


def _acquire_replicated(
    client: Any, keys: tuple[str, ...], argv: tuple[Any, ...], min_replicas: int
) -> Any:
    """The acquire script and ``WAIT`` in one round trip; a grant fewer replicas acknowledged
    is released again (a handed-over run's, with the key reserved for it again: the copy of
    it sent again keeps its turn, ``lease/ungrant-3.lua``) and raises
    (:func:`.replicated.grant`)."""
    token, ttl_ms, _, _, task_id, handed_over = argv
    return replicated.grant(
        _acquire,
        client,
        keys,
        argv,
        min_replicas,
        lambda: _ungrant(client, keys[:3], (token, task_id, handed_over, ttl_ms)),
    )


def _decide(
    script: lua.Script, client: redis.Redis, key: str, keys: tuple[str, ...], argv: tuple[Any, ...]
) -> bool:
    """Run a yes/no ``script`` about lease ``key``; a store error names the node it came from."""
    try:
        return bool(script(client, keys, argv))
    except RedisError as exc:
        raise routing.note(exc, client, key) from None


def release(client: redis.Redis, key: str, token: str) -> bool:
    """Delete lease ``key`` if ``token`` still holds it. Returns True when it was deleted, by
    this call or by an earlier release of ``token`` (so a release sent again after a broken
    connection, whose first reply may be lost after the script ran, still answers True; also
    once a later holder was granted the key, until that holder released it in turn).

    A release also notes ``token`` as the last execution that ended with this key (beside the
    fencing counter), for :func:`released_last`.

    On a Sentinel-managed client a release that found its token counts only once the sentinels
    confirm the node it was written to (:func:`celery_lease.store.primary.released`, as for a
    grant): a primary demoted by a failover still answers old connections, with the token a
    grant that never replicated left there, while the new primary may have granted the key to
    another execution. Unconfirmed, the release is sent once more, to the primary the
    sentinels name (token-checked: harmless), and that answer counts once confirmed in turn;
    otherwise it answers False: the holder cannot confirm it held its lease to the end, and
    records it as a loss (:func:`celery_lease.core.lifecycle.end`) instead of ending silently
    (with ``lease_min_replicas=0`` such a holder may have run beside the next one).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    keys, argv = (key, fence_key(key)), (token,)
    return primary.released(
        client, key, lambda: _decide(_release, client, key, keys, argv), bool, False
    )


def revoke(client: redis.Redis, key: str, token: str) -> bool:
    """Take lease ``key`` away from the holder ``token`` (an operator's release): delete it if
    ``token`` still holds it. Returns True when it was deleted.

    Unlike :func:`release` it does not note ``token`` as having ended: the holder finds the
    loss at its next renewal (``LeaseLost``, cause ``refused``) and at its own release
    (``released=False``), and a redelivered message of it is run again.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    return _decide(_revoke, client, key, (key,), (token,))


def release_and_wake(client: redis.Redis, key: str, token: str) -> bool:
    """:func:`release`, and wake one hold waiting for ``key`` (:func:`wait_for_release`).

    Used by holds and by beat's leader lease (their keys are never a task's), so a task's
    release is unchanged.
    A wake the store refuses (out of memory, or an ACL user without ``RPUSH``) does not undo
    the release: it is logged as a warning naming the fix, and waiting holds take the key
    when it expires instead.

    On a Sentinel-managed client it counts as :func:`release` does
    (:func:`celery_lease.store.primary.released`): one answered by a primary a failover
    demoted is sent once more to the primary the sentinels name, where it releases and wakes
    a waiter there (token-checked: where the first one landed, the second wakes nobody
    again), and only that answer counts; a holder whose token the new primary does not have
    learns it lost its lease (False), and nobody is woken for it.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    keys = (key, fence_key(key), wake_key(key))

    def send() -> Any:
        try:
            return _release_wake(client, keys, (token, WAKE_LIFETIME_MS))
        except RedisError as exc:
            raise routing.note(exc, client, key) from None

    # 1, and a refused wake's text: released (the wake's refusal does not undo it).
    reply = primary.released(client, key, send, bool, 0)
    if isinstance(reply, (bytes, str)):  # released, the wake refused: the server's reason
        text = reply.decode() if isinstance(reply, bytes) else reply
        fix = (
            "free memory on the store (maxmemory)"
            if "OOM" in text
            else "grant the ACL user +rpush (the rule `celery lease acl` prints, "
            "docs/deploying.md section ACL)"
        )
        logger.warning(
            "hold released %s but woke no waiting hold: the store refused the "
            "wake (%s); waiters take the key when it expires instead. Fix: %s",
            key,
            text,
            fix,
        )
        return True
    return bool(reply)


def pass_turn(client: redis.Redis, key: str) -> bool:
    """Wake one hold waiting for ``key`` if it is free: what a waiter that stops waiting
    (cancelled in its ``BLPOP``) does, in case it took a release's wake-up unread. Returns True
    when the key was free and a waiter was woken; False when it is held, or when the store
    refused the wake (as :func:`release_and_wake` says; the waiters take the key at the end of
    their own ``BLPOP``). A key of slots passes it with
    :func:`celery_lease.store.slots.pass_slot_turn`.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    return woke(_pass_turn, client, key, (WAKE_LIFETIME_MS,))


def woke(script: Any, client: redis.Redis, key: str, argv: tuple[Any, ...]) -> bool:
    """Run a pass-the-turn ``script`` of ``key`` (``KEYS``: the key, its wake list): True when
    it woke a waiter (its reply 1).

    Raises:
        redis.exceptions.RedisError: on store errors (the node noted).
    """
    try:
        reply = script(client, (key, wake_key(key)), argv)
    except RedisError as exc:
        raise routing.note(exc, client, key) from None
    return bool(reply == 1)


def wait_for_release(client: redis.Redis, key: str, timeout: float) -> bool:
    """Block up to ``timeout`` float seconds (at least 1 ms) for a release of ``key`` by
    :func:`release_and_wake`. Returns True when woken by one, False on the timeout (also after
    sleeping the timeout when the wake key is of another type than a list: not ours).

    ``client`` must time out later than ``timeout`` (a client of its own for waiting).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    try:
        return client.blpop([wake_key(key)], max(timeout, 0.001)) is not None
    except RedisError as exc:
        if not is_wrong_type(exc):
            raise routing.note(exc, client, key) from None
    # A key of another type at the wake key (another tool's): no wake-up can come, so the
    # waiter waits its time out and falls back to the holder's expiry, as after a lost one.
    time.sleep(max(timeout, 0.001))
    return False


def released_last(client: redis.Redis, key: str, token: str) -> bool:
    """True when ``token`` was the last holder of ``key`` to release it (it ended normally);
    False for a counter celery-lease did not write (any bytes, another type).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    try:
        value = client.get(fence_key(key))
    except RedisError as exc:
        if is_wrong_type(exc):
            return False  # a counter of another type: not ours, so no release of ours noted
        raise
    if isinstance(value, str):
        value = value.encode()
    return isinstance(value, bytes) and value.partition(b":")[2] == token.encode()
