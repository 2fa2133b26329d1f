"""Renewal: many leases in one round trip per primary.

A standalone or Sentinel client renews with ``scripts/lease/renew_many.lua``, up to
:data:`RENEW_BATCH` leases per call, every call of a pass in one pipeline; a cluster client
with ``scripts/lease/renew-1.lua`` per lease, grouped by the primary that owns each key's slot
(:func:`celery_lease.store.routing.send_many`). A renewal sets the lifetime back to the TTL
(``PEXPIRE``: sets, never adds) only while the token matches, so it is safe to repeat. The
slots of limited keys (``lease_limit``, :mod:`.slots`) go in the same round trip, with scripts
of their own (``slots/renew_slots.lua``, ``slots/renew_slot-1.lua``): only the token's own
deadline moves.

A renewal counts only where it is known to survive a failover: with ``min_replicas`` above 0
each primary's renewals are followed by ``WAIT`` on the same connection, and one that fewer
replicas acknowledged does not count (a primary cut off from its replicas, or whose replica
was promoted, goes on accepting writes that the new primary never sees); through a Sentinel
client, the sentinels must confirm that the renewals landed on the primary they name now
(:mod:`celery_lease.store.primary`).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence

import redis
from redis.exceptions import AskError, MovedError, NoScriptError, RedisError

from . import lua, primary, routing, wire
from .errors import NotReplicated

__all__ = ["RENEW_BATCH", "renew_many"]

#: Leases per call of the batch renewal script: Redis runs one script at a time, so a call
#: for 1 000 keys (about a millisecond) delays other clients by no more than that.
RENEW_BATCH = 1000

_renew = lua.load("lease/renew-1.lua")
_renew_many = lua.load("lease/renew_many.lua")
_renew_slot = lua.load("slots/renew_slot-1.lua")
_renew_slots = lua.load("slots/renew_slots.lua")
_BATCH_REPLY = {ord("1"): 1, ord("0"): 0, ord("2"): -1}


def renew_many(
    client: redis.Redis,
    leases: Sequence[tuple[str, str, int]],
    min_replicas: int = 0,
    slots: Collection[int] = (),
) -> list[int | RedisError]:
    """Renew many leases in one round trip per primary (a pipeline of conditional renewals).

    With a :class:`redis.cluster.RedisCluster` client, redis-py's cluster pipeline groups the
    renewals by the node that owns each key's slot: one round trip per primary, all written
    before any reply is read. A renewal answered ``MOVED``/``ASK`` (its slot is moving) is sent
    again to the owner alone; Redis runs a script only where the key's slot is served, so a
    lease is never renewed on a node that no longer owns it.

    Args:
        leases: ``(key, token, ttl_ms)`` triples.
        min_replicas: int; when above 0, a renewal counts only once that many replicas of its
            primary acknowledged it (``WAIT`` in the same round trip, at most half the store
            timeout); one that fewer acknowledged is a :class:`NotReplicated` entry.
        slots: the indexes in ``leases`` of slots of limited keys (``lease_limit``), renewed
            by their own scripts in the same round trip.

    Returns:
        One entry per lease: ``1`` renewed, ``0`` key absent, ``-1`` held by another token, or
        the :class:`RedisError` that lease's command got (its node named by
        :func:`celery_lease.store.errors.describe`): :class:`NotReplicated`, or
        :class:`~celery_lease.store.errors.PrimaryUnconfirmed` for every renewal of a
        Sentinel client that the sentinels did not confirm.

    Raises:
        redis.exceptions.RedisError: the round trip itself failed (connection, timeout).
    """
    before = primary.written_to(client)
    slots = frozenset(slots)
    if min_replicas > 0:
        out = _renew_replicated(client, leases, min_replicas, slots)
    elif not routing.is_cluster(client):
        out = _renew_batched(client, leases, slots)
    else:
        out = _renew_cluster(client, leases, slots)
    if before is not None and 1 in out:
        problem = primary.confirm(client, before)
        if problem is not None:
            out = [
                routing.note(problem, client, key) if reply == 1 else reply
                for (key, _, _), reply in zip(leases, out, strict=True)
            ]
    return out


def _one(slots: frozenset[int], i: int) -> lua.Script:
    """The script that renews lease ``i`` alone: ``slots/renew_slot-1.lua`` for a slot."""
    return _renew_slot if i in slots else _renew


def _renew_cluster(
    client: redis.Redis, leases: Sequence[tuple[str, str, int]], slots: frozenset[int]
) -> list[int | RedisError]:
    """:func:`renew_many` on a cluster: ``lease/renew-1.lua`` per lease, one round trip per
    primary."""
    commands = [
        _one(slots, i).args((key,), (token, ttl_ms))
        for i, (key, token, ttl_ms) in enumerate(leases)
    ]
    try:
        replies = routing.send_many(client, commands)
        stale = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if stale:
            # A server restarted, failed over or flushed its scripts: only the renewals it
            # refused go again, as EVAL (which caches the script there), to their own primary.
            # Not SCRIPT LOAD on every primary: on a cluster with a primary down it stops at
            # that one, and the primaries after it would never get the script back.
            again = routing.send_many(
                client,
                [_one(slots, i).args((leases[i][0],), leases[i][1:], by_sha=False) for i in stale],
            )
            for i, reply in zip(stale, again, strict=True):
                replies[i] = reply
    except RedisError as exc:
        raise routing.note(exc, client, None) from None
    out: list[int | RedisError] = []
    for i, ((key, token, ttl_ms), reply) in enumerate(zip(leases, replies, strict=True)):
        if isinstance(reply, (MovedError, AskError)):
            try:  # redis-py follows the redirection (ASKING first for ASK)
                reply = _one(slots, i)(client, (key,), (token, ttl_ms))
            except RedisError as exc:
                reply = exc
        out.append(
            routing.note(reply, client, key) if isinstance(reply, RedisError) else int(reply)
        )
    return out


#: A batched pass's plan: per call of a batch script, ``(ttl_ms, slot, indexes)`` (the leases
#: it renews, by index in ``leases``) and the call itself, ``(script, keys, argv)``.
_Chunks = list[tuple[int, bool, Sequence[int]]]
_Calls = list[tuple[lua.Script, list[str], list[object]]]


def _renew_batched(
    client: redis.Redis, leases: Sequence[tuple[str, str, int]], slots: frozenset[int]
) -> list[int | RedisError]:
    """:func:`renew_many` on one primary: the batch script, per TTL and per
    :data:`RENEW_BATCH` leases (slots apart, ``slots/renew_slots.lua``), all calls in one pipeline
    (one round trip)."""
    ttls = {ttl_ms for _, _, ttl_ms in leases}
    if len(ttls) == 1 and not slots:  # the usual pass: one TTL, in order, no sorting
        chunks, calls = _in_order(leases, ttls.pop())
    else:
        chunks, calls = _grouped(leases, slots)
    send = functools.partial(wire.call_many if wire.usable(client) else routing.send_many, client)
    try:
        replies = send([script.args(keys, argv) for script, keys, argv in calls])
        if any(isinstance(r, NoScriptError) for r in replies):
            # The server lost its scripts: EVAL caches the script again (not SCRIPT LOAD,
            # which the minimal ACL in docs/deploying.md does not grant).
            replies = send([script.args(keys, argv, by_sha=False) for script, keys, argv in calls])
    except RedisError as exc:
        raise routing.note(exc, client, None) from None
    return _batch_answers(client, leases, chunks, replies)


def _in_order(leases: Sequence[tuple[str, str, int]], ttl_ms: int) -> tuple[_Chunks, _Calls]:
    """The plan of a pass whose leases all have ``ttl_ms`` (int milliseconds) and none is a
    slot: ``renew_many.lua`` over consecutive spans of :data:`RENEW_BATCH` leases, whose
    replies land in order (one slice each)."""
    spans = [
        range(at, min(at + RENEW_BATCH, len(leases))) for at in range(0, len(leases), RENEW_BATCH)
    ]
    chunks: _Chunks = [(ttl_ms, False, span) for span in spans]
    calls: _Calls = [
        (
            _renew_many,
            [key for key, _, _ in leases[span.start : span.stop]],
            [ttl_ms, *[token + ":" for _, token, _ in leases[span.start : span.stop]]],
        )
        for span in spans
    ]
    return chunks, calls


def _grouped(
    leases: Sequence[tuple[str, str, int]], slots: frozenset[int]
) -> tuple[_Chunks, _Calls]:
    """The plan of any other pass: the leases grouped by TTL and by kind (a slot of a limited
    key, renewed by ``renew_slots.lua``, or a plain lease), each group in calls of at most
    :data:`RENEW_BATCH`."""
    order: dict[tuple[int, bool], list[int]] = {}
    for i, (_, _, ttl_ms) in enumerate(leases):
        order.setdefault((ttl_ms, i in slots), []).append(i)
    chunks: _Chunks = [
        (ttl_ms, slot, idx[at : at + RENEW_BATCH])
        for (ttl_ms, slot), idx in order.items()
        for at in range(0, len(idx), RENEW_BATCH)
    ]
    calls: _Calls = [
        (
            _renew_slots if slot else _renew_many,
            [leases[i][0] for i in chunk],
            [ttl_ms, *(leases[i][1] if slot else leases[i][1] + ":" for i in chunk)],
        )
        for ttl_ms, slot, chunk in chunks
    ]
    return chunks, calls


def _batch_answers(
    client: redis.Redis,
    leases: Sequence[tuple[str, str, int]],
    chunks: _Chunks,
    replies: Sequence[bytes | RedisError],
) -> list[int | RedisError]:
    """Each lease's answer from the replies of its pass's calls, one per chunk: a call's error
    for each of its leases (node noted), else the lease's byte in the reply (``1``, ``0``,
    ``2``: renewed, absent, held by another token)."""
    out: list[int | RedisError] = [0] * len(leases)
    for (_, _, chunk), reply in zip(chunks, replies, strict=True):
        if isinstance(reply, RedisError):  # e.g. OOM, BUSY: every lease of the call got it
            for i in chunk:
                out[i] = routing.note(reply, client, leases[i][0])
            continue
        if isinstance(chunk, range) and len(reply) == len(chunk):  # in order: one slice
            out[chunk.start : chunk.stop] = map(_BATCH_REPLY.__getitem__, reply)
            continue
        for i, code in zip(chunk, reply, strict=True):
            out[i] = _BATCH_REPLY[code]
    return out


def _renew_replicated(
    client: redis.Redis,
    leases: Sequence[tuple[str, str, int]],
    min_replicas: int,
    slots: frozenset[int],
) -> list[int | RedisError]:
    """:func:`renew_many` with ``WAIT``: per primary, its renewals and then ``WAIT
    min_replicas`` in one pipeline on one connection (``WAIT`` counts that connection's
    writes)."""
    out: list[int | RedisError] = [0] * len(leases)
    by_node: dict[int, tuple[object, list[int]]] = {}
    for i, (key, _, _) in enumerate(leases):
        try:
            node = routing.owner(client, key)
        except RedisError as exc:
            out[i] = routing.note(exc, client, key)
            continue
        by_node.setdefault(id(node), (node, []))[1].append(i)
    for node, indexes in by_node.values():
        wait_ms = routing.wait_ms(node)

        def send(
            by_sha: bool, node: object = node, indexes: list[int] = indexes, wait_ms: int = wait_ms
        ) -> list[object]:
            pipe = node.pipeline(transaction=False)  # type: ignore[attr-defined]
            for i in indexes:
                key, token, ttl_ms = leases[i]
                pipe.execute_command(*_one(slots, i).args((key,), (token, ttl_ms), by_sha=by_sha))
            pipe.execute_command("WAIT", min_replicas, wait_ms)
            return pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]

        try:
            *replies, acked = send(True)
            if any(isinstance(r, NoScriptError) for r in replies):
                *replies, acked = send(False)  # EVAL caches the script again
        except RedisError as exc:
            if not routing.is_cluster(client):
                raise routing.note(exc, client, None) from None
            replies, acked = [exc] * len(indexes), 0  # one unreachable primary: its leases only
        if routing.is_cluster(client) and any(
            isinstance(r, (MovedError, AskError)) for r in replies
        ):
            client.nodes_manager.initialize()  # type: ignore[attr-defined]  # a slot moved
        short = isinstance(acked, Exception) or int(acked) < min_replicas  # type: ignore[call-overload]
        for i, reply in zip(indexes, replies, strict=True):
            key = leases[i][0]
            if isinstance(reply, RedisError):
                out[i] = routing.note(reply, client, key)
            elif int(reply) == 1 and short:  # type: ignore[call-overload]
                out[i] = routing.note(
                    NotReplicated(
                        f"WAIT {min_replicas}: only {acked} replica(s) acknowledged the renewal "
                        f"within {wait_ms} ms (lease_min_replicas): it does not count"
                    ),
                    client,
                    key,
                )
            else:
                out[i] = int(reply)  # type: ignore[call-overload]
    return out
