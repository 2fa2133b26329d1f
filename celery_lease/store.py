"""The lease protocol on Redis: acquire, renew, release.

Stored value of a lease key: ``<token>:<fencing token>:<holder JSON>``
(:mod:`celery_lease.holder`). The token (32 hex characters, unique per execution) is what
every conditional operation compares; the rest is there for the holder's successors and for
operators (``celery lease ls``).

- Acquire is one script, one round trip: a conditional create with its lifetime in the same
  ``SET ... NX PX`` write, which also issues the fencing token. A conflict returns the
  holder's value and remaining lifetime in the same reply. Retrying an acquire whose reply was
  lost finds its own token and is granted again (no phantom lease).
- Renew sets the lifetime back to the TTL (``PEXPIRE``: sets, never adds) only while the token
  matches. Release deletes only while the token matches. Both are safe to repeat.
- The fencing token is ``max(previous + 1, server time in microseconds)``: strictly increasing
  per key across every grant, even when the counter key was evicted or the server restarted
  empty (as long as the server clock does not step back further than the counter lifetime),
  and across a failover that lost the counter (as long as the new primary's clock is not
  behind the old one's by more than the failover took; docs/deploying.md, Sentinel).
- Checks come before writes in every script, and the only write that can be refused under
  ``maxmemory`` (``SET``) is the first write, so a script never leaves a key without a lifetime.
  ``PEXPIRE`` and ``DEL`` are not refused under OOM, so renewals and releases keep working.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import (
    AskError,
    MovedError,
    NoScriptError,
    RedisError,
)

from . import connection, routing, wire
from .holder import Holder, holder_json, parse_value
from .keys import fence_key, wake_key

__all__ = [
    "AcquireResult",
    "Holder",
    "NotReplicated",
    "acquire",
    "client_for",
    "holder_json",
    "parse_value",
    "release",
    "release_and_wake",
    "renew_many",
    "revoke",
    "wait_for_release",
]

TOKEN_LENGTH = 32
# The fencing counter outlives its lease by an hour: across a longer gap the server clock
# (microseconds) alone keeps fencing tokens increasing, and per-argument keys do not pile up.
FENCE_COUNTER_EXTRA_MS = 3600 * 1000

# The token prefix test that every script shares: "<token>:" at the start of the value.
_HELD = "local cur = redis.call('GET', KEYS[1])\n" \
        "local mine = cur and string.sub(cur, 1, #ARGV[1] + 1) == ARGV[1] .. ':'\n"

ACQUIRE_LUA = "if redis.replicate_commands then redis.replicate_commands() end\n" + _HELD + """
if cur then
  return {mine and 1 or 0, cur, redis.call('PTTL', KEYS[1])}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = redis.call('GET', KEYS[2]) or ''
local fence = (tonumber(string.match(last, '^%d+')) or 0) + 1
if now > fence then fence = now end
fence = string.format('%.0f', fence)
local value = ARGV[1] .. ':' .. fence .. ':' .. ARGV[3]
redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2])
-- The last release's token stays, after ';' (not ':': released_last no longer names it),
-- for a repeat of that release sent after its reply was lost (see _RELEASED_BEFORE).
local ended = string.match(last, '^%d+:(.+)$')
redis.call('SET', KEYS[2], ended and (fence .. ';' .. ended) or fence, 'PX', ARGV[4])
return {1, fence, tonumber(ARGV[2])}
"""

RENEW_LUA = _HELD + """
if mine then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if cur then return -1 end
return 0
"""

# Many renewals in one script call (one primary only: a cluster's keys live on several). One
# character per lease in the reply ('1' renewed, '0' absent, '2' held by another token), so the
# client parses one string instead of thousands of replies.
RENEW_MANY_LUA = """
local ttl, out = ARGV[1], {}
for i, key in ipairs(KEYS) do
  local cur, held = redis.call('GET', key), ARGV[i + 1]  -- held: '<token>:'
  if cur and string.sub(cur, 1, #held) == held then
    redis.call('PEXPIRE', key, ttl)
    out[i] = '1'
  else
    out[i] = cur and '2' or '0'
  end
end
return table.concat(out)
"""
#: Leases per call of the batch renewal script: Redis runs one script at a time, so a call
#: for 1 000 keys (about a millisecond) delays other clients by no more than that.
RENEW_BATCH = 1000

# A release sent again after a broken connection (its first reply may have been lost after the
# script ran) answers 1 when the counter names this token as the last to end (':'), or as the
# last to end before the latest grant (';': a waiting hold woken by that release may have
# been granted the key before the repeat arrives): the token is random, so only its own
# earlier release wrote it there.
_RELEASED_BEFORE = """
local last = redis.call('GET', KEYS[2])
local tail = last and string.sub(last, -#ARGV[1] - 1)
if tail == ':' .. ARGV[1] or tail == ';' .. ARGV[1] then return 1 end
return 0
"""

# Who finished last (for released_last and a repeated release), noted beside the counter;
# pcall: not needed enough to fail a release under OOM. A counter that lapsed (a lease renewed
# for longer than TTL + 1 h) is noted as '0': the next grant's fencing token then comes from
# the server clock, as it would without the key.
_NOTE_ENDED = """
  local counter = string.match(redis.call('GET', KEYS[2]) or '', '^%d+')
  if counter then
    redis.pcall('SET', KEYS[2], counter .. ':' .. ARGV[1], 'KEEPTTL')
  else
    redis.pcall('SET', KEYS[2], '0:' .. ARGV[1], 'PX', """ + str(FENCE_COUNTER_EXTRA_MS) + """)
  end
"""

RELEASE_LUA = _HELD + """
if mine then
  redis.call('DEL', KEYS[1])
""" + _NOTE_ENDED + """  return 1
end
""" + _RELEASED_BEFORE


# An operator's release (``celery lease release``): the same token check, but the holder did
# not end, so nothing records its token as the last to end (a redelivered message of the
# holder would be taken for finished, and the holder's own release for a success).
REVOKE_LUA = _HELD + """
if mine then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

# The release of a hold (celery_lease.hold): the same release, then one "free" element in the
# key's wake list for a waiting hold's BLPOP. A separate script, so a task's release costs
# nothing more. DEL first: the list holds at most one element (one waiter woken per release;
# it passes the turn on with its own release). pcall: a wake refused under OOM only leaves
# the waiters to their fallback, the holder's expiry.
RELEASE_WAKE_LUA = _HELD + """
if mine then
  redis.call('DEL', KEYS[1])
""" + _NOTE_ENDED + """  redis.call('DEL', KEYS[3])
  redis.pcall('RPUSH', KEYS[3], '1')
  redis.pcall('PEXPIRE', KEYS[3], ARGV[2])
  return 1
end
""" + _RELEASED_BEFORE

# How long a wake element waits for a waiter, int milliseconds: long enough for a waiter
# between its refused acquire and its BLPOP; a stale one costs a later waiter one acquire.
WAKE_LIFETIME_MS = 2000


_acquire = wire.Script(ACQUIRE_LUA)
_renew = wire.Script(RENEW_LUA)
_release = wire.Script(RELEASE_LUA)
_release_wake = wire.Script(RELEASE_WAKE_LUA)
_revoke = wire.Script(REVOKE_LUA)
_renew_many = wire.Script(RENEW_MANY_LUA)
_BATCH_REPLY = {ord("1"): 1, ord("0"): 0, ord("2"): -1}


def client_for(url: str, timeout: float, options: Any = None) -> redis.Redis:
    """The process-wide client: see :func:`celery_lease.connection.client_for`."""
    return connection.client_for(url, timeout, options)  # type: ignore[no-any-return]


reset_clients = connection.reset_clients


class NotReplicated(RedisError):
    """A grant was not acknowledged by ``min_replicas`` replicas within the store timeout.

    The grant was released again (best effort; otherwise it lapses with its TTL). A
    :class:`redis.exceptions.RedisError`, so callers treat it as any store error: the task
    body does not run (``lease_on_store_error`` decides what happens instead).
    """


def describe(error: BaseException) -> str:
    """``"ErrorType: message (on <topology and node>)"`` for logs and errors.

    redis-py 8's ``repr`` of a server error drops the message; the node is the one noted by the
    store function that got the error (:func:`celery_lease.routing.where`), if any.
    """
    text = f"{type(error).__name__}: {error}"
    node = getattr(error, "lease_store_where", None)
    return f"{text} (on {node})" if node else text


@dataclass(frozen=True)
class AcquireResult:
    """What an acquire found.

    Attributes:
        granted: True when this token holds the lease now.
        holder: the holder (this token when granted).
        remaining: the lifetime left on the server, float seconds.
    """

    granted: bool
    holder: Holder
    remaining: float


def acquire(client: redis.Redis, key: str, token: str, ttl_ms: int, holder: str,
            min_replicas: int = 0) -> AcquireResult:
    """Take lease ``key`` for ``token`` with lifetime ``ttl_ms`` (int milliseconds).

    One round trip (two when the server lost its script cache). Safe to repeat with the same
    token after an ambiguous failure: the repeat is granted with the same fencing token.

    Args:
        min_replicas: int; when above 0, ``WAIT min_replicas`` goes in the same round trip
            (a pipeline on the key's primary) and a grant counts only once that many replicas
            acknowledged it. ``WAIT`` waits at most half the client's socket timeout (the store
            timeout), so its reply arrives before the socket gives up.

    Raises:
        NotReplicated: fewer than ``min_replicas`` replicas acknowledged the grant in time;
            the grant was released again.
        redis.exceptions.RedisError: connection problems, timeouts, OOM and other store errors
            (with :func:`where` noted for :func:`describe`).
    """
    keys, argv = (key, fence_key(key)), (token, ttl_ms, holder, ttl_ms + FENCE_COUNTER_EXTRA_MS)
    try:
        if min_replicas > 0:
            granted, value, pttl = _acquire_replicated(client, keys, argv, min_replicas)
        else:
            granted, value, pttl = _acquire(client, keys, argv)
    except RedisError as exc:
        raise routing.note(exc, client, key) from None
    if granted and b":" not in value:  # a fresh grant answers with the fencing token alone
        return AcquireResult(True, Holder(token, int(value)), ttl_ms / 1000)
    return AcquireResult(bool(granted), parse_value(value), max(int(pttl), 0) / 1000)


def _acquire_replicated(client: Any, keys: tuple[str, str], argv: tuple[Any, ...],
                        min_replicas: int) -> Any:
    """The acquire script and ``WAIT`` in one pipeline on the primary that owns the key."""
    node = routing.owner(client, keys[0])  # WAIT counts the writes of its own connection
    timeout = node.connection_pool.connection_kwargs.get("socket_timeout") or 1.0
    wait_ms = max(1, int(timeout * 1000 / 2))

    def send(script: tuple[Any, ...]) -> list[Any]:
        pipe = node.pipeline(transaction=False)
        pipe.execute_command(*script)
        pipe.execute_command("WAIT", min_replicas, wait_ms)
        return pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]

    found, acked = send(_acquire.args(keys, argv))
    if isinstance(found, NoScriptError):
        found, acked = send(("EVAL", _acquire.source, len(keys), *keys, *argv))
    if isinstance(found, MovedError) and routing.is_cluster(client):
        client.nodes_manager.initialize()  # the slot moved (a resharding): ask its new owner
        return _acquire_replicated(client, keys, argv, min_replicas)
    if isinstance(found, Exception):
        raise found
    granted = found[0]
    if granted and (isinstance(acked, Exception) or int(acked) < min_replicas):
        try:
            _release(client, keys, (argv[0],))
        except RedisError:
            pass  # it lapses with its TTL; nobody ran under it
        if isinstance(acked, Exception):
            raise acked
        raise NotReplicated(f"WAIT {min_replicas}: only {acked} replica(s) acknowledged the "
                            f"grant within {wait_ms} ms (lease_min_replicas); released")
    return found


def release(client: redis.Redis, key: str, token: str) -> bool:
    """Delete lease ``key`` if ``token`` still holds it. Returns True when it was deleted, by
    this call or by an earlier release of ``token`` (so a release sent again after a broken
    connection, whose first reply may be lost after the script ran, still answers True; also
    once a later holder was granted the key, until that holder released it in turn).

    A release also notes ``token`` as the last execution that ended with this key (beside the
    fencing counter), for :func:`released_last`.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    try:
        return bool(_release(client, (key, fence_key(key)), (token,)))
    except RedisError as exc:
        raise routing.note(exc, client, key) from None


def revoke(client: redis.Redis, key: str, token: str) -> bool:
    """Take lease ``key`` away from the holder ``token`` (an operator's release): delete it if
    ``token`` still holds it. Returns True when it was deleted.

    Unlike :func:`release` it does not note ``token`` as having ended: the holder finds the
    loss at its next renewal (``LeaseLost``, cause ``refused``) and at its own release
    (``released=False``), and a redelivered message of it is run again.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    try:
        return bool(_revoke(client, (key,), (token,)))
    except RedisError as exc:
        raise routing.note(exc, client, key) from None


def release_and_wake(client: redis.Redis, key: str, token: str) -> bool:
    """:func:`release`, and wake one hold waiting for ``key`` (:func:`wait_for_release`).

    Used by holds only (their keys are never a task's), so a task's release is unchanged.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    keys = (key, fence_key(key), wake_key(key))
    try:
        return bool(_release_wake(client, keys, (token, WAKE_LIFETIME_MS)))
    except RedisError as exc:
        raise routing.note(exc, client, key) from None


def wait_for_release(client: redis.Redis, key: str, timeout: float) -> bool:
    """Block up to ``timeout`` float seconds (at least 1 ms) for a release of ``key`` by
    :func:`release_and_wake`. Returns True when woken by one, False on the timeout.

    ``client`` must time out later than ``timeout`` (a client of its own for waiting).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    try:
        return client.blpop([wake_key(key)], max(timeout, 0.001)) is not None
    except RedisError as exc:
        raise routing.note(exc, client, key) from None


def released_last(client: redis.Redis, key: str, token: str) -> bool:
    """True when ``token`` was the last holder of ``key`` to release it (it ended normally).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    value = client.get(fence_key(key))
    if isinstance(value, bytes):
        value = value.decode()
    return isinstance(value, str) and value.partition(":")[2] == token


def renew_many(
    client: redis.Redis, leases: Sequence[tuple[str, str, int]]
) -> list[int | RedisError]:
    """Renew many leases in one round trip per primary (a pipeline of conditional renewals).

    With a :class:`redis.cluster.RedisCluster` client, redis-py's cluster pipeline groups the
    renewals by the node that owns each key's slot: one round trip per primary, all written
    before any reply is read. A renewal answered ``MOVED``/``ASK`` (its slot is moving) is sent
    again to the owner alone; Redis runs a script only where the key's slot is served, so a
    lease is never renewed on a node that no longer owns it.

    Args:
        leases: ``(key, token, ttl_ms)`` triples.

    Returns:
        One entry per lease: ``1`` renewed, ``0`` key absent, ``-1`` held by another token, or
        the :class:`RedisError` that lease's command got (:func:`describe` names its node).

    Raises:
        redis.exceptions.RedisError: the round trip itself failed (connection, timeout).
    """
    if not routing.is_cluster(client):
        return _renew_batched(client, leases)
    commands = [_renew.args((key,), (token, ttl_ms)) for key, token, ttl_ms in leases]
    try:
        replies = routing.send_many(client, commands)
        stale = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if stale:
            # A server restarted, failed over or flushed its scripts: only the renewals it
            # refused go again, as EVAL (which caches the script there), to their own primary.
            # Not SCRIPT LOAD on every primary: on a cluster with a primary down it stops at
            # that one, and the primaries after it would never get the script back.
            again = routing.send_many(client, [_renew.args((leases[i][0],), leases[i][1:],
                                                            by_sha=False) for i in stale])
            for i, reply in zip(stale, again, strict=True):
                replies[i] = reply
    except RedisError as exc:
        raise routing.note(exc, client, None) from None
    out: list[int | RedisError] = []
    for (key, token, ttl_ms), reply in zip(leases, replies, strict=True):
        if isinstance(reply, (MovedError, AskError)):
            try:  # redis-py follows the redirection (ASKING first for ASK)
                reply = _renew(client, (key,), (token, ttl_ms))
            except RedisError as exc:
                reply = exc
        out.append(routing.note(reply, client, key) if isinstance(reply, RedisError)
                   else int(reply))
    return out


def _renew_batched(client: redis.Redis, leases: Sequence[tuple[str, str, int]]
                   ) -> list[int | RedisError]:
    """:func:`renew_many` on one primary: the batch script, per TTL and per
    :data:`RENEW_BATCH` leases, all calls in one pipeline (one round trip)."""
    order: dict[int, list[int]] = {}
    for i, (_, _, ttl_ms) in enumerate(leases):
        order.setdefault(ttl_ms, []).append(i)
    chunks = [(ttl_ms, idx[at:at + RENEW_BATCH])
              for ttl_ms, idx in order.items() for at in range(0, len(idx), RENEW_BATCH)]
    calls = [([leases[i][0] for i in chunk], [ttl_ms, *(leases[i][1] + ":" for i in chunk)])
             for ttl_ms, chunk in chunks]
    send = functools.partial(wire.call_many if wire.usable(client) else routing.send_many,
                             client)
    try:
        replies = send([_renew_many.args(keys, argv) for keys, argv in calls])
        if any(isinstance(r, NoScriptError) for r in replies):
            # The server lost its scripts: EVAL caches the script again (not SCRIPT LOAD,
            # which the minimal ACL in docs/deploying.md does not grant).
            replies = send([_renew_many.args(keys, argv, by_sha=False) for keys, argv in calls])
    except RedisError as exc:
        raise routing.note(exc, client, None) from None
    out: list[int | RedisError] = [0] * len(leases)
    for (_, chunk), reply in zip(chunks, replies, strict=True):
        if isinstance(reply, RedisError):  # e.g. OOM, BUSY: every lease of the call got it
            for i in chunk:
                out[i] = routing.note(reply, client, leases[i][0])
            continue
        for i, code in zip(chunk, reply, strict=True):
            out[i] = _BATCH_REPLY[code]
    return out
