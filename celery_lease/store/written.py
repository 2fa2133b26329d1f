"""An acquire written ahead of its reply: sent when a worker's pool accepts a request, its reply
read when the execution reaches the lease (:mod:`celery_lease.execution.accepted`).

Between the two, Celery records the start, sends ``task-started`` when events are on and runs
its tracer's set-up: the acquire's round trip overlaps them instead of adding a wait of its own
after them. The script and its reply are :func:`celery_lease.store.acquire`'s; only when the
reply is read differs. Until then the connection stays out of the free list
(:mod:`celery_lease.store.wire`), as a release written without waiting does
(:mod:`celery_lease.store.pending`), so no other caller is handed a connection with an unread
reply. A server that lost its script cache answers ``NOSCRIPT`` without running the script;
the acquire is then sent with its source when the reply is read.

Only a standalone client takes this path (:func:`celery_lease.store.wire.usable`), and only for
a plain acquire: a Sentinel-managed grant must be confirmed by the sentinels, and one with
``lease_min_replicas`` waits for replicas, both in their own round trips.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import Any

import redis
from redis.exceptions import RedisError

from ..base import clock
from . import lua, pending, protocol, routing, value, wire
from .errors import describe

__all__ = ["WrittenAcquire", "abandon_stale", "keep", "take", "write"]

logger = logging.getLogger("celery_lease")

_ACQUIRE = lua.load("lease/acquire-4.lua")


class WrittenAcquire:
    """An acquire of lease ``key`` for ``token`` written to ``conn``, its reply not read yet.

    Attributes:
        client: the store's client the connection belongs to.
        key: the lease key (str).
        token: the token the acquire asks the key for (str, 32 hex characters).
        ttl_ms: the lifetime asked for, int milliseconds.
        sent_at: the :func:`celery_lease.base.clock.now` time the acquire was written (float
            seconds): a grant's local deadline counts from it.
    """

    __slots__ = ("_call", "client", "conn", "key", "sent_at", "token", "ttl_ms")

    def __init__(
        self,
        client: Any,
        conn: Any,
        key: str,
        token: str,
        ttl_ms: int,
        sent_at: float,
        call: tuple[tuple[str, ...], tuple[Any, ...]],
    ) -> None:
        self.client = client
        self.conn: Any = conn
        self.key = key
        self.token = token
        self.ttl_ms = ttl_ms
        self.sent_at = sent_at
        self._call = call

    def read(self) -> protocol.AcquireResult:
        """Read the acquire's reply (once) and give the connection back.

        A server that lost its script cache since (a restart) answers ``NOSCRIPT`` without
        running the script: the acquire is sent again with the script's source, on the same
        connection, waiting.

        Raises:
            redis.exceptions.RedisError: no reply could be read (the connection is
                disconnected): the store may have granted the token, so the caller sends the
                acquire again with the same token, as after any failed acquire
                (:func:`celery_lease.core.lifecycle.take`); an error reply as its exception.
        """
        conn, self.conn = self.conn, None
        if conn is None:
            raise RuntimeError("an acquire's reply is read once")
        keys, argv = self._call
        try:
            try:
                reply = conn.read_response()
            except redis.exceptions.NoScriptError:
                wire.send(conn, _ACQUIRE.args(keys, argv, by_sha=False))
                reply = conn.read_response()
        except redis.exceptions.ResponseError as exc:  # the reply was read: in step
            raise routing.note(exc, self.client, self.key) from None
        except BaseException as exc:  # an interrupted read leaves bytes: start afresh
            wire.broken(self.client, conn, exc)
            if isinstance(exc, RedisError):
                raise routing.note(exc, self.client, self.key) from None
            raise
        finally:
            wire.checkin(self.client, conn)
        return protocol.acquire_answer(reply, self.token, self.ttl_ms)

    def abandon(self) -> None:
        """The execution will not use the grant: read the reply and release the token if it
        was granted (token-checked; when no reply can be read it is released all the same:
        the store may have granted it). Best effort, never raises an ``Exception``: a release
        that fails leaves the key to its TTL."""
        try:
            granted = self.read().granted
        except Exception:
            granted = True  # unknown: the release is token-checked, so safe to send
        if not granted:
            return
        try:
            protocol.release(self.client, self.key, self.token)
        except Exception as exc:
            logger.warning(
                "release of an unused acquire failed (it expires within its TTL): key=%s error=%s",
                self.key,
                describe(exc),
            )


def write(
    client: Any,
    key: str,
    ttl_ms: int,
    holder: str,
    task_id: str = "",
    handed_over: bool = False,
    claimed: bool = False,
) -> WrittenAcquire | None:
    """Write the acquire :func:`celery_lease.store.acquire` would send (its arguments are that
    function's), with a fresh token, leaving the reply unread. As every acquire of a process,
    it goes out after the replies of the releases this process wrote before were read
    (:func:`celery_lease.store.pending.settle_all`).

    Returns:
        The :class:`WrittenAcquire`, or None when ``client`` is not a standalone client
        (nothing was sent: the execution acquires as usual).

    Raises:
        redis.exceptions.RedisError: the write failed (nothing is pending; the connection
            goes back disconnected).
    """
    if not wire.usable(client):
        return None
    token = value.new_token()
    pending.settle_all()
    call = protocol.acquire_call(key, token, ttl_ms, holder, task_id, handed_over, claimed)
    sent_at = clock.now()
    conn = wire.checkout(client)
    try:
        wire.send(conn, _ACQUIRE.args(*call))
    except BaseException as exc:
        wire.broken(client, conn, exc)
        wire.checkin(client, conn)
        raise
    return WrittenAcquire(client, conn, key, token, ttl_ms, sent_at, call)


# The acquires written for executions that have not taken them yet, by task id (several at
# once in a threads or green pool). Taken by the execution (take); abandoned by its request's
# end, or by a later accept once stale (abandon_stale).
_waiting: dict[str, tuple[WrittenAcquire, float]] = {}
_lock = threading.Lock()


def keep(task_id: str, written: WrittenAcquire, stale_at: float) -> bool:
    """Keep ``written`` for the execution of ``task_id`` until it takes it (:func:`take`);
    ``stale_at`` (a :func:`celery_lease.base.clock.now` time, float seconds) is when a later accept
    abandons it untaken. False, keeping nothing, when one is kept for ``task_id`` already (a
    second copy of the message accepted at the same moment: the caller abandons its own)."""
    with _lock:
        if task_id in _waiting:
            return False
        _waiting[task_id] = (written, stale_at)
        return True


def take(task_id: str, max_age: float = math.inf) -> WrittenAcquire | None:
    """The acquire kept for the execution of ``task_id``, now the caller's (None: none). One
    written more than ``max_age`` float seconds ago (a starved thread reached its execution
    late: its lease would start near its first renewal) is abandoned, and None returned."""
    if not _waiting:  # the common case of every execution without one: no lock
        return None
    with _lock:
        found = _waiting.pop(task_id, None)
    if found is None:
        return None
    acquire = found[0]
    if clock.now() - acquire.sent_at > max_age:
        acquire.abandon()
        return None
    return acquire


def abandon_stale(now: float) -> None:
    """Abandon every kept acquire whose ``stale_at`` passed before ``now`` (its execution
    never took it: its tracer failed before the task ran); best effort, never raises an
    ``Exception``."""
    if not _waiting:
        return
    with _lock:
        stale = [task_id for task_id, (_, at) in _waiting.items() if at <= now]
        found = [_waiting.pop(task_id)[0] for task_id in stale]
    for written in found:
        written.abandon()


def _after_fork_in_child() -> None:
    global _lock
    _waiting.clear()  # the parent's connections and replies are not ours
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
