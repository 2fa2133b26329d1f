"""The claim of a task's waiting copy (``lease_dedupe``): decided at publish, one script.

A claim is the key ``<lease key>:waiting`` (:func:`celery_lease.base.keys.claim_key`, under the
lease's hash tag, so it works on Cluster and Sentinel as the lease does). Its value is
``<claimed at>:<lifetime>:<claimer JSON>``: the store's clock when it was written (int
microseconds, ``TIME``), its lifetime (int milliseconds, also its ``PX``) and who published the
message (task name, the message's task id, the publishing host and pid, as a lease's holder
JSON). It names the copy of the key that was published and has not started yet:

- :func:`claim` (``dedupe/claim-2.lua``) decides a publish: claim the slot for the message about
  to be published, or answer the task id of the copy already waiting (nothing is published
  then);
- :func:`confirm_claim` (``dedupe/confirm-1.lua``) gives the claim its full lifetime once the
  message is published: the publisher claims with a short provisional one (at most
  ``lease_ttl``), so the claim of a publisher that died before its publish lapses soon instead
  of folding requests onto nothing;
- the execution's acquire clears it when the lease is granted to the task id it names
  (``lease/acquire-4.lua``: :func:`celery_lease.store.acquire` with ``claimed=True``), in the
  same script;
- :func:`unclaim` (``dedupe/unclaim-1.lua``) removes it when its message will not run (its publish
  failed, it was revoked or expired, it ended on a conflict); otherwise it lapses at its
  lifetime.

With ``lease_min_replicas`` above 0 a decision, a claim or a refusal, counts only once that
many replicas acknowledged it (``WAIT`` in the same round trip,
:mod:`celery_lease.store.replicated`): a claim a failover loses leaves the new primary without
it, and the copy's grant there cannot clear the old one; a refusal answered by a primary that
lost its replicas (a planned failover's promotion window, before the sentinels name the
promoted one) can name a copy whose grant the new primary saw, or whose claim it never had.

Every change is checked against the task id the claim names, as a lease's against its token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import RedisError

from ..base.keys import claim_key
from . import lua, primary, replicated, routing
from .value import _holder_fields

__all__ = ["Claim", "Decision", "claim", "confirm_claim", "parse_claim", "unclaim"]

_claim = lua.load("dedupe/claim-2.lua")
_unclaim = lua.load("dedupe/unclaim-1.lua")
_confirm = lua.load("dedupe/confirm-1.lua")


@dataclass(frozen=True)
class Decision:
    """What :func:`claim` decided for one publish.

    Attributes:
        claimed: True when the message is to be published (its task id holds the claim now).
        task_id: the waiting copy's task id when not claimed (publish nothing), else ``""``.
        age: the waiting copy's claim age, float seconds on the store's clock (0.0 when
            claimed).
        foreign: empty, or what the claim key holds that celery-lease did not write (then
            ``claimed`` is False and ``task_id`` empty: publish without a claim).
    """

    claimed: bool
    task_id: str = ""
    age: float = 0.0
    foreign: str = ""


def claim(
    client: redis.Redis,
    key: str,
    task_id: str,
    lifetime_ms: int,
    claimer: str,
    take_over: bool = False,
    min_replicas: int = 0,
) -> Decision:
    """Claim lease ``key``'s waiting slot for the message ``task_id`` about to be published, for
    ``lifetime_ms`` (int milliseconds), unless another copy is waiting. One round trip.

    A claim naming ``task_id`` already (a retry or redelivery of the waiting copy) is claimed
    again with the new lifetime; one naming the lease's current holder is stale and claimed
    over.

    Args:
        claimer: the publisher's JSON (:func:`celery_lease.store.holder_json` with the
            message's task id).
        take_over: claim whoever holds the slot (a message the holder publishes for its own
            key, or a message published again under its own task id).
        min_replicas: ``lease_min_replicas``: a claim or a refusal counts once that many
            replicas acknowledged it (``WAIT`` in the same round trip; 0: no ``WAIT``).

    Raises:
        NotReplicated: fewer than ``min_replicas`` replicas acknowledged the claim (it was
            taken back, best effort: otherwise it lapses at its lifetime) or the refusal.
        PrimaryUnconfirmed: a Sentinel-managed client's refusal the sentinels did not confirm
            came from the primary they name now (:mod:`celery_lease.store.primary`).
        redis.exceptions.RedisError: on store errors (the node noted for
            :func:`celery_lease.store.describe`).
    """
    keys = (claim_key(key), key)
    confirmed = primary.managed(client)  # a Sentinel-managed client
    before = primary.written_to(client) if confirmed else None
    try:
        argv = (task_id, lifetime_ms, claimer, "1" if take_over else "0")
        if min_replicas > 0:
            claimed, answer, age = _replicated(client, keys, argv, min_replicas)
        else:
            claimed, answer, age = _claim(client, keys, argv)
        # A refusal read off a demoted primary (a replica since a failover, still answering
        # reads on an old connection) can name a copy whose grant on the new primary cleared
        # the claim: a lost trigger. On Sentinel it counts only once the sentinels confirm the
        # node (primary.py); else it is a store error, and the message is published unguarded.
        problem = primary.confirm(client, before) if confirmed and int(claimed) == 0 else None
    except RedisError as exc:
        raise routing.note(exc, client, key) from None
    if problem is not None:
        raise routing.note(problem, client, key)
    text = answer.decode() if isinstance(answer, bytes) else str(answer)
    if int(claimed) == 1:
        return Decision(True)
    if int(claimed) == 2:
        return Decision(False, foreign=text)
    return Decision(False, text, int(age) / 1000)


def _replicated(
    client: redis.Redis, keys: tuple[str, str], argv: tuple[Any, ...], min_replicas: int
) -> Any:
    """The claim script with ``WAIT min_replicas`` in its round trip; a claim or a refusal
    fewer replicas acknowledged raises, a claim taken back first (its task id is argv[0])."""
    return replicated.counted(
        _claim,
        client,
        keys,
        argv,
        min_replicas,
        lambda reply: int(reply[0]) != 2,  # a foreign value decides nothing: no claim
        lambda reply: int(reply[0]) == 1 and _unclaim(client, keys[:1], argv[:1]),
        "dedupe decision",
    )


def unclaim(client: redis.Redis, key: str, task_id: str) -> bool:
    """Remove lease ``key``'s claim while it names ``task_id`` (a message that will not run).
    Returns True when it was removed.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    try:
        return bool(_unclaim(client, (claim_key(key),), (task_id,)))
    except RedisError as exc:
        raise routing.note(exc, client, key) from None


def confirm_claim(client: redis.Redis, key: str, task_id: str, lifetime_ms: int) -> bool:
    """Give lease ``key``'s claim its full lifetime, ``lifetime_ms`` (int milliseconds counted
    from when it was claimed), once its message ``task_id`` is published; only while the claim
    names ``task_id`` (one cleared by its grant, removed or lapsed is not written again).
    Returns True when it was extended.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    try:
        return bool(_confirm(client, (claim_key(key),), (task_id, lifetime_ms)))
    except RedisError as exc:
        raise routing.note(exc, client, key) from None


@dataclass(frozen=True)
class Claim:
    """A claim as stored (``celery lease ls``, ``doctor``).

    Attributes:
        task_name: the task's name (str).
        task_id: the waiting copy's task id (str).
        hostname: the host that published it (str).
        pid: the publishing process (int).
        claimed_at: the store's clock when it was claimed, epoch float seconds.
        lifetime: the lifetime it was given, float seconds.
    """

    task_name: str
    task_id: str
    hostname: str
    pid: int
    claimed_at: float
    lifetime: float


def parse_claim(value: Any) -> Claim | None:
    """The :class:`Claim` a stored value spells, or None when celery-lease did not write it;
    never raises."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return None
    at, _, rest = value.partition(":")
    lifetime, _, meta = rest.partition(":")
    if not (at.isascii() and at.isdigit() and lifetime.isascii() and lifetime.isdigit()):
        return None
    info = _holder_fields(meta)
    if info is None:
        return None
    task, task_id, host, pid, _ = info
    return Claim(task, task_id, host, pid, int(at) / 1e6, int(lifetime) / 1000)
