"""The slots of a limited key (``lease_limit=N``, N > 1): up to N executions hold one key at once.

A limited key is a hash at the lease key itself, one field per holder's token, each holding
``<deadline>:<fencing token>:<holder JSON>`` (the deadline in milliseconds of the store's
clock), and a field ``n``, the N of the last grant (for ``celery lease ls``). Each slot is a
lease of its own: taken by ``scripts/slots/acquire_slot-3.lua`` (expired slots deleted first, then
counted: a holder that dies frees its own slot at its own deadline, and nothing is a counter
that could drift), renewed in the heartbeat's one round trip beside the plain leases by
scripts of its own (``scripts/slots/renew_slots.lua``, ``scripts/slots/renew_slot-1.lua``, through
:func:`celery_lease.store.renew_many`'s ``slots``: only its own deadline moves), released by
``scripts/slots/release_slot-3.lua`` (only its own field), taken away by an operator with
``scripts/slots/revoke_slot-1.lua``. The fencing token comes from the key's one
counter, so it increases across every grant of every slot.

N = 1 is the plain lease, with its own scripts and key format (:mod:`.protocol`): a limit of 1
costs nothing more. The two shapes of one key exclude each other: a plain lease at the key is
a holder the slots wait for, and a hash of slots is a holder (of another type) the plain lease
waits for, so changing a task's limit never lets more run than the old or the new limit allows.

Where the idea comes from: the concurrent limiters of Sidekiq Enterprise and Oban Pro
(docs/howto/shaping/limit.md compares them), made of leases that expire one by one, because a count
decremented on release loses a slot to every holder that dies before its release.
"""

from __future__ import annotations

from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any

import redis
from redis.exceptions import RedisError

from ..base.keys import claim_key, fence_key, wake_key
from . import lua, primary, replicated, routing
from .protocol import FENCE_COUNTER_EXTRA_MS, RAN_HOLDER, WAKE_LIFETIME_MS, AcquireResult, woke
from .value import TOKEN_LENGTH, Holder, granted_holder, parse_value

__all__ = [
    "Slot",
    "SlotGrant",
    "SlotsFull",
    "acquire_slot",
    "pass_slot_turn",
    "read_slots",
    "release_slot",
    "release_slot_and_wake",
    "revoke_slot",
]

_acquire = lua.load("slots/acquire_slot-3.lua")
_release = lua.load("slots/release_slot-3.lua")
_revoke = lua.load("slots/revoke_slot-1.lua")
_pass_turn = lua.load("slots/pass_turn_slot-2.lua")


def acquire_slot(  # noqa: PLR0913 - store.acquire's grant signature (lifecycle.take)
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
    limit: int,
    same_task_id: bool = True,
) -> AcquireResult:
    """Take one of the ``limit`` slots of ``key`` for ``token``, for ``ttl_ms`` int
    milliseconds; called as :func:`celery_lease.store.acquire` is (see it for the repeat after
    an ambiguous failure, ``min_replicas`` and the Sentinel confirmation), through
    the key shape (:func:`celery_lease.store.key_shape`).

    A refusal (a :class:`SlotsFull`) names the holder whose slot ends first, and its time
    left: a retry waits for the first slot to free. A ``task_id`` that holds a live slot
    already (its message delivered again while the first delivery runs) is refused as held
    by that slot, as the plain lease refuses it; ``same_task_id=False`` skips that check (a
    hold, whose task id is a thread name).
    ``claimed`` (``lease_dedupe``: the message claimed the key's waiting slot at publish):
    a grant also deletes that claim when it names ``task_id``, in the same script.
    ``handed_over`` is not used: a run handed a slot (``queue``, ``retry``, ``coalesce``:
    :func:`celery_lease.store.handoff.release_handing_over`) takes the slot reserved for its
    ``task_id``, which every other execution finds held until the reservation's lifetime
    ends. A copy of a run the crash sweep published again, once another copy took its slot,
    is refused with the holder :data:`~celery_lease.store.protocol.RAN_HOLDER` (it runs once).

    Raises:
        ValueError: ``limit`` below 2 (a limit of 1 is the plain lease).
        NotReplicated: fewer than ``min_replicas`` replicas acknowledged the grant in time;
            the slot was released again.
        PrimaryUnconfirmed: as :func:`celery_lease.store.acquire`; the caller releases.
        redis.exceptions.RedisError: store errors (the node noted, for
            :func:`celery_lease.store.errors.describe`).
    """
    if limit < 2:
        raise ValueError(f"acquire_slot(limit={limit!r}): a limit of 1 is the plain lease")
    keys: tuple[str, ...] = (key, fence_key(key))
    if claimed:
        keys = (*keys, claim_key(key))
    same = f',"id":{_json_str(task_id)},' if task_id and same_task_id else ""
    argv = (token, ttl_ms, holder, ttl_ms + FENCE_COUNTER_EXTRA_MS, limit, same, task_id)
    try:
        granted, value, pttl = primary.confirmed_grant(
            client,
            lambda: (
                _replicated(client, keys, argv, min_replicas)
                if min_replicas > 0
                else _acquire(client, keys, argv)
            ),
        )
    except RedisError as exc:
        raise routing.note(exc, client, key) from None
    if granted and b":" not in value:
        return AcquireResult(True, granted_holder(token, int(value)), ttl_ms / 1000)
    if not granted and value.startswith(b"ran:"):  # a copy of this handed run took its slot
        return AcquireResult(False, Holder("", 0, "", task_id, RAN_HOLDER), 0.0)
    pttl = int(pttl)
    remaining = (pttl if pttl >= 0 else ttl_ms) / 1000
    if granted:
        return AcquireResult(True, parse_value(value), remaining)
    return SlotsFull(False, parse_value(value), remaining, limit)


@dataclass(frozen=True)
class SlotsFull(AcquireResult):
    """A refused :func:`acquire_slot`: what :class:`~celery_lease.store.AcquireResult` says
    (the holder whose slot ends first), and the limit it was refused under.

    Attributes:
        limit: the N asked for (int >= 2); a policy that waits in the key's line parks
            with it (:func:`celery_lease.store.handoff.park`).
    """

    limit: int = 2


class SlotGrant:
    """The grant of one slot of a ``limit``-slot key (:func:`acquire_slot`), called as
    :func:`celery_lease.store.acquire` is: the ``acquire`` of its
    :class:`~celery_lease.store.shape.KeyShape`.

    Attributes:
        limit: N (int >= 2).
        same_task_id: False (a hold) takes a slot whatever task id holds the others.
    """

    def __init__(self, limit: int, same_task_id: bool) -> None:
        self.limit = limit
        self.same_task_id = same_task_id

    def __call__(self, *args: Any) -> AcquireResult:
        return acquire_slot(*args, limit=self.limit, same_task_id=self.same_task_id)


def _replicated(
    client: Any, keys: tuple[str, ...], argv: tuple[Any, ...], min_replicas: int
) -> Any:
    """The slot script and ``WAIT`` in one round trip, as the plain acquire's; a grant fewer
    replicas acknowledged is released again (not the claim: no wake key) and raises."""
    return replicated.grant(
        _acquire, client, keys, argv, min_replicas, lambda: _release(client, keys[:2], (argv[0],))
    )


def release_slot(client: redis.Redis, key: str, token: str) -> bool:
    """Delete ``token``'s slot of ``key`` (only it). Answers as
    :func:`celery_lease.store.release` does: True when released, by this call or by an earlier
    one of ``token`` (while no other slot's release was noted since), False when ``token``
    had no slot there (it expired, or was revoked). On a Sentinel-managed client a release
    that found its slot counts only once the sentinels confirm its node, as a plain release
    (:func:`celery_lease.store.primary.released`).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    return primary.released(client, key, lambda: _released(client, key, (token,)), bool, False)


def _released(client: redis.Redis, key: str, argv: tuple[Any, ...], wake: bool = False) -> bool:
    """One ``slots/release_slot-3.lua`` (``wake``: with the key's wake list); a store error names
    the node it came from."""
    keys = (key, fence_key(key), wake_key(key)) if wake else (key, fence_key(key))
    try:
        return bool(_release(client, keys, argv))
    except RedisError as exc:
        raise routing.note(exc, client, key) from None


def revoke_slot(client: redis.Redis, key: str, token: str) -> bool:
    """Take ``token``'s slot of ``key`` away (an operator's release, ``celery lease
    release``), as :func:`celery_lease.store.revoke` does for a plain lease: the holder learns
    it at its next renewal. Returns True when the slot was deleted.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    try:
        return bool(_revoke(client, (key,), (token,)))
    except RedisError as exc:
        raise routing.note(exc, client, key) from None


def release_slot_and_wake(client: redis.Redis, key: str, token: str) -> bool:
    """:func:`release_slot`, and wake one hold waiting for ``key``
    (:func:`celery_lease.store.wait_for_release`), in the same script: a hold's release
    (confirmed on Sentinel as :func:`release_slot` is).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    return primary.released(
        client, key, lambda: _released(client, key, (token, WAKE_LIFETIME_MS), True), bool, False
    )


def pass_slot_turn(client: redis.Redis, key: str, limit: int) -> bool:
    """Wake one hold waiting for ``key``, a key of ``limit`` slots, if one of them is free:
    :func:`celery_lease.store.pass_turn` for ``hold(limit=N)`` (a cancelled waiter may have
    taken a slot's release's wake-up unread, while other slots stay held). Slots past their
    deadline are deleted on the way. Returns True when a waiter was woken; False when all
    ``limit`` slots are held, or when the store refused the wake.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    return woke(_pass_turn, client, key, (WAKE_LIFETIME_MS, limit))


@dataclass(frozen=True)
class Slot:
    """One held slot of a limited key, as stored.

    Attributes:
        holder: the slot's holder (token, fencing token, task, task id, host, pid).
        ttl: float seconds left before its deadline, on the store's clock.
    """

    holder: Holder
    ttl: float


def read_slots(client: Any, key: str) -> tuple[int, list[Slot]] | None:
    """``(N, live slots, soonest deadline first)`` of limited key ``key``, or None when ``key``
    is not a hash of slots (absent, a plain lease, another type). Read-only: a slot past its
    deadline is left out (the next acquire deletes it). N is the limit of the last grant. A
    hash without it, or with a field that is no token, is another tool's: None.

    Raises:
        redis.exceptions.RedisError: on store errors (a key of another type reads as None).
    """
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("HGETALL", key)
    pipe.execute_command("TIME")
    fields, now = pipe.execute(raise_on_error=False)
    if isinstance(now, Exception):
        raise now
    if isinstance(fields, Exception) or not fields:
        if isinstance(fields, Exception) and "WRONGTYPE" not in str(fields):
            raise fields
        return None
    if isinstance(fields, list):  # RESP2 without the client's pairing
        fields = dict(zip(fields[::2], fields[1::2], strict=True))
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    if not isinstance(fields.get(b"n", fields.get("n")), (bytes, str)):
        return None  # no limit recorded: a hash of another tool, not slots
    limit, slots = 0, []
    for name, raw in fields.items():
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if name == "n":
            limit = int(text) if text.isdigit() else 0
            continue
        if name.startswith("r:"):  # a slot reserved for a handed-over run, not a holder
            continue
        if len(name) != TOKEN_LENGTH:  # not a token: a field of another tool
            return None
        due, _, rest = text.partition(":")
        if not due.isdigit() or int(due) <= now_ms:
            continue
        slots.append(Slot(parse_value(f"{name}:{rest}"), (int(due) - now_ms) / 1000))
    slots.sort(key=lambda s: s.ttl)
    return limit, slots
