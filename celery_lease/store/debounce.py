"""A key's debounce burst (``lease_debounce``): the store side, one script per decision.

The burst's record is the hash ``<lease key>:burst`` (:func:`celery_lease.base.keys.burst_key`,
under the lease's hash tag, so it works on Cluster and Sentinel as the lease does), with the
burst's task id, the store's clock at its first publish, its due time, its deadline (first
publish plus ``lease_debounce_max``) and its latest arguments:

- :func:`trigger` (``debounce/debounce-1.lua``) decides a publish: start a burst (publish its timer
  message) or join the waiting one (publish nothing; the caller gets the burst's task id);
- :func:`fire` (``debounce/debounce_fire-1.lua``) decides what a timer message does on a worker:
  nothing (its burst ran), publish itself again for the remainder, or run (the record
  becomes a tombstone in the same script, so of two timers of a burst one fires);
- :func:`look` (``debounce/debounce_look-1.lua``) is the crash sweep's: a burst waiting past its due
  time plus a grace lost its timer, which the sweep publishes again;
- :func:`read_burst` reads a record back (``celery lease ls``).

Every due time is the store's clock (``TIME``); every write sets the record's lifetime.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import RedisError

from ..base.keys import burst_key
from . import lua, primary, replicated, routing

__all__ = ["Burst", "Fire", "Look", "Trigger", "fire", "look", "read_burst", "trigger"]

_trigger = lua.load("debounce/debounce-1.lua")
_fire = lua.load("debounce/debounce_fire-1.lua")
_look = lua.load("debounce/debounce_look-1.lua")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _run(script: lua.Script, client: redis.Redis, key: str, argv: tuple[Any, ...]) -> Any:
    try:
        return script(client, (burst_key(key),), argv)
    except RedisError as exc:
        raise routing.note(exc, client, key) from None


def _decide(
    script: lua.Script,
    client: redis.Redis,
    key: str,
    argv: tuple[Any, ...],
    counts: Callable[[Any], bool],
    min_replicas: int,
) -> Any:
    """Run a decision on lease ``key``'s burst. A reply for which ``counts(reply)`` is True
    counts only once ``min_replicas`` replicas acknowledged it (``WAIT`` in the same round
    trip, :mod:`celery_lease.store.replicated`) and, on a Sentinel-managed client, once the
    sentinels confirm the node it came from.

    Every debounce decision is acted on by one process alone (a start's timer, a join's
    caller, a fire's run, a stale timer dropped), and one lost with a failover's writes is
    a lost or doubled run: a burst started on a primary a failover demoted (still writable
    on an old connection) is replaced on the new primary and its timer dropped as stale, a
    tombstone written there lets a second timer run the burst again. So an unconfirmed or
    unreplicated decision is a store error (:class:`~celery_lease.store.errors.
    PrimaryUnconfirmed`, :class:`~celery_lease.store.errors.NotReplicated`), handled as any.
    """
    confirmed = primary.managed(client)
    before = primary.written_to(client) if confirmed else None
    if min_replicas > 0:
        try:
            reply = replicated.counted(
                script, client, (burst_key(key),), argv, min_replicas, counts, None, "decision"
            )
        except RedisError as exc:
            raise routing.note(exc, client, key) from None
    else:
        reply = _run(script, client, key, argv)
    problem = primary.confirm(client, before) if confirmed and counts(reply) else None
    if problem is not None:
        raise routing.note(problem, client, key)
    return reply


@dataclass(frozen=True)
class Trigger:
    """What :func:`trigger` decided for one publish.

    Attributes:
        started: True when this publish started the burst (publish its timer message).
        task_id: the burst's task id (every caller's ``AsyncResult``); '' when ``foreign``.
        due_in: float seconds until the burst is due (0.0 when past due).
        count: publishes folded into the burst so far (int).
        foreign: empty, or what the record key holds that celery-lease did not write (or
            ``"fired"``: this task id's burst was run at once already).
        late: joined a burst whose timer is late (lost): publish it again.
    """

    started: bool
    task_id: str
    due_in: float
    count: int
    foreign: str = ""
    late: bool = False


def trigger(  # noqa: PLR0913 - the ARGV of debounce-1.lua, each distinct
    client: redis.Redis,
    key: str,
    task_id: str,
    delay_ms: int,
    cap_ms: int,
    arguments: str,
    publisher: str,
    margin_ms: int,
    late_ms: int,
    min_replicas: int = 0,
) -> Trigger:
    """Start or join lease ``key``'s burst (one round trip).

    Args:
        task_id: the task id a new burst takes.
        delay_ms, cap_ms: ``lease_debounce`` and ``lease_debounce_max``, int milliseconds.
        arguments: this publish's arguments, serialized (JSON).
        publisher: the publisher's JSON (:func:`celery_lease.store.holder_json`).
        margin_ms: how long the record outlives the burst's deadline, int milliseconds.
        late_ms: how late past its due time a burst's timer counts as lost, int milliseconds.
        min_replicas: ``lease_min_replicas``: a start or join counts once that many replicas
            acknowledged it.

    Raises:
        NotReplicated: fewer than ``min_replicas`` replicas acknowledged a start or join.
        PrimaryUnconfirmed: a Sentinel-managed client's start or join the sentinels did not
            confirm came from the primary they name now (:mod:`celery_lease.store.primary`).
        redis.exceptions.RedisError: on store errors (the node noted).
    """
    # A join publishes nothing: the caller relies on the record; a start's timer relies on
    # it too (on a new primary without it, another burst's record makes the timer stale).
    started, answer, due_in, count = _decide(
        _trigger,
        client,
        key,
        (task_id, delay_ms, cap_ms, arguments, publisher, margin_ms, late_ms),
        lambda reply: int(reply[0]) != 2,
        min_replicas,
    )
    if int(started) == 2:
        return Trigger(False, "", 0.0, 0, _text(answer))
    code = int(started)
    return Trigger(code == 1, _text(answer), int(due_in) / 1000, int(count), late=code == 3)


@dataclass(frozen=True)
class Fire:
    """What :func:`fire` decided for a timer message.

    Attributes:
        outcome: ``"stale"`` (its burst ran, or another replaced it: do nothing),
            ``"early"`` (publish it again in ``due_in``), ``"fire"`` (run with ``arguments``)
            or ``"missing"`` (no record at all: run as published).
        due_in: ``"early"``: float seconds left.
        arguments: ``"fire"``: the burst's latest arguments, as :func:`trigger` got them.
        count: ``"fire"``: the publishes folded into the run (int).
        waited: ``"fire"``: float seconds since the burst's first publish (store clock).
    """

    outcome: str
    due_in: float = 0.0
    arguments: str = ""
    count: int = 0
    waited: float = 0.0


def fire(
    client: redis.Redis,
    key: str,
    task_id: str,
    tombstone_ms: int,
    now: bool = False,
    again: bool = False,
    timer: str = "",
    min_replicas: int = 0,
) -> Fire:
    """Decide what the timer ``task_id`` of lease ``key``'s burst does now (one round trip).

    A fire leaves a tombstone living ``tombstone_ms`` int milliseconds, so a second timer of
    the burst does nothing; a timer that finds no record at all (the store lost it) is told
    ``"missing"``: run as published. ``now``: the message is a publish that could not ask the
    store (run at once): it fires its own burst, if its trigger landed after all, whatever the
    due time. ``again``: the same timer again (redelivered after its worker died, or retried
    after a store error that may have hidden a fire): it fires again from its own tombstone.
    ``timer``: the message's own timer id (``""`` for one published without): a fire keeps
    it, and only that timer again fires again; another copy of the burst's timer (published
    again by the sweep) does nothing, redelivered or retried. ``min_replicas``
    (``lease_min_replicas``): every answer counts once that many replicas acknowledged it.

    Raises:
        NotReplicated: fewer than ``min_replicas`` replicas acknowledged it: retry it as the
            same timer again.
        PrimaryUnconfirmed: a Sentinel-managed client's answer the sentinels did not confirm
            came from the primary they name now: retry it as the same timer again.
        redis.exceptions.RedisError: on store errors.
    """
    argv = (task_id, "1" if now else "0", tombstone_ms, "1" if again else "0", timer)
    code, arguments, number, waited = _decide(
        _fire, client, key, argv, lambda reply: True, min_replicas
    )
    if int(code) in (0, 3):
        return Fire("stale" if int(code) == 0 else "missing")
    if int(code) == 1:
        return Fire("early", int(number) / 1000)
    return Fire("fire", 0.0, _text(arguments), int(number), int(waited) / 1000)


@dataclass(frozen=True)
class Look:
    """What the crash sweep's :func:`look` found.

    Attributes:
        again_in: float seconds until the key is worth a look again, or None (no burst).
        lost: the task id of a burst whose timer is late (publish it again), else ''.
        arguments: the latest arguments of that burst.
    """

    again_in: float | None
    lost: str = ""
    arguments: str = ""


def look(client: redis.Redis, key: str, grace_ms: int) -> Look:
    """The sweep's look at lease ``key``'s burst: is its timer more than ``grace_ms`` int
    milliseconds past its due time? Writes nothing.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    code, task_id, arguments, again = _run(_look, client, key, (grace_ms,))
    if int(code) == 0:
        return Look(None)
    if int(code) == 1:
        return Look(int(again) / 1000)
    return Look(int(again) / 1000, _text(task_id), _text(arguments))


@dataclass(frozen=True)
class Burst:
    """A burst record as stored (``celery lease ls``).

    Attributes:
        task_id: the burst's task id (str).
        publisher: the first publisher's JSON (str).
        first: the store's clock at its first publish, epoch float seconds.
        due: its due time, epoch float seconds (store clock).
        deadline: first publish plus ``lease_debounce_max``, epoch float seconds.
        count: publishes folded into it (int).
    """

    task_id: str
    publisher: str
    first: float
    due: float
    deadline: float
    count: int


def read_burst(client: redis.Redis, key: str) -> Burst | None:
    """Lease ``key``'s burst record, or None (none, or not one celery-lease writes).

    Raises:
        redis.exceptions.RedisError: on store errors other than a key of another type.
    """
    try:
        raw = client.hmget(burst_key(key), ["id", "by", "first", "due", "until", "n", "fired"])
    except redis.exceptions.ResponseError:
        return None
    if raw[-1] is not None:  # it ran: a tombstone
        return None
    values = [None if v is None else _text(v) for v in raw[:-1]]
    numbers = values[2:]
    if values[0] is None or not all(v is not None and v.isdigit() for v in numbers):
        return None
    first, due, deadline, count = (int(v) for v in numbers)  # type: ignore[arg-type]
    return Burst(values[0], values[1] or "", first / 1000, due / 1000, deadline / 1000, count)
