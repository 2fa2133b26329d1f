"""Building and caching the lease store's redis-py client, for every topology.

A single Redis or a Sentinel-managed primary gets a ``redis.Redis``; Redis Cluster a
``RedisCluster`` (seed node from the URL, plus the nodes this process saw before when that seed
does not answer). The URL and options are parsed by :mod:`celery_lease.store.url`.

The library's own client settings always win: a reply or connect timeout of
``lease_store_timeout``, no retries, no health checks, no maintenance notifications and raw
bytes. They are what makes ``LeaseLost`` arrive by the local deadline.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import (
    ClusterDownError,
    ConnectionError,
    RedisClusterException,
    RedisError,
    TimeoutError,
)
from redis.retry import Retry

from .routing import is_cluster
from .url import TLS_KEYS, StoreSpec, parse_store

__all__ = ["LeaseCluster", "build_client", "client_for", "reset_clients", "retries_of"]


def _library_kwargs(timeout: float, tcp: bool) -> dict[str, Any]:
    """The settings that make LeaseLost arrive on time; applied last, so they always win."""
    kwargs: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),  # no hidden retry loops (defaults differ 5.x..8.x)
        "health_check_interval": 0,
        "decode_responses": False,
    }
    if tcp:  # a unix socket connection takes no keepalive (redis-py raises TypeError)
        kwargs["socket_keepalive"] = True
    return kwargs


def _maint_off(cls: Any, kwargs: dict[str, Any]) -> None:
    import inspect

    if "maint_notifications_config" in inspect.signature(cls.__init__).parameters:
        from redis.maint_notifications import MaintNotificationsConfig  # redis-py 7+

        kwargs["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)


def build_client(
    spec: StoreSpec, timeout: float, known_nodes: Sequence[tuple[str, int]] = ()
) -> Any:
    """A new redis-py client for ``spec``; every call times out after ``timeout`` (float s).

    Args:
        known_nodes: ``(host, port)`` of cluster nodes seen earlier, asked for the cluster's
            layout besides the URL's seed node (which may be the one that died).

    Raises:
        redis.exceptions.ConnectionError: a cluster whose seed and known nodes all refuse or
            time out (the message names them).
    """
    params = dict(spec.params)
    if spec.kind == "sentinel":
        from redis.sentinel import Sentinel

        # Half the store timeout per sentinel call: the primary check after each write asks
        # every sentinel within one store timeout (celery_lease.store.primary).
        skw = {**spec.sentinel_kwargs, **_library_kwargs(timeout / 2, True)}
        if skw.get("ssl_cert_reqs") is not None or any(k in skw for k in TLS_KEYS):
            skw["ssl"] = True
        credentials = {k: params.pop(k) for k in ("username", "password") if k in params}
        conn = {**params, **_library_kwargs(timeout, True)}
        sentinel = Sentinel(
            list(spec.sentinels),
            min_other_sentinels=spec.min_other_sentinels,
            sentinel_kwargs=skw,
            **conn,
        )  # type: ignore[no-untyped-call]
        return sentinel.master_for(spec.master_name, **credentials)  # type: ignore[no-untyped-call]
    if spec.kind == "cluster":
        # A slot that no node serves costs only the leases in it: the client is built anyway
        # (redis-py would refuse the whole cluster), and a command for that slot gets a store
        # error (LeaseCluster, routing.send_many).
        kwargs = {**params, **_library_kwargs(timeout, True), "require_full_coverage": False}
        if int(redis.__version__.split(".")[0]) < 6:  # 5.x: its own retry count, default 3
            kwargs["cluster_error_retry_attempts"] = 0
        _maint_off(LeaseCluster, kwargs)
        return _cluster_client(LeaseCluster, kwargs, known_nodes)
    if "path" in params:  # a pool of our own: redis.Redis drops socket_connect_timeout here
        pool = redis.ConnectionPool(
            connection_class=redis.UnixDomainSocketConnection,
            **params,
            **_library_kwargs(timeout, False),
        )
        return redis.Redis(connection_pool=pool)
    kwargs = {**params, **_library_kwargs(timeout, True)}
    _maint_off(redis.Redis, kwargs)
    return redis.Redis(**kwargs)


class LeaseCluster(RedisCluster):
    """The lease store's ``RedisCluster``: every store error it raises is a ``RedisError``.

    redis-py raises ``RedisClusterException``, which is not a ``RedisError``, for a slot that no
    node serves (``SlotNotCoveredError``) and when it cannot refresh its slot table; the lease
    code handles ``RedisError`` (``lease_on_store_error``, renewals retried until the deadline).

    Raises:
        redis.exceptions.ClusterDownError: a slot no node serves, or another cluster state
            redis-py reports as ``RedisClusterException``.
        redis.exceptions.ConnectionError: no node could be reached to refresh the slot table.
    """

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except RedisClusterException as exc:
            raise cluster_error(exc) from exc


def cluster_error(exc: RedisClusterException) -> RedisError:
    """``exc`` as the ``RedisError`` it stands for (see :class:`LeaseCluster`)."""
    if isinstance(exc.__cause__, (ConnectionError, TimeoutError)):
        return ConnectionError(str(exc))
    return ClusterDownError(str(exc))


def _cluster_client(cls: Any, kwargs: dict[str, Any], known: Sequence[tuple[str, int]]) -> Any:
    from redis.cluster import ClusterNode

    seed = (kwargs["host"], kwargs["port"])
    others = [(host, port) for host, port in known if (host, port) != seed]
    # The constructor sends COMMAND to its default node, the owner of slot 0 whether it
    # answers or not: a retry there (redis-py then picks another primary) lets a client be
    # built while that primary is down. The client itself never retries.
    retries: dict[str, Any] = {"retry": Retry(NoBackoff(), 2)}
    if "cluster_error_retry_attempts" in kwargs:  # redis-py 5.x
        retries["cluster_error_retry_attempts"] = 2
    # The URL's seed node first; the nodes seen before only when it does not answer (an
    # address remembered from long ago must not lead a client that has a seed elsewhere).
    for extra in ([], others) if others else ([],):
        try:
            client = cls(
                startup_nodes=[
                    ClusterNode(h, p)  # type: ignore[no-untyped-call]
                    for h, p in extra
                ],
                **{**kwargs, **retries},
            )
            break
        except RedisClusterException as exc:  # not a RedisError: no caller would handle it
            if not isinstance(exc.__cause__, (ConnectionError, TimeoutError)):
                raise  # e.g. a node without cluster mode: a configuration problem
            if extra is others or not others:
                tried = ", ".join(f"{h}:{p}" for h, p in [seed, *others])
                raise ConnectionError(
                    f"no Redis Cluster node answered (tried {tried}): {exc.__cause__}"
                ) from exc
    client.retry = kwargs["retry"]
    if "cluster_error_retry_attempts" in kwargs:
        client.cluster_error_retry_attempts = kwargs["cluster_error_retry_attempts"]
    return client


def retries_of(retry: Retry) -> int:
    """How many times ``retry`` retries (redis-py 5.0's ``Retry`` has no ``get_retries``)."""
    getter = getattr(retry, "get_retries", None)
    return int(getter() if getter is not None else retry._retries)


_clients: dict[tuple[str, float, str], Any] = {}
_clients_lock = threading.Lock()
#: The nodes each store's cluster clients found, by (url, options); kept across a fork and
#: reset_clients, so a client built after the URL's seed node died (a new pool child, another
#: timeout) still finds the cluster.
_cluster_nodes: dict[tuple[str, str], tuple[tuple[str, int], ...]] = {}


def client_for(url: str, timeout: float, options: Mapping[str, Any] | None = None) -> Any:
    """The process-wide client for ``url`` and ``options`` whose every call times out after
    ``timeout`` (float seconds): a ``redis.Redis`` (also for Sentinel) or a ``RedisCluster``.

    Clients are cached per (url, timeout, options) and forgotten in a forked child.

    Raises:
        LeaseConfigError: the URL or options are unusable (normally caught at registration).
    """
    key = (url, timeout, repr(sorted((options or {}).items())))
    client = _clients.get(key)
    if client is None:
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                known = _cluster_nodes.get((url, key[2]), ())
                client = _clients[key] = build_client(parse_store(url, options), timeout, known)
                if is_cluster(client):
                    seen = {(n.host, int(n.port)) for n in client.get_nodes()}
                    _cluster_nodes[url, key[2]] = tuple(sorted(seen | set(known)))
    return client


def reset_clients() -> None:
    """Forget every cached client (their sockets belong to the parent after a fork)."""
    global _clients_lock
    _clients.clear()
    _clients_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=reset_clients)
