"""Looking at leases from outside a running task: listing what the store holds, and which
stores and tasks an app has.

Functions here return data (:class:`LeaseInfo`); the ``celery lease`` command
(:mod:`celery_lease.ops.cli`) only formats and prints them. Listing uses ``SCAN`` (never
``KEYS``), in batches, so it is safe on a large production Redis. The doctor's checks are
:mod:`celery_lease.ops.doctor`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import redis

from .. import store
from ..base.keys import (
    BURST_SUFFIX,
    CLAIM_SUFFIX,
    DEFAULT_PREFIX,
    FENCE_SUFFIX,
    INDEX_SUFFIX,
    LAST_RUN_SUFFIX,
    LINE_SUFFIX,
    RESERVED_SUFFIX,
    WAKE_SUFFIX,
    is_internal,
)
from ..errors import LeaseConfigError
from ..execution.lease_tasks import leased_runner
from ..execution.task import LeasedTask
from ..settings.config import LeaseOptions, resolve_backend, resolve_options
from ..store import debounce, handoff, records, topology
from ..store.value import OtherType

__all__ = [
    "CLI_TIMEOUT",
    "FREE_HOST",
    "ClaimInfo",
    "LeaseInfo",
    "app_options",
    "client",
    "leased_tasks",
    "read_lease",
    "scan_claims",
    "scan_foreign",
    "scan_leases",
    "stores",
]

#: The host a listed key shows when no execution holds it but runs wait for it.
FREE_HOST = "(free)"
CLI_TIMEOUT = 5.0  # float seconds for each store call made from outside a worker
SCAN_COUNT = 1000  # keys per SCAN step (a hint to Redis, not a limit)
_BATCH = 500  # keys per GET/PTTL pipeline


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
        foreign: empty for a value celery-lease wrote; else why it is not one (str): the key
            is held by an unknown holder (every other field is empty or 0, ``ttl`` aside).
        waiting: runs waiting in the key's line (``coalesce``: its pending run; ``queue``:
            the line's length), int.
        reserved_for: the task id a release handed the key to, not started yet (str; empty
            for none). A key with a line or a reservation but no holder is listed with
            ``task`` empty and ``ttl`` 0.0.
        cooldown_until: for a cooldown record (``lease_cooldown``: the execution named here
            ended, and the key stays taken until then), float seconds since the epoch on the
            store's clock; 0.0 for a lease a running execution holds.
        limit, used: for one slot of a limited key (``lease_limit``, one entry per live slot),
            the key's N and how many of its slots are held (ints); 1 and 1 for a plain lease.
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
    foreign: str = ""
    waiting: int = 0
    reserved_for: str = ""
    cooldown_until: float = 0.0
    limit: int = 1
    used: int = 1


def _info(key: str, value: records.Found | str | store.Holder, pttl: int) -> LeaseInfo:
    holder = value if isinstance(value, store.Holder) else store.parse_value(value)
    # A worker records its node name (celery@web1), beat and eager calls the host name.
    node = holder.hostname if "@" in holder.hostname else ""
    return LeaseInfo(
        key=key,
        task=holder.task_name,
        task_id=holder.task_id,
        host=holder.hostname.rpartition("@")[2],
        pid=holder.pid,
        fencing_token=holder.fencing_token,
        ttl=pttl / 1000 if pttl >= 0 else -1.0,
        token=holder.token,
        node=node,
        foreign=holder.foreign,
        cooldown_until=holder.cooldown_until,
    )


def _slots(client: redis.Redis, key: str) -> list[LeaseInfo] | None:
    """One entry per live slot of a limited key (``lease_limit``), or None when ``key`` is
    not a hash of slots."""
    found = store.read_slots(client, key)
    if found is None:
        return None
    limit, slots = found
    return [
        replace(_info(key, s.holder, round(s.ttl * 1000)), limit=limit, used=len(slots))
        for s in slots
    ]


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def read_lease(client: redis.Redis, key: str) -> LeaseInfo | None:
    """The lease stored at ``key``, or ``None`` when the key is absent (for a limited key,
    the holder whose slot ends first, with :attr:`LeaseInfo.used` and :attr:`LeaseInfo.limit`).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    value, pttl = records.read(client, key)
    if value is None:
        return None
    slots = _slots(client, key) if value == OtherType("hash") else None
    if slots:  # a limited key: the holder whose slot ends first, with used/N
        return slots[0]
    return _info(key, value, pttl)


def scan_leases(
    client: redis.Redis, prefix: str, count: int = SCAN_COUNT, skipped: list[str] | None = None
) -> Iterator[LeaseInfo]:
    """Every lease under ``prefix`` (``"<prefix>:*"``), found with ``SCAN``, never ``KEYS``.

    Keys are read in batches with one pipelined round trip per batch. A key that expires
    between the scan and the read is skipped. Internal keys (fencing counters, beat state)
    are left out; a key's line of waiting runs and its reservation are counted in its entry
    (:attr:`LeaseInfo.waiting`, :attr:`LeaseInfo.reserved_for`), listed also when no
    execution holds the key (host ``(free)``). A key celery-lease did not write (any value,
    any type) is listed as held by an unknown holder (:attr:`LeaseInfo.foreign`).

    Args:
        client: a Redis client.
        prefix: a ``lease_key_prefix``.
        count: the ``COUNT`` hint of each ``SCAN`` step (int).
        skipped: when a list, a cluster primary that cannot be reached is left out and named
            in it (see :func:`celery_lease.store.topology.scan`) instead of raising.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    handing: set[str] = set()  # lease keys with a line or a reservation beside them
    held: dict[str, LeaseInfo] = {}
    for key, value, pttl in _scan(client, prefix, count, skipped):
        if key.endswith((LINE_SUFFIX, RESERVED_SUFFIX)):
            handing.add(key.rpartition(":")[0])
        elif not is_internal(key):
            slots = _slots(client, key) if value == OtherType("hash") else None
            if slots is None:
                held[key] = _info(key, value, pttl)
            else:  # a limited key: each of its holders (none listed once all slots ended)
                yield from slots
    for key in sorted(handing):
        line, handed = handoff.read_line(client, key)
        first = handed or (line[0] if line else None)
        info = held.get(key) or LeaseInfo(key, _task_of(first), "", FREE_HOST, 0, 0, 0.0, "")
        held[key] = replace(
            info, waiting=len(line), reserved_for=handed.task_id if handed is not None else ""
        )
    for info in held.values():
        if info.host != FREE_HOST or info.waiting or info.reserved_for:
            yield info


def _task_of(waiting: handoff.Waiting | None) -> str:
    """The task name in a waiting run's message ('' when unreadable)."""
    try:
        return str(json.loads(waiting.message)["task"]) if waiting is not None else ""
    except (ValueError, KeyError, TypeError):
        return ""


def _scan(
    client: redis.Redis, prefix: str, count: int, skipped: list[str] | None
) -> Iterator[tuple[str, records.Found, int]]:
    """``(key, value, pttl)`` of every key under ``prefix`` (any type), read in batches."""
    batch: list[str] = []

    def read(keys: list[str]) -> Iterator[tuple[str, records.Found, int]]:
        for key, (value, pttl) in zip(keys, records.read_many(client, keys), strict=True):
            if value is not None:
                yield key, value, pttl

    for raw in topology.scan(client, _glob_escape(prefix) + ":*", count, None, skipped):
        batch.append(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw))
        if len(batch) >= _BATCH:
            yield from read(batch)
            batch = []
    if batch:
        yield from read(batch)


#: What each internal key is when celery-lease wrote it: ``(suffix, check, expected)``.
_INTERNAL = (
    (FENCE_SUFFIX, lambda v: store.parse_counter(v) is not None, "a fencing counter"),
    (WAKE_SUFFIX, lambda v: v == OtherType("list"), "a wake list"),
    (LAST_RUN_SUFFIX, lambda v: v == OtherType("hash"), "a beat last-run hash"),
    (CLAIM_SUFFIX, lambda v: store.parse_claim(v) is not None, "a waiting-copy claim"),
    (LINE_SUFFIX, lambda v: v == OtherType("list"), "a line of waiting runs"),
    (RESERVED_SUFFIX, lambda v: v == OtherType("hash"), "a hand-over reservation"),
    (INDEX_SUFFIX, lambda v: v == OtherType("zset"), "the hand-over sweep's index"),
    (BURST_SUFFIX, lambda v: v == OtherType("hash"), "a debounce burst record"),
)


def scan_foreign(
    client: redis.Redis, prefix: str, count: int = SCAN_COUNT
) -> Iterator[tuple[str, str]]:
    """``(key, what was found)`` for every key under ``prefix`` that celery-lease did not
    write: a lease key whose value is not a lease value, or an internal key (fencing counter,
    wake list, beat record) of another shape or type. For ``celery lease doctor``: each blocks
    its lease, or stands where the library writes.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    for key, value, _ in _scan(client, prefix, count, None):
        for suffix, ours, what in _INTERNAL:
            if key.endswith(suffix):
                if not ours(value):
                    yield key, f"not {what}: {_kind(value)}"
                break
        else:
            holder = store.parse_value(value)
            if holder.foreign and not (
                value == OtherType("hash") and store.read_slots(client, key) is not None
            ):
                yield key, holder.foreign


@dataclass(frozen=True)
class ClaimInfo:
    """The claim of a waiting copy (``lease_dedupe``): a message published, not started; or a
    debounce burst waiting for its due time (``lease_debounce``: ``debounced`` > 0).

    Attributes:
        key: the lease key whose waiting copy it names (str).
        task: the task name (str).
        task_id: the waiting copy's task id (str).
        host: the host that published it (str).
        pid: the publishing process (int).
        age: float seconds since it was claimed, on the store's clock.
        lifetime: the lifetime it was given, float seconds.
        ttl: float seconds left on the server (-1.0 for a key without expiry).
        debounced: a burst: the publishes folded into it (int); 0 for a claim.
        due_in: a burst: float seconds until it is due (0.0 when past due).
    """

    key: str
    task: str
    task_id: str
    host: str
    pid: int
    age: float
    lifetime: float
    ttl: float
    debounced: int = 0
    due_in: float = 0.0


def scan_claims(client: redis.Redis, prefix: str, count: int = SCAN_COUNT) -> Iterator[ClaimInfo]:
    """Every waiting copy's claim under ``prefix``, and every debounce burst, found with
    ``SCAN`` as :func:`scan_leases` finds leases; a claim or burst key celery-lease did not
    write is left out (:func:`scan_foreign` names it).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    now: float | None = None
    for key, value, pttl in _scan(client, prefix, count, None):
        if now is None and key.endswith((CLAIM_SUFFIX, BURST_SUFFIX)):
            now = topology.server_time(client)[0]  # the store's clock, as the stamps
        if key.endswith(BURST_SUFFIX) and now is not None:
            burst = _burst(client, key.removesuffix(BURST_SUFFIX), pttl, now)
            if burst is not None:
                yield burst
        found = store.parse_claim(value) if key.endswith(CLAIM_SUFFIX) else None
        if found is None or now is None:
            continue
        yield ClaimInfo(
            key=key.removesuffix(CLAIM_SUFFIX),
            task=found.task_name,
            task_id=found.task_id,
            host=found.hostname,
            pid=found.pid,
            age=max(now - found.claimed_at, 0.0),
            lifetime=found.lifetime,
            ttl=pttl / 1000 if pttl >= 0 else -1.0,
        )


def _burst(client: redis.Redis, key: str, pttl: int, now: float) -> ClaimInfo | None:
    """The :class:`ClaimInfo` of lease ``key``'s debounce burst, or None."""
    burst = debounce.read_burst(client, key)
    if burst is None:
        return None
    try:
        by = json.loads(burst.publisher)
        task, host, pid = str(by["task"]), str(by["host"]), int(by["pid"])
    except (ValueError, KeyError, TypeError):
        task, host, pid = "", "", 0
    return ClaimInfo(
        key=key,
        task=task,
        task_id=burst.task_id,
        host=host,
        pid=pid,
        age=max(now - burst.first, 0.0),
        lifetime=burst.deadline - burst.first,
        ttl=pttl / 1000 if pttl >= 0 else -1.0,
        debounced=burst.count,
        due_in=max(burst.due - now, 0.0),
    )


def _kind(value: records.Found) -> str:
    return f"a Redis {value.kind}" if isinstance(value, OtherType) else "a string of another shape"


def leased_tasks(app: Any) -> list[Any]:
    """The registered tasks of ``app`` that take a lease, by name: each
    :class:`~celery_lease.LeasedTask`, and for a task the ``lease_tasks`` setting leases, the
    ``LeasedTask`` instance that runs its executions
    (:func:`~celery_lease.execution.lease_tasks.leased_runner`)."""
    found = []
    for task in app.tasks.values():
        runner = task if isinstance(task, LeasedTask) else leased_runner(task)
        if runner is not None:
            found.append(runner)
    return sorted(found, key=lambda t: str(t.name))


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
