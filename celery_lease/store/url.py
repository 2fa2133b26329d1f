"""The lease store's URL and ``lease_backend_options``: parsing, validation, and masking.

Every topology has one spelling, Celery's own (for its Redis result backend and
``result_backend_transport_options``): a single Redis (``redis://``, ``rediss://``, ``unix://``
and kombu's ``redis+socket://``), Sentinel (``sentinel://h1:26379;sentinel://h2:26379/0`` with
``master_name``), and Redis Cluster (a ``redis://``/``rediss://`` seed node with
``lease_backend_options={"cluster": True}``).

The library's own client settings (:mod:`celery_lease.store.connection`) always win. They are what
makes ``LeaseLost`` arrive by the local deadline, so an option that would weaken them is either
refused here, at registration (the timeouts: ``lease_store_timeout`` says what the user meant),
or overridden with a warning (options with a single right value, which a broker URL shared with
kombu may carry). ``docs/reference/settings.md`` lists each option's rule.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ..errors import LeaseConfigError

__all__ = [
    "OVERRIDDEN",
    "REFUSED",
    "TLS_KEYS",
    "StoreSpec",
    "parse_store",
    "safe_url",
    "validate_backend",
]

logger = logging.getLogger("celery_lease")

SCHEMES = ("redis", "rediss", "unix", "redis+socket", "sentinel")
#: The TLS options a ``rediss://`` query or ``lease_backend_options`` may set.
TLS_KEYS = (
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_ca_path",
    "ssl_check_hostname",
    "ssl_password",
)
#: Refused wherever they appear: lease_store_timeout is the setting that says what was meant.
REFUSED = ("socket_timeout", "socket_connect_timeout")
#: Ignored (with a warning): the lease client has one right value for each.
OVERRIDDEN = (
    "retry_on_timeout",
    "retry_on_error",
    "health_check_interval",
    "decode_responses",
    "socket_keepalive",
    "encoding",
    "encoding_errors",
    "retry",
    "protocol",
)
_QUERY_KEYS = ("db", "virtual_host", "password", "username", "client_name", *TLS_KEYS)
_OPTION_KEYS = (
    "cluster",
    "master_name",
    "sentinel_kwargs",
    "min_other_sentinels",
    "client_name",
    *TLS_KEYS,
)
#: The options of lease_backend_options that only a sentinel:// URL takes.
_SENTINEL_ONLY = ("master_name", "sentinel_kwargs", "min_other_sentinels")
_warned: set[tuple[str, str, str]] = set()  # overridden options already logged
_CERT_REQS = {
    "cert_required": ssl.CERT_REQUIRED,
    "required": ssl.CERT_REQUIRED,
    "cert_optional": ssl.CERT_OPTIONAL,
    "optional": ssl.CERT_OPTIONAL,
    "cert_none": ssl.CERT_NONE,
    "none": ssl.CERT_NONE,
}


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
        items = (
            [
                (k, "**" if k.endswith("password") else v)
                for k, v in parse_qsl(query, keep_blank_values=True)
            ]
            if sep
            else []
        )
        parts.append(base + (sep + "&".join(f"{k}={v}" for k, v in items) if items else ""))
    return ";".join(parts)


def _fail(setting: str, url: str, problem: str, fix: str) -> LeaseConfigError:
    return LeaseConfigError(f"{setting}={safe_url(url)!r}: {problem}. Fix: {fix}")


def _cert_reqs(value: Any, setting: str, url: str) -> Any:
    if isinstance(value, ssl.VerifyMode):
        return value
    reqs = _CERT_REQS.get(str(value).lower())
    if reqs is None:
        raise _fail(
            setting,
            url,
            f"ssl_cert_reqs={value!r} is not a known value",
            "use CERT_REQUIRED (or required), CERT_OPTIONAL or CERT_NONE",
        )
    if reqs != ssl.CERT_REQUIRED:
        logger.warning(
            "%s: ssl_cert_reqs=%s does not verify the server's certificate; anyone "
            "on the path can impersonate the lease store",
            setting,
            value,
        )
    return reqs


def _options_items(
    values: Mapping[str, Any], allowed: tuple[str, ...], origin: str, setting: str, url: str
) -> dict[str, Any]:
    """Apply the refused / overridden / allowed rule to query or option values."""
    kept: dict[str, Any] = {}
    for key, value in values.items():
        if key in REFUSED:
            raise _fail(
                setting,
                url,
                f"{origin} sets {key}={value!r}, which would replace the "
                "lease client's own timeout (a frozen store would then hold LeaseLost "
                "past the local deadline)",
                f"remove {key} from {origin}; set lease_store_timeout instead (it "
                "defaults to min(lease_renew_interval / 2, 2.0) seconds)",
            )
        if key in OVERRIDDEN:
            if (safe_url(url), origin, key) in _warned:
                continue
            _warned.add((safe_url(url), origin, key))
            logger.warning(
                "%s: %s %s=%r is ignored: the lease client always uses its own "
                "value (see docs/reference/settings.md)",
                setting,
                origin,
                key,
                value,
            )
            continue
        if key not in allowed:
            raise _fail(
                setting,
                url,
                f"{origin} has an unknown option {key!r}",
                f"use only {', '.join(allowed)}",
            )
        kept[key] = value
    return kept


def _split(chunk: str, setting: str, url: str) -> tuple[str, Any, dict[str, str]]:
    try:
        parts = urlsplit(chunk)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise _fail(
            setting, url, f"not a valid URL ({exc})", "use e.g. 'redis://localhost:6379/1'"
        ) from None
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
        raise _fail(
            setting,
            url,
            f"scheme {scheme}:// is not a Redis scheme the lease store understands",
            "for Redis Cluster use a redis:// or rediss:// seed node "
            "with lease_backend_options={'cluster': True}"
            if cluster
            else "use redis://, rediss://, unix://, redis+socket:// or sentinel://",
        )
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
    tls_query = {k: v for k, v in query.items() if k in TLS_KEYS}
    if tls_query and scheme != "rediss":
        raise _fail(
            setting,
            url,
            f"TLS options ({', '.join(tls_query)}) on a {scheme}:// URL",
            "use rediss:// for TLS (as Celery requires), or remove them",
        )
    params.update(tls_query)
    if scheme == "rediss":
        params["ssl"] = True
    return scheme, params


def parse_store(
    url: Any, options: Mapping[str, Any] | None = None, setting: str = "lease_backend"
) -> StoreSpec:
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
    opts = _options_items(
        _backend_options(options), _OPTION_KEYS, "lease_backend_options", setting, url
    )
    nodes = [_node_params(chunk, setting, url) for chunk in url.split(";") if chunk.strip()]
    cluster = _cluster_flag(opts)
    if len(nodes) > 1 and {scheme for scheme, _ in nodes} != {"sentinel"}:
        raise _fail(
            setting,
            url,
            "several URLs separated by ';' are only for Sentinel",
            "use sentinel://host1:26379;sentinel://host2:26379/0",
        )
    scheme, params = nodes[0]
    tls = _settle_tls(scheme, params, opts, setting, url)
    if scheme == "sentinel":
        return _sentinel_spec(nodes, tls, opts, setting, url)
    sentinel_only = [k for k in _SENTINEL_ONLY if k in opts]
    if sentinel_only:
        raise _fail(
            setting,
            url,
            f"{', '.join(sentinel_only)} only apply to sentinel:// URLs",
            "use sentinel://host:26379/0, or remove them from lease_backend_options",
        )
    if cluster:
        return _cluster_spec(params, tls, setting, url)
    return StoreSpec("standalone", tls, params)


def _backend_options(options: Any) -> Mapping[str, Any]:
    """``lease_backend_options`` (None: no options) once it is known to be a mapping.

    Raises:
        LeaseConfigError: it is not one; the message names its type only.
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        # The type, not the value: it may hold a password (ssl_password, sentinel_kwargs).
        raise LeaseConfigError(
            f"lease_backend_options (a {type(options).__name__}) must be a "
            "dict, e.g. {'ssl_ca_certs': '/etc/ssl/redis-ca.pem'}"
        )
    return options


def _cluster_flag(opts: dict[str, Any]) -> bool:
    """Take ``cluster`` out of the checked options (False when absent).

    Raises:
        LeaseConfigError: it is not a bool.
    """
    cluster = opts.pop("cluster", False)
    if not isinstance(cluster, bool):
        raise LeaseConfigError(
            f"lease_backend_options['cluster']={cluster!r} must be True or False"
        )
    return cluster


def _settle_tls(
    scheme: str, params: dict[str, Any], opts: dict[str, Any], setting: str, url: str
) -> bool:
    """Move the TLS options and ``client_name`` of ``lease_backend_options`` (``opts``) into
    the first node's connection ``params``, and settle TLS there: ``ssl`` on, the certificate
    check as a ``ssl.VerifyMode`` (``required`` by default) and ``ssl_check_hostname`` as a
    bool. Returns True when connections use TLS (a ``rediss://`` URL or TLS options).

    Raises:
        LeaseConfigError: TLS options with a URL that is neither ``rediss://`` nor
            ``sentinel://`` (whose data nodes may use TLS), or an unknown ``ssl_cert_reqs``.
    """
    tls_opts = {k: opts.pop(k) for k in TLS_KEYS if k in opts}
    if tls_opts and scheme not in ("rediss", "sentinel"):
        raise _fail(
            setting,
            url,
            f"lease_backend_options has TLS options ({', '.join(tls_opts)})"
            f" but the URL is {scheme}://",
            "use a rediss:// URL",
        )
    params.update(tls_opts)
    if "client_name" in opts:
        params["client_name"] = opts.pop("client_name")
    tls = bool(params.get("ssl")) or bool(tls_opts)
    if tls:
        params["ssl"] = True
        params["ssl_cert_reqs"] = _cert_reqs(params.get("ssl_cert_reqs", "required"), setting, url)
        if "ssl_check_hostname" in params:
            params["ssl_check_hostname"] = str(params["ssl_check_hostname"]).lower() in (
                "true",
                "1",
                "yes",
            )
    return tls


def _sentinel_spec(
    nodes: list[tuple[str, dict[str, Any]]],
    tls: bool,
    opts: Mapping[str, Any],
    setting: str,
    url: str,
) -> StoreSpec:
    """The spec of a ``sentinel://`` URL: each node is a Sentinel's address; the first one's
    other parameters (db, credentials, TLS) are those of the master found through them.

    Raises:
        LeaseConfigError: no ``master_name``, or ``sentinel_kwargs`` not a dict or with an
            option other than credentials and TLS.
    """
    master = opts.get("master_name")
    if not isinstance(master, str) or not master:
        raise _fail(
            setting,
            url,
            "a sentinel:// URL needs the master's name",
            "set lease_backend_options={'master_name': 'mymaster'}",
        )
    skw = opts.get("sentinel_kwargs") or {}
    if not isinstance(skw, Mapping):
        raise LeaseConfigError(
            "lease_backend_options['sentinel_kwargs'] must be a dict, e.g. {'password': '...'}"
        )
    skw = _options_items(
        skw,
        ("password", "username", *TLS_KEYS),
        "lease_backend_options['sentinel_kwargs']",
        setting,
        url,
    )
    sentinels = tuple((str(p["host"]), int(p["port"])) for _, p in nodes)
    params = nodes[0][1]
    for key in ("host", "port"):
        params.pop(key)
    return StoreSpec(
        "sentinel",
        tls,
        params,
        sentinels,
        master,
        dict(skw),
        int(opts.get("min_other_sentinels", 0)),
    )


def _cluster_spec(params: dict[str, Any], tls: bool, setting: str, url: str) -> StoreSpec:
    """The spec of a Redis Cluster reached through the seed node of ``params`` (its ``db``
    dropped: a cluster has only database 0).

    Raises:
        LeaseConfigError: a unix socket, or a database other than 0.
    """
    if "path" in params:
        raise _fail(
            setting,
            url,
            "Redis Cluster cannot be reached over a unix socket",
            "use a redis:// or rediss:// seed node",
        )
    if params.get("db"):
        raise _fail(
            setting,
            url,
            "Redis Cluster has only database 0",
            "use /0 or no database in the URL",
        )
    params.pop("db", None)
    return StoreSpec("cluster", tls, params)


def validate_backend(url: Any, options: Any, where: str, setting: str = "lease_backend") -> None:
    """Registration-time check of a store URL and ``lease_backend_options``.

    Raises:
        LeaseConfigError: as :func:`parse_store`, with ``where`` (e.g. the task) in the message.
    """
    try:
        parse_store(url, options, setting)
    except LeaseConfigError as exc:
        raise LeaseConfigError(f"{exc} ({where})") from None
