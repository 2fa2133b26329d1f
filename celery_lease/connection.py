"""Building the lease store client from ``lease_backend`` and ``lease_backend_options``.

One home for every topology: a single Redis (``redis://``, ``rediss://``, ``unix://`` and
kombu's ``redis+socket://``), Sentinel (``sentinel://h1:26379;sentinel://h2:26379/0`` with
``master_name``), and Redis Cluster (a ``redis://``/``rediss://`` seed node with
``lease_backend_options={"cluster": True}``). The spellings are Celery's own, for its Redis
result backend and ``result_backend_transport_options``.

The library's own client settings always win: a reply or connect timeout of
``lease_store_timeout``, no retries, no health checks, no maintenance notifications and raw
bytes. They are what makes ``LeaseLost`` arrive by the local deadline, so an option that would
weaken them is either refused at registration (the timeouts: ``lease_store_timeout`` says what
the user meant) or overridden (options with a single right value here, which a broker URL shared
with kombu may carry). ``docs/reference/settings.md`` lists each option's rule.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    ConnectionError,
    NoPermissionError,
    ResponseError,
    TimeoutError,
)
from redis.retry import Retry

from .errors import LeaseConfigError

__all__ = ["StoreSpec", "Topology", "build_client", "client_for", "describe_topology",
           "parse_store", "permanent_error", "reset_clients", "retries_of", "safe_url", "scan",
           "validate_backend"]

logger = logging.getLogger("celery_lease")

SCHEMES = ("redis", "rediss", "unix", "redis+socket", "sentinel")
_TLS_KEYS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path",
             "ssl_check_hostname", "ssl_password")
#: Refused wherever they appear: lease_store_timeout is the setting that says what was meant.
REFUSED = ("socket_timeout", "socket_connect_timeout")
#: Ignored (with a warning): the lease client has one right value for each.
OVERRIDDEN = ("retry_on_timeout", "retry_on_error", "health_check_interval", "decode_responses",
              "socket_keepalive", "encoding", "encoding_errors", "retry", "protocol")
_QUERY_KEYS = ("db", "virtual_host", "password", "username", "client_name", *_TLS_KEYS)
_OPTION_KEYS = ("cluster", "master_name", "sentinel_kwargs", "min_other_sentinels",
                "client_name", *_TLS_KEYS)
_warned: set[tuple[str, str, str]] = set()  # overridden options already logged
_CERT_REQS = {"cert_required": ssl.CERT_REQUIRED, "required": ssl.CERT_REQUIRED,
              "cert_optional": ssl.CERT_OPTIONAL, "optional": ssl.CERT_OPTIONAL,
              "cert_none": ssl.CERT_NONE, "none": ssl.CERT_NONE}


@dataclass(frozen=True)
class StoreSpec:
    """A parsed, validated store configuration (credentials included: never print it).

    Attributes:
        kind: ``"standalone"``, ``"sentinel"`` or ``"cluster"``.
        tls: True when connections to the data nodes use TLS.
        params: connection keyword arguments for redis-py (address, db, credentials, TLS).
        sentinels: ``(host, port)`` of each Sentinel (kind ``"sentinel"`` only).
        master_name: the Sentinel service name.
        sentinel_kwargs: connection keyword arguments for the Sentinels themselves.
        min_other_sentinels: int, as redis-py's ``Sentinel``.
    """

    kind: str
    tls: bool
    params: dict[str, Any]
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str = ""
    sentinel_kwargs: dict[str, Any] = field(default_factory=dict)
    min_other_sentinels: int = 0


def safe_url(url: Any) -> str:
    """``url`` fit for an error, a log line or an event: passwords masked as ``**``.

    Uses kombu's ``maybe_sanitize_url`` (Celery's own masking) on each ``;``-separated part of
    a Sentinel URL, and masks ``password=`` / ``ssl_password=`` in the query as well.
    """
    from kombu.utils.url import maybe_sanitize_url

    if not isinstance(url, str):
        return repr(url)
    parts = []
    for chunk in url.split(";"):
        try:
            masked = maybe_sanitize_url(chunk)
        except ValueError:  # kombu cannot parse it (bad port): mask all before the last @
            scheme, sep, rest = chunk.partition("://")
            masked = scheme + sep + ("**@" + rest.rpartition("@")[2] if "@" in rest else rest)
        base, sep, query = masked.partition("?")
        items = [(k, "**" if k.endswith("password") else v) for k, v in
                 parse_qsl(query, keep_blank_values=True)] if sep else []
        parts.append(base + (sep + "&".join(f"{k}={v}" for k, v in items) if items else ""))
    return ";".join(parts)


def _fail(setting: str, url: str, problem: str, fix: str) -> LeaseConfigError:
    return LeaseConfigError(f"{setting}={safe_url(url)!r}: {problem}. Fix: {fix}")


def _cert_reqs(value: Any, setting: str, url: str) -> Any:
    if isinstance(value, ssl.VerifyMode):
        return value
    reqs = _CERT_REQS.get(str(value).lower())
    if reqs is None:
        raise _fail(setting, url, f"ssl_cert_reqs={value!r} is not a known value",
                    "use CERT_REQUIRED (or required), CERT_OPTIONAL or CERT_NONE")
    if reqs != ssl.CERT_REQUIRED:
        logger.warning("%s: ssl_cert_reqs=%s does not verify the server's certificate; anyone "
                       "on the path can impersonate the lease store", setting, value)
    return reqs


def _options_items(values: Mapping[str, Any], allowed: tuple[str, ...], origin: str,
                   setting: str, url: str) -> dict[str, Any]:
    """Apply the refused / overridden / allowed rule to query or option values."""
    kept: dict[str, Any] = {}
    for key, value in values.items():
        if key in REFUSED:
            raise _fail(setting, url, f"{origin} sets {key}={value!r}, which would replace the "
                        "lease client's own timeout (a frozen store would then hold LeaseLost "
                        "past the local deadline)",
                        f"remove {key} from {origin}; set lease_store_timeout instead (it "
                        "defaults to min(lease_renew_interval / 2, 2.0) seconds)")
        if key in OVERRIDDEN:
            if (safe_url(url), origin, key) in _warned:
                continue
            _warned.add((safe_url(url), origin, key))
            logger.warning("%s: %s %s=%r is ignored: the lease client always uses its own "
                           "value (see docs/reference/settings.md)", setting, origin, key, value)
            continue
        if key not in allowed:
            raise _fail(setting, url, f"{origin} has an unknown option {key!r}",
                        f"use only {', '.join(allowed)}")
        kept[key] = value
    return kept


def _split(chunk: str, setting: str, url: str) -> tuple[str, Any, dict[str, str]]:
    try:
        parts = urlsplit(chunk)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise _fail(setting, url, f"not a valid URL ({exc})",
                    "use e.g. 'redis://localhost:6379/1'") from None
    return parts.scheme.lower(), parts, dict(parse_qsl(parts.query, keep_blank_values=True))


def _db(value: Any, setting: str, url: str) -> int:
    text = str(value).strip("/") or "0"
    if not text.isdigit():
        raise _fail(setting, url, f"database {value!r} is not a number", "use e.g. /1 or ?db=1")
    return int(text)


def _node_params(chunk: str, setting: str, url: str) -> tuple[str, dict[str, Any]]:
    """Connection parameters of one URL (one node or one Sentinel)."""
    scheme, parts, query = _split(chunk, setting, url)
    if scheme not in SCHEMES:
        cluster = scheme in ("redis+cluster", "rediss+cluster", "redis-cluster", "cluster")
        raise _fail(setting, url, f"scheme {scheme}:// is not a Redis scheme the lease store "
                    "understands", "for Redis Cluster use a redis:// or rediss:// seed node "
                    "with lease_backend_options={'cluster': True}" if cluster else
                    "use redis://, rediss://, unix://, redis+socket:// or sentinel://")
    query = _options_items(query, _QUERY_KEYS, "the URL query", setting, url)
    params: dict[str, Any] = {}
    if parts.username:
        params["username"] = unquote(parts.username)
    if parts.password:
        params["password"] = unquote(parts.password)
    for key in ("username", "password", "client_name"):
        if key in query:
            params[key] = query.pop(key)
    db = query.pop("db", query.pop("virtual_host", None))
    if scheme in ("unix", "redis+socket"):  # kombu's spelling of a socket path; translated
        if not parts.path or parts.path == "/":
            raise _fail(setting, url, "no socket path", "use e.g. unix:///run/redis.sock?db=1")
        params["path"] = unquote(parts.path)
    else:
        params["host"] = parts.hostname or "localhost"
        params["port"] = parts.port or (26379 if scheme == "sentinel" else 6379)
        if db is None and parts.path not in ("", "/"):
            db = parts.path
    params["db"] = _db(db or 0, setting, url)
    tls_query = {k: v for k, v in query.items() if k in _TLS_KEYS}
    if tls_query and scheme != "rediss":
        raise _fail(setting, url, f"TLS options ({', '.join(tls_query)}) on a {scheme}:// URL",
                    "use rediss:// for TLS (as Celery requires), or remove them")
    params.update(tls_query)
    if scheme == "rediss":
        params["ssl"] = True
    return scheme, params


def parse_store(url: Any, options: Mapping[str, Any] | None = None,
                setting: str = "lease_backend") -> StoreSpec:
    """Parse and validate a store URL and ``lease_backend_options``.

    Args:
        url: the store URL (``lease_backend``, or the ``broker_url`` fallback).
        options: the ``lease_backend_options`` dict, or None.
        setting: the setting to name in errors, e.g. ``"lease_backend"``.

    Raises:
        LeaseConfigError: the URL or an option is unusable; the message names the setting and
            the fix, and never shows a password.
    """
    if not isinstance(url, str) or "://" not in url:
        raise _fail(setting, url, "not a Redis URL", "use e.g. 'redis://localhost:6379/1'")
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        # The type, not the value: it may hold a password (ssl_password, sentinel_kwargs).
        raise LeaseConfigError(f"lease_backend_options (a {type(options).__name__}) must be a "
                               "dict, e.g. {'ssl_ca_certs': '/etc/ssl/redis-ca.pem'}")
    opts = _options_items(options, _OPTION_KEYS, "lease_backend_options", setting, url)
    nodes = [_node_params(chunk, setting, url) for chunk in url.split(";") if chunk.strip()]
    schemes = {scheme for scheme, _ in nodes}
    cluster = opts.pop("cluster", False)
    if not isinstance(cluster, bool):
        raise LeaseConfigError(f"lease_backend_options['cluster']={cluster!r} must be True or "
                               "False")
    if len(nodes) > 1 and schemes != {"sentinel"}:
        raise _fail(setting, url, "several URLs separated by ';' are only for Sentinel",
                    "use sentinel://host1:26379;sentinel://host2:26379/0")
    scheme, params = nodes[0]
    tls_opts = {k: opts.pop(k) for k in _TLS_KEYS if k in opts}
    if tls_opts and scheme not in ("rediss", "sentinel"):
        raise _fail(setting, url, f"lease_backend_options has TLS options ({', '.join(tls_opts)})"
                    f" but the URL is {scheme}://", "use a rediss:// URL")
    params.update(tls_opts)
    if "client_name" in opts:
        params["client_name"] = opts.pop("client_name")
    tls = bool(params.get("ssl")) or bool(tls_opts)
    if tls:
        params["ssl"] = True
        params["ssl_cert_reqs"] = _cert_reqs(params.get("ssl_cert_reqs", "required"), setting, url)
        if "ssl_check_hostname" in params:
            params["ssl_check_hostname"] = str(params["ssl_check_hostname"]).lower() in (
                "true", "1", "yes")
    sentinel_only = [k for k in ("master_name", "sentinel_kwargs", "min_other_sentinels")
                     if k in opts]
    if scheme == "sentinel":
        master = opts.get("master_name")
        if not isinstance(master, str) or not master:
            raise _fail(setting, url, "a sentinel:// URL needs the master's name",
                        "set lease_backend_options={'master_name': 'mymaster'}")
        skw = opts.get("sentinel_kwargs") or {}
        if not isinstance(skw, Mapping):
            raise LeaseConfigError("lease_backend_options['sentinel_kwargs'] must be a dict, "
                                   "e.g. {'password': '...'}")
        skw = _options_items(skw, ("password", "username", *_TLS_KEYS),
                             "lease_backend_options['sentinel_kwargs']", setting, url)
        sentinels = tuple((str(p["host"]), int(p["port"])) for _, p in nodes)
        for key in ("host", "port"):
            params.pop(key)
        return StoreSpec("sentinel", tls, params, sentinels, master, dict(skw),
                         int(opts.get("min_other_sentinels", 0)))
    if sentinel_only:
        raise _fail(setting, url, f"{', '.join(sentinel_only)} only apply to sentinel:// URLs",
                    "use sentinel://host:26379/0, or remove them from lease_backend_options")
    if cluster:
        if "path" in params:
            raise _fail(setting, url, "Redis Cluster cannot be reached over a unix socket",
                        "use a redis:// or rediss:// seed node")
        if params.get("db"):
            raise _fail(setting, url, "Redis Cluster has only database 0",
                        "use /0 or no database in the URL")
        params.pop("db", None)
        return StoreSpec("cluster", tls, params)
    return StoreSpec("standalone", tls, params)


def validate_backend(url: Any, options: Any, where: str, setting: str = "lease_backend") -> None:
    """Registration-time check of a store URL and ``lease_backend_options``.

    Raises:
        LeaseConfigError: as :func:`parse_store`, with ``where`` (e.g. the task) in the message.
    """
    try:
        parse_store(url, options, setting)
    except LeaseConfigError as exc:
        raise LeaseConfigError(f"{exc} ({where})") from None


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


def build_client(spec: StoreSpec, timeout: float,
                 known_nodes: Sequence[tuple[str, int]] = ()) -> Any:
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

        skw = {**spec.sentinel_kwargs, **_library_kwargs(timeout, True)}
        if skw.get("ssl_cert_reqs") is not None or any(k in skw for k in _TLS_KEYS):
            skw["ssl"] = True
        credentials = {k: params.pop(k) for k in ("username", "password") if k in params}
        conn = {**params, **_library_kwargs(timeout, True)}
        sentinel = Sentinel(list(spec.sentinels), min_other_sentinels=spec.min_other_sentinels,
                            sentinel_kwargs=skw, **conn)  # type: ignore[no-untyped-call]
        return sentinel.master_for(spec.master_name, **credentials)  # type: ignore[no-untyped-call]
    if spec.kind == "cluster":
        from redis.cluster import RedisCluster

        kwargs = {**params, **_library_kwargs(timeout, True)}
        if int(redis.__version__.split(".")[0]) < 6:  # 5.x: its own retry count, default 3
            kwargs["cluster_error_retry_attempts"] = 0
        _maint_off(RedisCluster, kwargs)
        return _cluster_client(RedisCluster, kwargs, known_nodes)
    if "path" in params:  # a pool of our own: redis.Redis drops socket_connect_timeout here
        pool = redis.ConnectionPool(connection_class=redis.UnixDomainSocketConnection,
                                    **params, **_library_kwargs(timeout, False))
        return redis.Redis(connection_pool=pool)
    kwargs = {**params, **_library_kwargs(timeout, True)}
    _maint_off(redis.Redis, kwargs)
    return redis.Redis(**kwargs)


def _cluster_client(cls: Any, kwargs: dict[str, Any], known: Sequence[tuple[str, int]]) -> Any:
    from redis.cluster import ClusterNode
    from redis.exceptions import RedisClusterException

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
            client = cls(startup_nodes=[ClusterNode(h, p)  # type: ignore[no-untyped-call]
                                        for h, p in extra], **{**kwargs, **retries})
            break
        except RedisClusterException as exc:  # not a RedisError: no caller would handle it
            if not isinstance(exc.__cause__, (ConnectionError, TimeoutError)):
                raise  # e.g. a node without cluster mode: a configuration problem
            if extra is others or not others:
                tried = ", ".join(f"{h}:{p}" for h, p in [seed, *others])
                raise ConnectionError(f"no Redis Cluster node answered (tried {tried}): "
                                      f"{exc.__cause__}") from exc
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
                if _is_cluster(client):
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


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "get_primaries")


def _node_clients(client: Any) -> list[Any]:
    if _is_cluster(client):
        return [client.get_redis_connection(node) for node in client.get_primaries()]
    return [client]


def scan(client: Any, match: str, count: int = 1000, type_: str | None = None,
         skipped: list[str] | None = None) -> Iterator[bytes]:
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
            if skipped is None or not _is_cluster(client):
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
    """

    kind: str
    primaries: tuple[str, ...]
    replicas: tuple[str, ...]
    tls: bool
    eviction_policy: str
    policy_source: str


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
    return [f"{v['ip']}:{v['port']}" for k, v in info.items()
            if k.startswith("slave") and isinstance(v, dict)]


def describe_topology(client: Any) -> Topology:
    """Describe the store behind ``client`` (from :func:`client_for`).

    Raises:
        redis.exceptions.RedisError: the store (or a Sentinel) does not answer.
    """
    pool = getattr(client, "connection_pool", None)
    if _is_cluster(client):
        kind = "cluster"
        primaries = tuple(n.name for n in client.get_primaries())
        # INFO of each primary: CLUSTER SLOTS leaves out a replica until it reports an offset
        seen = {n.name for n in client.get_replicas()}
        seen.update(r for node in _node_clients(client) for r in _replicas_of(node))
        replicas = tuple(sorted(seen))
        tls = bool(client.nodes_manager.connection_kwargs.get("ssl"))
    else:
        assert pool is not None
        conn_kwargs = pool.connection_kwargs
        tls = bool(issubclass(pool.connection_class, redis.SSLConnection)
                   or conn_kwargs.get("ssl"))
        manager = getattr(pool, "sentinel_manager", None)
        if manager is not None:
            kind = "sentinel"
            host, port = manager.discover_master(pool.service_name)
            primaries = (f"{host}:{port}",)
            replicas = tuple(f"{h}:{p}" for h, p in manager.discover_slaves(pool.service_name))
            tls = tls or "SSL" in pool.connection_class.__name__
        else:
            kind = "standalone"
            primaries = (_address(conn_kwargs),)
            replicas = tuple(_replicas_of(client))
    found = [_policy(node) for node in _node_clients(client)]
    policies = sorted({p for p, _ in found})
    sources = sorted({s for _, s in found if s})
    return Topology(kind, primaries, replicas, tls, ", ".join(policies), ", ".join(sources))


def permanent_error(error: BaseException, setting: str = "lease_backend") -> str | None:
    """A message naming the fix when ``error`` cannot go away by waiting, else None.

    Permanent: a wrong password or user, an ACL denial, a database the server does not have,
    a certificate the client or server refuses. Transient (None): refused connections,
    timeouts, a loading or failing-over server.
    """
    text = f"{type(error).__name__}: {error}"
    lowered = text.lower()
    if isinstance(error, AuthenticationError) or "wrongpass" in lowered or \
            "invalid username-password" in lowered or "noauth" in lowered:
        return (f"{text}; the store refused the credentials: fix the user name and password "
                f"in {setting} (redis://user:password@host:6379/0)")
    if isinstance(error, NoPermissionError) or "noperm" in lowered:
        return (f"{text}; the ACL user lacks a permission the lease store needs: grant the "
                f"ACL in docs/deploying.md (section ACL), or use another user in {setting}")
    if "db index" in lowered:
        return f"{text}; the server has no such database: fix the database number in {setting}"
    if "certificate" in lowered or "ssl" in lowered or "tls" in lowered or \
            isinstance(error.__cause__ or error.__context__, ssl.SSLError):
        return (f"{text}; the TLS handshake failed: check ssl_ca_certs (the CA that signed the "
                f"server's certificate), ssl_certfile / ssl_keyfile (client certificate) and "
                f"the rediss:// host name in {setting} / lease_backend_options")
    return None
