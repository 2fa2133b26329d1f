"""Where a lease's commands go on each topology, and which node an error came from.

- A single Redis or a Sentinel-managed primary: one pipeline on the client's connection.
- Redis Cluster: the primary that owns each key's slot, from the client's slot table, one
  pipeline per primary, all written before any reply is read (redis-py's cluster pipeline).
  Redis refuses a command for a slot a node does not serve (``MOVED``/``ASK``), so a script
  only ever runs on the owner of its keys; the lease and its fencing counter share one hash
  tag, hence one slot.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from redis.exceptions import (
    ClusterDownError,
    ConnectionError,
    RedisError,
    SlotNotCoveredError,
    TimeoutError,
)

__all__ = ["is_cluster", "note", "owner", "send_many", "wait_ms", "where"]


def is_cluster(client: Any) -> bool:
    """True for a :class:`redis.cluster.RedisCluster` client (any redis-py version)."""
    return hasattr(client, "get_primaries")


def owner(client: Any, key: str) -> Any:
    """A plain client of the primary ``key`` lives on (``client`` itself off a cluster), for
    commands that must share a connection with a write, like ``WAIT``.

    Raises:
        redis.exceptions.ClusterDownError: no cluster node serves ``key``'s slot.
    """
    if is_cluster(client):
        try:
            return client.get_redis_connection(client.get_node_from_key(key))
        except SlotNotCoveredError as exc:  # not a RedisError
            raise ClusterDownError(f"the slot of {key} is served by no cluster node") from exc
    return client


def wait_ms(node: Any) -> int:
    """The int milliseconds a ``WAIT`` on ``node`` (from :func:`owner`) may wait: half the
    client's socket timeout (the store timeout), so its reply arrives before the socket
    gives up."""
    timeout = node.connection_pool.connection_kwargs.get("socket_timeout") or 1.0
    return max(1, int(timeout * 1000 / 2))


def send_many(client: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Send keyed ``commands`` (the key is ``args[3]``, as in ``EVALSHA sha 1 key ...``) in one
    round trip per primary; returns the replies in order, errors as values.

    On a cluster, redirections are not followed inside the pipeline: redis-py would then resend
    every command of a failed node one by one (one timeout each). A reply that is a
    ``MOVED``/``ASK`` error is for the caller to send again alone. A node that cannot be
    reached, or a slot no node serves, costs only its own commands (they get its error, a
    ``ClusterDownError`` for the slot), not the whole pass.

    Raises:
        redis.exceptions.RedisError: the round trip failed as a whole (off a cluster).
    """
    if not is_cluster(client):
        pipe = client.pipeline(transaction=False)
        for args in commands:
            pipe.execute_command(*args)
        return pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]
    from redis.cluster import PipelineCommand

    # The owner is named here: left to redis-py, a script's keys would be asked of a server
    # (COMMAND GETKEYS) once per command.
    replies: list[Any] = [None] * len(commands)
    owners: dict[int, Any] = {}
    for i, args in enumerate(commands):
        slot = client.keyslot(args[3])
        try:
            owners[i] = client.nodes_manager.get_node_from_slot(slot)
        except SlotNotCoveredError:  # not a RedisError: only this lease's command fails
            replies[i] = ClusterDownError(f"slot {slot} is served by no cluster node")

    def send(indexes: Sequence[int]) -> list[Any]:
        stack = [
            PipelineCommand(  # type: ignore[no-untyped-call]
                commands[i], {"target_nodes": owners[i]}, pos
            )
            for pos, i in enumerate(indexes)
        ]
        return client.pipeline(transaction=False).send_cluster_commands(  # type: ignore[no-any-return]
            stack, raise_on_error=False, allow_redirections=False
        )

    try:
        if owners:
            for i, answer in zip(owners, send(list(owners)), strict=True):
                replies[i] = answer
        return replies
    except (ConnectionError, TimeoutError):
        pass
    # A node could not be reached at all (redis-py refreshed its slot table and gave up on the
    # whole pipeline): send each node its own, so the leases on the others still renew.
    groups: dict[str, list[int]] = defaultdict(list)
    for i, node in owners.items():
        groups[node.name].append(i)
    for group in groups.values():
        try:
            answers = send(group)
        except RedisError as exc:
            answers = [exc] * len(group)
        for i, answer in zip(group, answers, strict=True):
            replies[i] = answer
    return replies


def where(client: Any, key: str | None = None) -> str:
    """The topology and node ``client`` sends ``key``'s commands to, for error messages.

    ``"cluster node 10.0.0.7:6379 (slot 1234)"``, ``"sentinel service 'mymaster', primary
    10.0.0.5:6379"`` or ``"redis 10.0.0.5:6379"``. Never contains credentials; never sends a
    command.
    """
    try:
        if is_cluster(client):
            if key is None:
                return "cluster"
            slot = client.keyslot(key)
            return (
                f"cluster node {client.nodes_manager.get_node_from_slot(slot).name} (slot {slot})"
            )
        pool = client.connection_pool
        service = getattr(pool, "service_name", None)
        if service is not None:  # the primary the last connection was made to, if any
            address = getattr(pool, "master_address", None)
            primary = f", primary {address[0]}:{address[1]}" if address else ""
            return f"sentinel service {service!r}{primary}"
        kwargs = pool.connection_kwargs
        address = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        return f"redis {address}"
    except Exception:  # a description must never be the thing that fails
        return "redis"


def note(error: RedisError, client: Any, key: str | None) -> RedisError:
    """Attach :func:`where` to ``error`` (once; read by
    :func:`celery_lease.store.errors.describe`) and return it."""
    if not getattr(error, "lease_store_where", None):
        error.lease_store_where = where(client, key)  # type: ignore[attr-defined]
    return error
