"""Looking at leases and settings from outside a running task: listing and the doctor's checks.

Functions here return data (:class:`LeaseInfo`, :class:`Finding`); the ``celery lease``
command (:mod:`celery_lease.cli`) only formats and prints them. Listing uses ``SCAN`` (never
``KEYS``), in batches, so it is safe on a large production Redis.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import RedisError

from . import clock, config, store
from .config import LeaseOptions, resolve_backend, resolve_options
from .errors import LeaseConfigError
from .keys import DEFAULT_PREFIX, is_internal
from .store import records, topology
from .store.url import safe_url
from .task import LeasedTask

__all__ = [
    "MIN_REDIS",
    "Finding",
    "LeaseInfo",
    "diagnose",
    "leased_tasks",
    "read_lease",
    "redis_version_problem",
    "scan_leases",
    "stores",
]

CLI_TIMEOUT = 5.0  # float seconds for each store call made from outside a worker
SCAN_COUNT = 1000  # keys per SCAN step (a hint to Redis, not a limit)
_BATCH = 500  # keys per GET/PTTL pipeline
#: The oldest Redis the library works with: the release keeps its note beside the fencing
#: counter with ``SET ... KEEPTTL`` and ``celery lease ls`` uses ``SCAN ... TYPE``, both 6.0.
MIN_REDIS = (6, 0)


def redis_version_problem(version: str) -> str | None:
    """What is wrong with Redis ``version`` (e.g. ``"5.0.14"``), or ``None`` when it is fine.

    An unparsable version is not reported (a proxy may answer anything).
    """
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if len(parts) < 2 or parts >= MIN_REDIS:
        return None
    return (f"Redis {version} is too old: celery-lease needs Redis "
            f"{MIN_REDIS[0]}.{MIN_REDIS[1]} or later (SET ... KEEPTTL in the release, "
            f"SCAN ... TYPE in `celery lease ls`)")


# -- listing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseInfo:
    """One held lease, as stored.

    Attributes:
        key: the Redis key (str).
        task: the holder's task name (str; ``celery.beat`` for a beat leader lease).
        task_id: the holder's task id (str; the beat node for a beat lease).
        host: the holder's host name (str), without a worker's node name: the same for a
            worker (``celery@web1`` holds it on ``web1``), a beat and an eager call.
        pid: the holder's process id (int, 0 when unknown).
        fencing_token: int.
        ttl: float seconds left on the server (-1.0 for a key without expiry).
        token: the holder's execution token (str).
        node: the worker's node name (``celery@web1``) when a worker holds it, else ``""``.
    """

    key: str
    task: str
    task_id: str
    host: str
    pid: int
    fencing_token: int
    ttl: float
    token: str
    node: str = ""


def _info(key: str, value: bytes | str, pttl: int) -> LeaseInfo:
    holder = store.parse_value(value)
    # A worker records its node name (celery@web1), beat and eager calls the host name.
    node = holder.hostname if "@" in holder.hostname else ""
    return LeaseInfo(key=key, task=holder.task_name, task_id=holder.task_id,
                     host=holder.hostname.rpartition("@")[2], pid=holder.pid,
                     fencing_token=holder.fencing_token,
                     ttl=pttl / 1000 if pttl >= 0 else -1.0, token=holder.token, node=node)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def read_lease(client: redis.Redis, key: str) -> LeaseInfo | None:
    """The lease stored at ``key``, or ``None`` when the key is absent.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    value, pttl = records.read(client, key)
    if value is None:
        return None
    return _info(key, value, pttl)


def scan_leases(client: redis.Redis, prefix: str, count: int = SCAN_COUNT,
                skipped: list[str] | None = None) -> Iterator[LeaseInfo]:
    """Every lease under ``prefix`` (``"<prefix>:*"``), found with ``SCAN``, never ``KEYS``.

    Keys are read in batches with one pipelined round trip per batch. A key that expires
    between the scan and the read is skipped. Internal keys (fencing counters, beat state)
    are left out.

    Args:
        client: a Redis client.
        prefix: a ``lease_key_prefix``.
        count: the ``COUNT`` hint of each ``SCAN`` step (int).
        skipped: when a list, a cluster primary that cannot be reached is left out and named
            in it (see :func:`celery_lease.topology.scan`) instead of raising.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    batch: list[str] = []

    def read(keys: list[str]) -> Iterator[LeaseInfo]:
        for key, (value, pttl) in zip(keys, records.read_many(client, keys), strict=True):
            if value is not None:
                yield _info(key, value, pttl)

    for raw in topology.scan(client, _glob_escape(prefix) + ":*", count, "STRING",
                               skipped):
        key = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if is_internal(key):
            continue
        batch.append(key)
        if len(batch) >= _BATCH:
            yield from read(batch)
            batch = []
    if batch:
        yield from read(batch)


def leased_tasks(app: Any) -> list[Any]:
    """The registered :class:`~celery_lease.LeasedTask` tasks of ``app``, by name."""
    return sorted((t for t in app.tasks.values() if isinstance(t, LeasedTask)),
                  key=lambda t: str(t.name))


def app_options(app: Any) -> LeaseOptions:
    """The app-wide options (no task's overrides).

    Raises:
        LeaseConfigError: an invalid setting.
    """
    return resolve_options(app.conf, {}, "app settings")


def stores(app: Any, url: str | None, prefixes: Sequence[str]) -> dict[str, set[str]]:
    """Store URL -> key prefixes, from the settings and every leased task.

    Args:
        url: use this store instead of the configured ones.
        prefixes: use these prefixes instead of the configured ones.

    Raises:
        LeaseConfigError: a task's settings are invalid, or no store is configured at all.
    """
    found: dict[str, set[str]] = {}

    def add(options: LeaseOptions, where: str) -> None:
        target = url or resolve_backend(options, app.conf, where)
        found.setdefault(target, set()).update(prefixes or (options.key_prefix,))

    try:
        add(app_options(app), "app settings")
    except LeaseConfigError:
        if not leased_tasks(app) and not url:
            raise
    for task in leased_tasks(app):
        add(task.lease_settings().options, f"task {task.name}")
    if url and not found:
        found[url] = set(prefixes or (DEFAULT_PREFIX,))
    return found


def client(url: str, app: Any = None) -> redis.Redis:
    """The client the inspection functions use for ``url`` (:data:`CLI_TIMEOUT` per call), with
    ``app``'s ``lease_backend_options`` (Sentinel, Cluster, TLS) when an app is given."""
    options = app.conf.get("lease_backend_options") if app is not None else None
    return store.client_for(url, CLI_TIMEOUT, options)  # type: ignore[no-any-return]


# -- the doctor's checks ------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One result of a check.

    Attributes:
        level: ``"ok"``, ``"warn"``, ``"fail"`` or ``"info"``.
        subject: what was checked (``"store redis://..."``, ``"task proj.sync"``, ``"beat"``).
        message: what was found.
        fix: what to do about it (empty when nothing).
    """

    level: str
    subject: str
    message: str
    fix: str = ""


def check_store(url: str, timeout: float, app: Any = None) -> list[Finding]:
    """Reachability, topology, version, eviction policy, latency against ``timeout`` (float
    seconds), and clock skew of the store at ``url`` (with ``app``'s backend options)."""
    subject = f"store {safe_url(url)}"
    try:  # building a cluster client asks a node already
        layout = topology.describe_topology(client(url, app))
        redis_client = layout.probe  # on a cluster, a primary that answers
        check = topology.check_store(redis_client)
    except RedisError as exc:
        return [Finding("fail", subject, f"unreachable: {store.describe(exc)}",
                        "start Redis or set lease_backend to a reachable redis:// URL")]
    found = [Finding("ok", subject, "reachable")]
    found += [Finding("fail", subject, f"cluster node {node} does not answer: {error}",
                      "restart it or fail it over to a replica: until then no lease in its "
                      "slots can be taken or renewed") for node, error in layout.unreachable]
    source = f" (read via {layout.policy_source})" if layout.policy_source else ""
    found.append(Finding(
        "info", subject, f"{layout.kind}, TLS {'on' if layout.tls else 'off'}, primaries "
        f"{', '.join(layout.primaries)}, replicas {', '.join(layout.replicas) or 'none seen'}"
        f", eviction policy {layout.eviction_policy}{source}"))
    problem = redis_version_problem(check.version)
    if problem:
        found.append(Finding("fail", subject, problem,
                             f"upgrade to Redis {MIN_REDIS[0]}.{MIN_REDIS[1]} or later"))
    else:
        found.append(Finding("ok", subject, f"Redis {check.version}"))
    if check.safe:
        found.append(Finding("ok", subject, "maxmemory-policy noeviction"))
    elif check.eviction_policy == "unknown":
        found.append(Finding("warn", subject,
                             "maxmemory-policy could not be read (CONFIG disabled?)",
                             "make sure the server runs with maxmemory-policy noeviction"))
    else:
        found.append(Finding("fail", subject,
                             f"maxmemory-policy {check.eviction_policy} may evict a live lease",
                             "CONFIG SET maxmemory-policy noeviction (and in redis.conf), or "
                             "use a dedicated Redis for lease_backend"))
    try:
        samples = topology.round_trips(redis_client, 20)
        server, before, after = topology.server_time(redis_client)
    except RedisError as exc:
        found.append(Finding("fail", subject,
                             f"stopped answering during the latency check: {store.describe(exc)}"))
        return found
    worst, median = max(samples), statistics.median(samples)
    detail = f"latency median {median * 1000:.2f} ms, max {worst * 1000:.2f} ms"
    if worst >= timeout:
        found.append(Finding(
            "fail", subject, f"{detail}: at or above lease_store_timeout={timeout}s",
            "move the store closer or raise lease_ttl (the timeout is derived from it)"))
    elif worst >= timeout / 2:
        found.append(Finding(
            "warn", subject, f"{detail}: above half of lease_store_timeout={timeout}s",
            "raise lease_ttl / lease_store_timeout, or move the store closer"))
    else:
        found.append(Finding("ok", subject, detail))
    skew = server - (before + after) / 2
    if abs(skew) > 2.0 + (after - before):
        found.append(Finding(
            "warn", subject, f"server clock differs from this host's by {skew:+.3f}s (lease "
            f"deadlines do not use wall clocks, but fencing tokens are server time and logs "
            f"will not line up)", "run NTP on both hosts"))
    else:
        found.append(Finding("ok", subject, f"clock skew {skew:+.3f}s; local deadlines use "
                             f"{clock.CLOCK_NAME}"))
    return found


def _visibility_timeout(app: Any) -> float | None:
    broker = str(app.conf.get("broker_url") or "")
    if not broker.startswith(("redis://", "rediss://", "redis+socket://", "unix://", "sqs://")):
        return None
    options = app.conf.get("broker_transport_options") or {}
    return float(options.get("visibility_timeout", 3600))


def check_task(app: Any, task: Any, options: LeaseOptions, vt: float | None) -> list[Finding]:
    """The lease ``options`` of ``task`` against its time limits and the broker's
    ``visibility_timeout`` (``vt``, float seconds, ``None`` for a broker without one)."""
    subject = f"task {task.name}"
    found = []
    timing = (f"lease_ttl={options.ttl:g}s lease_renew_interval={options.renew_interval:g}s "
              f"lease_store_timeout={options.store_timeout:g}s")
    if options.renew_interval > options.ttl / 3 + 1e-9:
        found.append(Finding("warn", subject, f"{timing}: the interval is above a third of the "
                             "TTL, two failed renewals in a row lose the lease",
                             f"lease_renew_interval={options.ttl / 3:.3f} or leave it unset"))
    else:
        found.append(Finding("ok", subject, timing))
    hard = task.time_limit or app.conf.get("task_time_limit")
    soft = task.soft_time_limit or app.conf.get("task_soft_time_limit")
    limit = hard or soft
    if limit and options.ttl > float(limit):
        found.append(Finding(
            "warn", subject, f"lease_ttl={options.ttl:g}s is longer than the task's time limit "
            f"({float(limit):g}s): after a killed run the key blocks the next run for up to "
            f"lease_ttl", "lower lease_ttl (it only has to cover the longest pause between "
            "renewals, not the run)"))
    if vt is not None:
        acks_late = bool(task.acks_late if task.acks_late is not None
                         else app.conf.get("task_acks_late"))
        if options.on_conflict == "retry" and options.ttl >= vt:
            found.append(Finding(
                "fail", subject, f"lease_on_conflict='retry' waits up to lease_ttl="
                f"{options.ttl:g}s in an ETA message, which the broker redelivers after "
                f"visibility_timeout={vt:g}s", f"broker_transport_options={{"
                f"'visibility_timeout': {max(vt, options.ttl * 4):g}}} or a shorter lease_ttl"))
        limit_text = "no hard time limit" if hard is None else f"time_limit={hard}s"
        if acks_late and (hard is None or float(hard) >= vt):
            found.append(Finding(
                "warn", subject, f"acks_late with {limit_text} >= visibility_timeout={vt:g}s: "
                f"a long run is redelivered while it runs (the lease refuses the copy, but it "
                f"takes a slot)", "set time_limit below visibility_timeout, or raise "
                "visibility_timeout in broker_transport_options"))
    return found


def check_beat(app: Any) -> list[Finding]:
    """The beat leader lease's settings, when beat is configured to use one."""
    from .beat import beat_lease_key  # beat is only imported by those who use it

    scheduler = str(app.conf.get("beat_scheduler") or "")
    configured = "LeasedScheduler" in scheduler or any(
        app.conf.get(name) is not None for name in ("lease_beat_ttl", "lease_beat_key"))
    if not configured:
        return []
    try:
        options = config.beat_settings(app.conf).options
        key = beat_lease_key(app)
    except LeaseConfigError as exc:
        return [Finding("fail", "beat", str(exc))]
    return [Finding("ok", "beat", f"leader lease {key} ttl={options.ttl:g}s "
                    f"renew_interval={options.renew_interval:g}s (a standby takes over within "
                    f"{options.ttl:g}s)")]


def diagnose(app: Any, url: str | None = None) -> Iterator[Finding]:
    """Every check of ``celery lease doctor``, in order: tasks, beat, then each store.

    Args:
        app: the Celery app, with its tasks imported.
        url: check this store instead of the configured ones.
    """
    tasks = leased_tasks(app)
    if not tasks:
        yield Finding("warn", "app", f"no LeasedTask is registered in app {app.main!r}",
                      "pass -A with the module that defines the tasks, or add it to include")
    vt = _visibility_timeout(app)
    timeouts: dict[str, float] = {}
    for task in tasks:
        try:
            options, task_url, _ = task.lease_settings()
        except LeaseConfigError as exc:
            yield Finding("fail", f"task {task.name}", str(exc))
            continue
        yield from check_task(app, task, options, vt)
        task_url = url or task_url
        timeouts[task_url] = min(timeouts.get(task_url, options.store_timeout),
                                 options.store_timeout)
    yield from check_beat(app)
    if not timeouts:
        try:
            options = app_options(app)
            timeouts[url or resolve_backend(options, app.conf, "app settings")] = \
                options.store_timeout
        except LeaseConfigError as exc:
            yield Finding("fail", "app", str(exc))
    for store_url, timeout in timeouts.items():
        yield from check_store(store_url, timeout, app)

