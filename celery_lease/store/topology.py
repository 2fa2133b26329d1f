"""What the lease store looks like from here: its version and eviction policy (the worker's
start-up check), its primaries, replicas and TLS, its round-trip time and its clock
(``celery lease doctor``), and a ``SCAN`` over every primary (``celery lease ls``).

:mod:`celery_lease.store.routing` says where one lease's commands go; this module looks at the
whole store.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import ConnectionError, RedisError, ResponseError, TimeoutError

from ..base import clock
from .routing import is_cluster

__all__ = [
    "StoreCheck",
    "Topology",
    "check_store",
    "describe_topology",
    "round_trips",
    "scan",
    "sentinel_down_after",
    "server_time",
]


def _node_clients(client: Any) -> list[Any]:
    if is_cluster(client):
        return [client.get_redis_connection(node) for node in client.get_primaries()]
    return [client]


def scan(
    client: Any,
    match: str,
    count: int = 1000,
    type_: str | None = None,
    skipped: list[str] | None = None,
) -> Iterator[bytes]:
    """Every key matching ``match``, by ``SCAN`` (never ``KEYS``), on every primary of a cluster.

    Args:
        skipped: when a list, a cluster primary that cannot be reached (connection error or
            timeout) is left out and ``"host:port: <error>"`` appended to it, so the primaries
            that answer are still scanned; when None, that error is raised.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    for node in _node_clients(client):
        try:
            yield from node.scan_iter(match=match, count=count, _type=type_)
        except (ConnectionError, TimeoutError) as exc:
            if skipped is None or not is_cluster(client):
                raise
            skipped.append(f"{_address(node.connection_pool.connection_kwargs)}: {exc}")


@dataclass(frozen=True)
class Topology:
    """What the lease store looks like from here (for ``celery lease doctor``).

    Attributes:
        kind: ``"standalone"``, ``"sentinel"`` or ``"cluster"``.
        primaries: ``"host:port"`` (or socket path) of each primary seen.
        replicas: ``"host:port"`` of each replica seen (empty when INFO is not allowed).
        tls: True when the lease client talks TLS.
        eviction_policy: ``maxmemory-policy`` (one per distinct value, comma-separated), or
            ``"unreadable under ACL"`` when neither CONFIG GET nor INFO is allowed.
        policy_source: ``"CONFIG"``, ``"INFO"`` or ``""``.
        unreachable: ``("host:port", error)`` of each cluster primary that did not answer
            (connection refused or timed out); the other fields come from those that did.
        probe: a client for the store-wide checks (PING, INFO, TIME): ``client`` itself, or on
            a cluster a plain client of a primary that answered (redis-py sends those commands
            to one default node, which may be the dead one).
    """

    kind: str
    primaries: tuple[str, ...]
    replicas: tuple[str, ...]
    tls: bool
    eviction_policy: str
    policy_source: str
    unreachable: tuple[tuple[str, str], ...] = ()
    probe: Any = field(default=None, repr=False, compare=False)


def _address(kwargs: Mapping[str, Any]) -> str:
    return str(kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _policy(node: Any) -> tuple[str, str]:
    try:
        return _text(node.config_get("maxmemory-policy")["maxmemory-policy"]), "CONFIG"
    except (ResponseError, KeyError):  # NOPERM under an ACL, or CONFIG renamed away
        pass
    try:
        return _text(node.info("memory").get("maxmemory_policy", "unknown")), "INFO"
    except ResponseError:
        return "unreadable under ACL", ""


def _replicas_of(node: Any) -> list[str]:
    try:
        info = node.info("replication")
    except ResponseError:
        return []
    return [
        f"{v['ip']}:{v['port']}"
        for k, v in info.items()
        if k.startswith("slave") and isinstance(v, dict)
    ]


def connected_replicas(client: Any) -> int | None:
    """How many replicas are connected to the primary behind ``client`` (a standalone or
    Sentinel-managed client), by ``INFO replication``; None on Redis Cluster (each primary has
    its own) or when the ACL user may not run ``INFO``.

    Raises:
        redis.exceptions.RedisError: the store does not answer.
    """
    if is_cluster(client):
        return None
    try:
        return int(client.info("replication").get("connected_slaves", 0))
    except ResponseError:
        return None


def describe_topology(client: Any) -> Topology:
    """Describe the store behind ``client`` (from :func:`celery_lease.store.connection.client_for`).

    A cluster primary that does not answer is named in ``unreachable`` instead of raising.

    Raises:
        redis.exceptions.RedisError: the store (or a Sentinel, or every cluster primary) does
            not answer.
    """
    if is_cluster(client):
        return _cluster_topology(client)
    pool = client.connection_pool
    conn_kwargs = pool.connection_kwargs
    tls = bool(issubclass(pool.connection_class, redis.SSLConnection) or conn_kwargs.get("ssl"))
    manager = getattr(pool, "sentinel_manager", None)
    if manager is not None:
        kind = "sentinel"
        host, port = manager.discover_master(pool.service_name)
        primaries: tuple[str, ...] = (f"{host}:{port}",)
        replicas = tuple(f"{h}:{p}" for h, p in manager.discover_slaves(pool.service_name))
        tls = tls or "SSL" in pool.connection_class.__name__
    else:
        kind = "standalone"
        primaries = (_address(conn_kwargs),)
        replicas = tuple(_replicas_of(client))
    return Topology(kind, primaries, replicas, tls, *_policies([_policy(client)]), (), client)


def _cluster_topology(client: Any) -> Topology:
    seen = {n.name for n in client.get_replicas()}
    found: list[tuple[str, str]] = []
    answered: list[Any] = []
    unreachable: list[tuple[str, str]] = []
    error: Exception | None = None
    for node in _node_clients(client):
        try:
            # INFO of each primary: CLUSTER SLOTS leaves out a replica until it reports an offset
            seen.update(_replicas_of(node))
            found.append(_policy(node))
            answered.append(node)
        except (ConnectionError, TimeoutError) as exc:
            error = exc
            unreachable.append((_address(node.connection_pool.connection_kwargs), str(exc)))
    if not answered and error is not None:
        raise error  # not one primary answers: the store is down
    return Topology(
        "cluster",
        tuple(n.name for n in client.get_primaries()),
        tuple(sorted(seen)),
        bool(client.nodes_manager.connection_kwargs.get("ssl")),
        *_policies(found),
        tuple(unreachable),
        answered[0],
    )


def _policies(found: list[tuple[str, str]]) -> tuple[str, str]:
    """The eviction policies and where they were read, each distinct value once."""
    return (", ".join(sorted({p for p, _ in found})), ", ".join(sorted({s for _, s in found if s})))


@dataclass(frozen=True)
class StoreCheck:
    """The result of :func:`check_store`.

    Attributes:
        version: the Redis server version (str).
        eviction_policy: ``maxmemory-policy`` (str; ``"unknown"`` when CONFIG is disabled).
        safe: True when the policy cannot evict a live lease (``noeviction``).
    """

    version: str
    eviction_policy: str

    @property
    def safe(self) -> bool:
        return self.eviction_policy == "noeviction"


def check_store(client: redis.Redis) -> StoreCheck:
    """Ping the store and read its version and eviction policy.

    Raises:
        redis.exceptions.RedisError: the store is unreachable.
    """
    info = client.info("server")
    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy", "unknown")
    except ResponseError:  # CONFIG renamed or disabled (managed Redis)
        policy = client.info("memory").get("maxmemory_policy", "unknown")
    if isinstance(policy, bytes):
        policy = policy.decode()
    return StoreCheck(version=str(info.get("redis_version", "?")), eviction_policy=str(policy))


def round_trips(client: Any, count: int) -> list[float]:
    """The float seconds each of ``count`` ``PING`` round trips to ``client``'s node took.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    samples = []
    for _ in range(count):
        started = clock.now()
        client.ping()
        samples.append(clock.now() - started)
    return samples


def server_time(client: Any) -> tuple[float, float, float]:
    """``(server, before, after)``: the server's clock (``TIME``) and this host's wall clock
    just before and after asking, all epoch float seconds (for the doctor's skew check).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    before = time.time()
    seconds, micros = client.time()
    after = time.time()
    return seconds + micros / 1e6, before, after


def sentinel_down_after(client: Any) -> float | None:
    """How long the sentinels of a Sentinel-managed ``client`` wait before calling a silent
    primary down (``down-after-milliseconds``, the largest any sentinel that answers has), in
    float seconds; None for other clients, or when no sentinel answers.

    It is how long a primary cut off from the sentinels, but not from its clients, goes on
    taking writes before a replica is promoted (for ``celery lease doctor`` and the worker's
    start check).
    """
    pool: Any = getattr(client, "connection_pool", None)  # a cluster client has none
    manager = getattr(pool, "sentinel_manager", None)
    if manager is None:
        return None
    found: list[float] = []
    for sentinel in manager.sentinels:
        try:
            master = sentinel.sentinel_master(pool.service_name)
            found.append(int(master["down-after-milliseconds"]) / 1000)
        except (RedisError, KeyError, TypeError, ValueError):
            continue
    return max(found) if found else None
