"""Waiting for a hold's release from asyncio code: ``BLPOP`` on a ``redis.asyncio`` client.

A waiting :func:`celery_lease.hold_async` awaits its ``BLPOP`` on the event loop, so it holds
no executor thread and no connection that anything else needs: each waiting hold has a client
of its own (one connection, opened at its first wait, closed when the hold stops waiting), so
a hundred waiters are a hundred idle sockets, and the holder's release (a store call in the
loop's default executor) and the program's own ``run_in_executor`` work never queue behind
them.

The client is built as :func:`celery_lease.store.connection.build_client` builds the sync one,
from the same parsed URL (:func:`celery_lease.store.url.parse_store`) and with the same library
settings (timeouts, no retries, no health checks, raw bytes): ``redis.asyncio.Redis`` for a
single Redis (TCP, TLS, unix socket), ``redis.asyncio.sentinel.Sentinel`` for Sentinel,
``redis.asyncio.cluster.RedisCluster`` for Redis Cluster (seeded with the nodes the sync client
knows). An option the installed redis.asyncio class does not take (e.g. ``ssl_ca_path`` on
Redis Cluster) cannot be served: the wait then runs the sync ``BLPOP`` in the loop's default
executor, as before, and says so once in a warning naming the option (the cost: one executor
thread per waiting hold).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ..base.keys import wake_key
from . import protocol, routing
from .connection import _library_kwargs, _maint_off, client_for
from .url import TLS_KEYS, StoreSpec, parse_store

__all__ = ["AsyncWaiter"]

logger = logging.getLogger("celery_lease")
_warned: set[str] = set()  # the reasons already logged
_CERT_REQS_NAMES = {
    ssl.CERT_NONE: "none",
    ssl.CERT_OPTIONAL: "optional",
    ssl.CERT_REQUIRED: "required",
}


def _async_kwargs(timeout: float, tcp: bool) -> dict[str, Any]:
    """The sync client's library settings, with redis.asyncio's own ``Retry``."""
    return {**_library_kwargs(timeout, tcp), "retry": Retry(NoBackoff(), 0)}


def _spelled(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with ``ssl_cert_reqs`` as its name: redis-py 5.0's redis.asyncio takes only
    the string (an ``ssl.VerifyMode`` leaves its TLS context without one)."""
    found = dict(options)
    reqs = found.get("ssl_cert_reqs")
    if isinstance(reqs, ssl.VerifyMode):
        found["ssl_cert_reqs"] = _CERT_REQS_NAMES[reqs]
    return found


def _unserved(cls: Any, kwargs: Mapping[str, Any]) -> str | None:
    """Why ``cls`` cannot take ``kwargs`` (an option it has no parameter for), else None."""
    params = inspect.signature(cls.__init__).parameters
    missing = sorted(k for k in kwargs if k not in params)
    if not missing:
        return None
    return (
        f"redis.asyncio's {cls.__name__} (redis-py {redis.__version__}) takes no "
        f"{', '.join(missing)}"
    )


def build_async_client(
    spec: StoreSpec, timeout: float, known_nodes: tuple[tuple[str, int], ...] = ()
) -> Any:
    """A new ``redis.asyncio`` client for ``spec`` whose every call times out after
    ``timeout`` float seconds, or the reason (str) redis.asyncio cannot serve ``spec``.

    Args:
        known_nodes: ``(host, port)`` of cluster nodes (the sync client's), tried with the
            URL's seed node.
    """
    params = _spelled(spec.params)
    if spec.kind == "sentinel":
        from redis.asyncio.sentinel import Sentinel

        skw = {**_spelled(spec.sentinel_kwargs), **_async_kwargs(timeout, True)}
        if skw.get("ssl_cert_reqs") is not None or any(k in skw for k in TLS_KEYS):
            skw["ssl"] = True
        credentials: dict[str, Any] = {
            k: params.pop(k) for k in ("username", "password") if k in params
        }
        conn = {**params, **_async_kwargs(timeout, True)}
        # Sentinel hands both to the connections of a redis.asyncio.Redis: checked against it.
        why = _unserved(redis.asyncio.Redis, {**conn, **credentials}) or _unserved(
            redis.asyncio.Redis, skw
        )
        if why is not None:
            return why
        sentinel = Sentinel(
            list(spec.sentinels),
            min_other_sentinels=spec.min_other_sentinels,
            sentinel_kwargs=skw,
            **conn,
        )  # type: ignore[no-untyped-call]
        return sentinel.master_for(spec.master_name, **credentials)
    if spec.kind == "cluster":
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        kwargs = {**params, **_async_kwargs(timeout, True), "require_full_coverage": False}
        if int(redis.__version__.split(".")[0]) < 6:
            kwargs["cluster_error_retry_attempts"] = 0
        _maint_off(RedisCluster, kwargs)
        why = _unserved(RedisCluster, kwargs)
        if why is not None:
            return why
        seed = (kwargs.pop("host"), kwargs.pop("port"))
        nodes = [ClusterNode(h, p) for h, p in dict.fromkeys([seed, *known_nodes])]
        return RedisCluster(startup_nodes=nodes, **kwargs)
    if "path" in params:
        kwargs = {**params, **_async_kwargs(timeout, False)}
        kwargs["unix_socket_path"] = kwargs.pop("path")
        kwargs.pop("socket_keepalive", None)
    else:
        kwargs = {**params, **_async_kwargs(timeout, True)}
        _maint_off(redis.asyncio.Redis, kwargs)
    why = _unserved(redis.asyncio.Redis, kwargs)
    return why if why is not None else redis.asyncio.Redis(**kwargs)


class AsyncWaiter:
    """The waits of one ``hold_async`` entry for the release of its key.

    Args:
        url: the store URL; options: ``lease_backend_options``.
        timeout: float seconds every call of its client may take (longer than any one wait).
    """

    def __init__(self, url: str, options: Mapping[str, Any] | None, timeout: float) -> None:
        self._url, self._options, self._timeout = url, options, timeout
        self._client: Any = None

    def _client_or_reason(self) -> Any:
        if self._client is None:
            sync = client_for(self._url, self._timeout, self._options)
            known = (
                tuple(sorted({(n.host, int(n.port)) for n in sync.get_nodes()}))
                if routing.is_cluster(sync)
                else ()
            )
            self._client = build_async_client(
                parse_store(self._url, self._options), self._timeout, known
            )
            if isinstance(self._client, str) and self._client not in _warned:
                _warned.add(self._client)
                logger.warning(
                    "hold_async: %s, so a waiting hold blocks one thread of the loop's default "
                    "executor in BLPOP (one per waiting hold; the holder's release and other "
                    "run_in_executor calls may queue behind them). Fix: a redis-py whose "
                    "redis.asyncio takes it, or leave that option out",
                    self._client,
                )
        return self._client

    async def wait(self, key: str, seconds: float) -> bool:
        """Wait up to ``seconds`` (float, at least 1 ms) for a release of ``key`` by
        :func:`celery_lease.store.release_and_wake`. True when woken by one.

        Cancelling the awaiting task ends the wait at once (the connection is dropped).

        Raises:
            redis.exceptions.RedisError: on store errors.
        """
        client = self._client_or_reason()
        if isinstance(client, str):  # redis.asyncio cannot serve it: the sync BLPOP
            sync = client_for(self._url, self._timeout, self._options)
            return await asyncio.get_running_loop().run_in_executor(
                None, protocol.wait_for_release, sync, key, seconds
            )
        try:
            return await client.blpop([wake_key(key)], max(seconds, 0.001)) is not None
        except RedisError as exc:
            raise routing.note(exc, client, key) from None

    async def close(self) -> None:
        """Close the client's connections (if it opened any); never raises a store error."""
        client, self._client = self._client, None
        if client is None or isinstance(client, str):
            return
        try:
            close = getattr(client, "aclose", None) or client.close  # redis-py < 5.0.1: close
            await close()
            pool = getattr(client, "connection_pool", None)
            if pool is not None:
                await pool.disconnect()
        except (RedisError, OSError):
            pass
