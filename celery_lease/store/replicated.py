"""A script whose write counts only once replicas acknowledged it (``lease_min_replicas``).

Redis replicates asynchronously: a primary that fails before its replica received a write
loses it with the failover, and Sentinel's promotion leaves an instant in which the old
primary still answers (and the sentinels still name it) while the promoted replica no longer
follows it. ``WAIT n`` after the write, on the same connection (it counts that connection's
writes), answers how many replicas have it; the write counts only when at least ``n`` do.
Used by the acquire (:func:`celery_lease.store.acquire`), a slot's acquire
(:mod:`celery_lease.store.slots`), every debounce decision
(:mod:`celery_lease.store.debounce`) and every dedupe decision at publish
(:mod:`celery_lease.store.claims`); renewals batch their own ``WAIT`` per primary
(:mod:`celery_lease.store.renewal`).

Where the idea comes from: Redis' ``WAIT`` command and its documented guarantee (a write
acknowledged by ``n`` replicas survives the failover to one of them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import MovedError, NoScriptError, RedisError

from . import lua, routing
from .errors import NotReplicated

__all__ = ["counted", "grant", "run"]


def run(
    script: lua.Script, client: Any, keys: Sequence[str], argv: Sequence[Any], min_replicas: int
) -> tuple[Any, int | Exception, int]:
    """``script`` on ``keys`` with ``argv``, then ``WAIT min_replicas``, in one pipeline (one
    round trip) on the primary that owns ``keys[0]``.

    Returns:
        ``(reply, acked, wait_ms)``: the script's reply; how many replicas acknowledged it
        (int), or the error ``WAIT`` answered; the int milliseconds ``WAIT`` could wait (half
        the store timeout, :func:`celery_lease.store.routing.wait_ms`).

    Raises:
        redis.exceptions.RedisError: what the script answered (an error reply), or a
            connection problem; a cluster slot that moved is asked of its new owner first.
    """
    node = routing.owner(client, keys[0])
    wait_ms = routing.wait_ms(node)

    def send(by_sha: bool) -> list[Any]:
        pipe = node.pipeline(transaction=False)
        pipe.execute_command(*script.args(keys, argv, by_sha=by_sha))
        pipe.execute_command("WAIT", min_replicas, wait_ms)
        return pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]

    reply, acked = send(True)
    if isinstance(reply, NoScriptError):
        reply, acked = send(False)
    if isinstance(reply, MovedError) and routing.is_cluster(client):
        client.nodes_manager.initialize()  # the slot moved (a resharding): ask its new owner
        return run(script, client, keys, argv, min_replicas)
    if isinstance(reply, Exception):
        raise reply
    return reply, (acked if isinstance(acked, Exception) else int(acked)), wait_ms


def counted(
    script: lua.Script,
    client: Any,
    keys: Sequence[str],
    argv: Sequence[Any],
    min_replicas: int,
    counts: Callable[[Any], bool],
    undo: Callable[[Any], Any] | None,
    what: str,
) -> Any:
    """:func:`run`, and a reply for which ``counts(reply)`` is True counts only once
    ``min_replicas`` replicas acknowledged it: else it is taken back (``undo(reply)`` when
    given, truthy when it removed something; its errors ignored: what it wrote then lapses
    with its lifetime) and raises.
    ``what`` names the decision in the error (``"grant"``).

    Raises:
        NotReplicated: fewer than ``min_replicas`` replicas acknowledged a reply that counts,
            in time.
        redis.exceptions.RedisError: what the script or ``WAIT`` answered.
    """
    reply, acked, wait_ms = run(script, client, keys, argv, min_replicas)
    if counts(reply) and (isinstance(acked, Exception) or acked < min_replicas):
        taken_back = False
        if undo is not None:
            try:
                taken_back = bool(undo(reply))
            except RedisError:
                pass
        if isinstance(acked, Exception):
            raise acked
        raise NotReplicated(
            f"WAIT {min_replicas}: only {acked} replica(s) acknowledged the {what} within "
            f"{wait_ms} ms (lease_min_replicas){'; taken back' if taken_back else ''}"
        )
    return reply


def grant(
    script: lua.Script,
    client: Any,
    keys: Sequence[str],
    argv: Sequence[Any],
    min_replicas: int,
    undo: Callable[[], Any],
) -> Any:
    """:func:`counted` for a grant script (its reply ``[granted, ...]``): a grant fewer than
    ``min_replicas`` replicas acknowledged is released again (``undo()``; nobody ran under
    it) and raises.

    Raises:
        NotReplicated: fewer than ``min_replicas`` replicas acknowledged the grant in time.
        redis.exceptions.RedisError: what the script or ``WAIT`` answered.
    """
    return counted(
        script, client, keys, argv, min_replicas, lambda r: bool(r[0]), lambda _: undo(), "grant"
    )
