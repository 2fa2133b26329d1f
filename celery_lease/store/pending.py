"""Releases written now whose replies are read later: the release off an execution's critical path.

An execution that ends writes its token-checked release to a connection of its own client and
goes on (its result is stored and its message acknowledged after that write returned); the
connection, whose reply is still unread, stays out of the free list of connections
(:mod:`celery_lease.store.wire`) until the reply is read, so no other caller is ever handed it. The
reply is read, and the connection given back:

- before this process sends its next acquire, by whichever thread sends it
  (:func:`settle_all`, called by :func:`celery_lease.core.lifecycle.take`): so every acquire a
  process sends goes out after the replies of all the releases it wrote before;
- otherwise by the heartbeat thread at its next wake-up (at most a second later), which reads
  only a reply that arrived and never waits for one (a renewal or a deadline may be due).

Reading a reply that already arrived costs no round trip. One that never arrives (the store
hangs, the network drops) is given up once the client's socket timeout (the store timeout)
has passed since the write, and its connection disconnected; the key then lapses within one
TTL, as after any failed release. A connection that broke instead (the server restarted or
failed over) gets the release sent once more, waiting, on a fresh connection: the holder
still learns whether the store had its token. The heartbeat sends it only when its timeout
ends before the earliest deadline of the leases it renews (a fresh connection to a store that
hangs would otherwise delay their deadlines by a timeout); until then it stays pending.

Only a standalone client (:func:`celery_lease.store.wire.usable`: one ``redis.Redis`` on redis-py's
own ``ConnectionPool``, TCP, TLS or unix socket) takes this path: :func:`write` returns
``None`` for a Redis Cluster or Sentinel client (they pick a node per command and re-route on
errors and failovers; a connection held aside across that could answer for a node that no
longer owns the key) and the caller releases synchronously.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..base import clock
from ..base.keys import fence_key
from . import lua, protocol, wire
from .errors import describe

__all__ = ["PendingRelease", "has_pending", "settle_all", "write"]

logger = logging.getLogger("celery_lease")

_RELEASE = lua.load("lease/release-2.lua")


class PendingRelease:
    """A release written to ``conn`` whose reply is not read yet.

    ``on_reply(released)`` runs once the reply was read (``released``: True when the key was
    deleted; False when the token no longer held it; None when no reply could be read).
    """

    __slots__ = (
        "_lock",
        "broke",
        "client",
        "conn",
        "done",
        "key",
        "on_reply",
        "overdue_at",
        "timeout",
        "token",
        "ttl",
    )

    def __init__(
        self,
        client: Any,
        conn: Any,
        key: str,
        token: str,
        ttl: float,
        on_reply: Callable[[bool | None], None],
    ) -> None:
        self.client = client
        # The reply counts as lost once the socket timeout (the store timeout) has passed.
        self.timeout: float = getattr(conn, "socket_timeout", None) or ttl
        self.overdue_at = time.monotonic() + self.timeout
        # The connection error that broke the connection, while the release waits to be sent
        # again (see settle's ``until``); None before.
        self.broke: RedisConnectionError | None = None
        self.conn = conn
        self.key = key
        self.token = token
        self.ttl = ttl
        self.on_reply = on_reply
        self.done = False
        self._lock = threading.Lock()

    def settle(self, wait: bool = True, until: float = math.inf) -> None:
        """Read the reply and give the connection back.

        Args:
            wait: True: wait for the reply, at most the socket timeout; returns once it was
                read, by this thread or by another one. False (the heartbeat): read it only if
                it arrived; give it up, without waiting, once it is overdue.
            until: with ``wait=False``, the :func:`celery_lease.base.clock.now` time (float seconds)
                of the heartbeat's earliest deadline: a release sent again after a broken
                connection is a round trip, sent only if its timeout ends before then (as the
                heartbeat plans renewals); otherwise it stays pending for a later pass or for
                the next acquire.

        Never raises for a store error: it is logged, and the key lapses within one TTL.
        """
        with self._lock:
            if self.done:
                return
            released: bool | None = None
            if self.broke is None:
                if not wait and not self._ready():
                    return
                try:
                    if time.monotonic() >= self.overdue_at and not self.conn.can_read(0):
                        raise RedisTimeoutError("no reply within the store timeout")
                    released = bool(self.conn.read_response())
                except ResponseError as exc:  # an error reply: the connection is still in step
                    logger.warning(
                        "lease release failed (it expires within %.3fs): key=%s error=%s",
                        self.ttl,
                        self.key,
                        describe(exc),
                    )
                except BaseException as exc:  # no reply, or an interrupted read: start afresh
                    wire.broken(self.client, self.conn, exc)
                    if isinstance(exc, RedisConnectionError):
                        self.broke = exc  # sent again below, or by a later settle
                    elif isinstance(exc, RedisError):
                        self._unanswered(exc)
                    else:
                        raise
                finally:
                    self.done = self.broke is None
                    wire.checkin(self.client, self.conn)
            if self.broke is not None:
                if not wait and clock.now() + self.timeout >= until:
                    return
                released = self._send_again(self.broke)
                self.done = True
        self.on_reply(released)

    def _send_again(self, error: RedisConnectionError) -> bool | None:
        """After ``error`` broke the connection, the release sent once more, waiting (the
        server restarted or failed over: the holder must still learn whether the store had
        its token; a repeated release answers True for a token it already released). None
        when it stays unanswered."""
        try:
            return protocol.release(self.client, self.key, self.token)
        except RedisError as exc:
            self._unanswered(exc)
        return None

    def _unanswered(self, error: RedisError) -> None:
        logger.warning(
            "lease release unanswered (it expires within %.3fs): key=%s error=%s",
            self.ttl,
            self.key,
            describe(error),
        )

    def _ready(self) -> bool:
        """True when the reply can be read at once, or is overdue (given up without waiting)."""
        try:
            return bool(self.conn.can_read(0)) or time.monotonic() >= self.overdue_at
        except RedisError:
            return True  # the connection broke: settle() reports it


_pending: list[PendingRelease] = []
_lock = threading.Lock()


def write(
    client: Any, key: str, token: str, ttl: float, on_reply: Callable[[bool | None], None]
) -> PendingRelease | None:
    """Write the release of ``key`` for ``token`` and return without reading its reply.

    Args:
        client: the lease's client.
        key, token: the lease.
        ttl: float seconds the key outlives a lost release (for the log line).
        on_reply: called with the outcome once the reply was read.

    Returns:
        The :class:`PendingRelease`, or ``None`` when ``client`` is not a standalone client
        (nothing was sent: release synchronously).

    Raises:
        redis.exceptions.RedisError: the write failed (nothing is pending).
    """
    if not wire.usable(client):
        return None
    conn = wire.checkout(client)
    try:
        # EVAL, not EVALSHA: a NOSCRIPT reply read later would mean a release never applied.
        wire.send(conn, ("EVAL", _RELEASE.source, 2, key, fence_key(key), token))
    except BaseException as exc:
        wire.broken(client, conn, exc)
        wire.checkin(client, conn)  # it goes back empty
        raise
    item = PendingRelease(client, conn, key, token, ttl, on_reply)
    with _lock:
        _pending.append(item)
    return item


def has_pending() -> bool:
    """True while a release of this process waits for its reply to be read."""
    return bool(_pending)


def settle_all(wait: bool = True, until: float = math.inf) -> None:
    """Read the replies of every release this process wrote so far (see the module docs).

    Args:
        wait: False (the heartbeat): only the replies that arrived, and give up the overdue
            ones, never waiting (a renewal or a deadline may be due).
        until: with ``wait=False``, the heartbeat's earliest deadline (see
            :meth:`PendingRelease.settle`).
    """
    if not _pending:
        return
    with _lock:
        items = _pending[:]
    for item in items:
        item.settle(wait, until)
    with _lock:  # usually one item (a solo worker, a prefork child): no comprehension's frame
        for item in items:
            if item.done and item in _pending:
                _pending.remove(item)


def _after_fork_in_child() -> None:
    global _lock
    # The parent's connections and replies are not ours (redis-py's pools reset themselves).
    _pending.clear()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
