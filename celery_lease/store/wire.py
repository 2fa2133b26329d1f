"""A standalone client's connections, used without redis-py's per-call bookkeeping.

Every acquire and release is one command on one connection. redis-py's ``execute_command``
checks a connection out of its pool and back in around each one (a lock, a ``select`` for
unread data, metrics hooks: about half the client-side CPU of a call). Here the connections a
process uses for leases are checked out of the client's pool once and kept in a free list of
their own (one per thread or greenlet that is in a call at the same moment, never more),
which hands them out with a ``list.pop`` and takes them back with a ``list.append``.

A connection goes back to the free list only in step: after its reply was read, or
disconnected (the next command reconnects it). A connection that broke (the server restarted,
failed over, or a proxy closed it) disconnects every idle one of its client as well: they most
likely broke with it, and redis-py's pool, which checks each connection as it hands it out,
would not have handed them out either (see :func:`broken`). A release written without
waiting for its reply (:mod:`celery_lease.store.pending`) keeps its connection out of the list until
the reply was read, so no caller is ever handed a connection with an unread reply.

Only a standalone client (``redis.Redis`` on redis-py's own ``ConnectionPool``: TCP, TLS or a
unix socket) takes this path; :func:`usable` is False for Cluster and Sentinel clients, whose
commands keep going through redis-py (they pick a node per command and follow redirections).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from ..base import process

__all__ = ["broken", "call", "call_many", "checkin", "checkout", "send", "usable"]


def usable(client: Any) -> bool:
    """True when ``client`` is a standalone client whose connections can be used directly."""
    return type(client) is redis.Redis and type(client.connection_pool) is redis.ConnectionPool


def _idle(client: Any) -> list[Any]:
    found: tuple[int, list[Any]] | None = client.__dict__.get("_lease_idle")
    pid = process.pid()
    if found is None or found[0] != pid:  # a forked child never uses its parent's sockets
        found = client.__dict__["_lease_idle"] = (pid, [])
    return found[1]


def checkout(client: Any) -> Any:
    """A connection of ``client`` (a standalone one: see :func:`usable`), all replies read."""
    try:
        return _idle(client).pop()
    except IndexError:
        pool = client.connection_pool
        try:
            return pool.get_connection()
        except TypeError:  # redis-py 5.0 wants a command name
            return pool.get_connection("EVALSHA")


def checkin(client: Any, conn: Any) -> None:
    """Give back a connection taken with :func:`checkout` (its replies read, or disconnected)."""
    _idle(client).append(conn)


def broken(client: Any, conn: Any, error: BaseException) -> None:
    """Disconnect ``conn`` after ``error`` interrupted a command on it; on a connection error,
    disconnect every idle connection of ``client`` too (each reconnects on its next use).

    The free list hands a connection out without redis-py's check for a closed socket (a
    ``select`` per call): after a restart or a failover every idle connection is dead, and
    each would fail the next call made on it. One broken connection clears them all.
    """
    conn.disconnect()
    if not isinstance(error, redis.exceptions.ConnectionError):
        return
    idle, stale = _idle(client), []
    while True:  # each pop is atomic: no other thread is using a connection taken here
        try:
            stale.append(idle.pop())
        except IndexError:
            break
    for other in stale:
        other.disconnect()
    idle.extend(stale)


def call(client: Any, *args: Any) -> Any:
    """Send one command on a connection of ``client`` and return its reply.

    Raises:
        redis.exceptions.RedisError: as redis-py's ``execute_command`` would (an error reply
            is raised as its exception; on a connection error or a timeout the connection is
            disconnected, and reconnects on its next use).
    """
    conn = checkout(client)
    try:
        send(conn, args)
        return conn.read_response()
    except redis.exceptions.ResponseError:
        raise  # the reply was read: the connection is in step
    except BaseException as exc:  # an interrupted read (LeaseLost, a timeout) leaves bytes
        broken(client, conn, exc)
        raise
    finally:
        checkin(client, conn)


def _pack_python(args: tuple[Any, ...]) -> bytes:
    """One command in RESP, as redis-py packs it for the arguments used here (str, bytes,
    int), at a third of its cost per argument (a renewal pass packs 20 000 of them)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        kind = type(arg)
        data = arg.encode() if kind is str else arg if kind is bytes else str(arg).encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


_pack_hiredis: Callable[[tuple[Any, ...]], bytes] | None
try:
    # hiredis (redis-py's C parser, the ``hiredis`` extra) packs the same bytes in C: half the
    # cost of the loop above, on every acquire, release and renewal batch.
    from hiredis import pack_command as _pack_hiredis
except ImportError:  # pragma: no cover - depends on what is installed
    _pack_hiredis = None

_pack: Callable[[tuple[Any, ...]], bytes] = _pack_hiredis or _pack_python


def send(conn: Any, args: tuple[Any, ...]) -> None:
    """Write one command (str, bytes and int arguments) to ``conn``, packed by :func:`_pack`.

    Raises:
        redis.exceptions.RedisError: the write failed (redis-py disconnected ``conn``).
    """
    conn.send_packed_command([_pack(args)])


def call_many(client: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` in one write on one connection of ``client``, then read every reply
    (one round trip); error replies are returned as their exceptions, in place.

    Raises:
        redis.exceptions.RedisError: the round trip failed (the connection is disconnected).
    """
    conn = checkout(client)
    try:
        conn.send_packed_command([b"".join(map(_pack, commands))])
        replies = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except redis.exceptions.ResponseError as exc:
                replies.append(exc)
        return replies
    except BaseException as exc:
        broken(client, conn, exc)
        raise
    finally:
        checkin(client, conn)
