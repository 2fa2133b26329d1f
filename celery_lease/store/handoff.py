"""Handing a lease key over to the next run: the store side of ``coalesce`` and ``queue``.

A duplicate that finds its key held is *parked* (:func:`park`) in the key's line,
``<key>:line`` (:func:`celery_lease.base.keys.line_key`): ``coalesce`` keeps one element, the
pending run, whose message each later duplicate replaces; ``queue`` appends, up to a bound.
The holder's token-checked release (:func:`release_handing_over`, ``handoff/release_handoff-4.lua``)
reserves the key, in the same script, for the next element's task id (``<key>:reserved``,
honoured by ``lease/acquire-4.lua``) and answers that element for the releasing worker to publish.
A ``coalesce`` duplicate that arrives before that run starts joins it (its message replaces
the reserved one; the run's grant answers it, :attr:`celery_lease.store.AcquireResult.joined`);
a queued run's reservation is never joined.

Crashes are picked up by the sweep (:func:`recover`): keys with a line are noted in a sorted
set per prefix (:func:`watch`, :func:`take_due`, :func:`forget`), scored with the store's
clock; a look hands over only while no holder has the key and no reservation is due, so it
never races a live holder. Every piece of state has a lifetime (the line and the reservation:
``lifetime_ms``, set again at every park and every look; the index: :data:`INDEX_LIFETIME_MS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import RedisError

from ..base.keys import fence_key, handoff_index_key, line_key, reservation_key
from . import lua, primary, replicated, routing

__all__ = [
    "INDEX_LIFETIME_MS",
    "HandOff",
    "Parked",
    "Waiting",
    "forget",
    "park",
    "read_line",
    "recover",
    "release_handing_over",
    "take_due",
    "watch",
]

#: The sweep index's lifetime, int milliseconds: raised to this at every note (a day).
INDEX_LIFETIME_MS = 24 * 3600 * 1000

_park = lua.load("handoff/park-3.lua")
_release = lua.load("handoff/release_handoff-4.lua")
_park_slot = lua.load("handoff/park_slot-2.lua")
_release_slot = lua.load("handoff/release_slot_handoff-4.lua")
_watch = lua.load("handoff/watch-1.lua")
_due = lua.load("handoff/sweep_due-1.lua")
_unwatch = lua.load("handoff/unwatch-1.lua")


@dataclass(frozen=True)
class Waiting:
    """One element of a key's line: a run waiting for the key.

    Attributes:
        task_id: the task id it runs under (str).
        accepted_ms: when it was parked (its latest arguments, for a pending run), int
            milliseconds of the store's clock.
        message: the message to publish, as :mod:`celery_lease.policies.handoff` serialized it
        (str).
    """

    task_id: str
    accepted_ms: int
    message: str

    @classmethod
    def parse(cls, raw: Any) -> Waiting:
        """The element stored as ``<task id>\\n<ms>\\n<message>`` (bytes or str)."""
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        task_id, _, rest = text.partition("\n")
        stamp, _, message = rest.partition("\n")
        return cls(task_id, int(stamp) if stamp.isdigit() else 0, message)


@dataclass(frozen=True)
class Parked:
    """What :func:`park` did.

    Attributes:
        outcome: ``"parked"``, ``"free"`` (the key was free: nothing written), ``"full"`` or
            ``"ran"`` (a copy of a handed-over run that already ran: nothing written).
        task_id: the task id of the run that covers the duplicate (parked), else ''.
        length: the line's length after the park (or when found full), int.
        joined: coalesce: a pending run existed (in the line, or handed the key and not
            started yet), whose message this one replaced.
    """

    outcome: str
    task_id: str
    length: int
    joined: bool = False


@dataclass(frozen=True)
class HandOff:
    """What a hand-over answered (:func:`release_handing_over`, :func:`recover`).

    Attributes:
        released: the release deleted the key (now or by an earlier release of the token);
            for :func:`recover`, always True.
        handed: the run handed the key (to publish), or None.
        expired: elements taken out for waiting past the wait timeout, oldest first.
        wait_ms: :func:`recover` only: the key is held or reserved for this many int
            milliseconds more (look again then); None otherwise. With ``handed`` also set:
            a limited key's slot reservations past due, published again while it is held.
        now_ms: the store's clock at the hand-over, int milliseconds (0 when none).
        more: a limited key's release (``lease_limit`` above 1): the runs handed a slot
            after ``handed``, when holders died without a release (usually none).
    """

    released: bool
    handed: Waiting | None = None
    expired: tuple[Waiting, ...] = ()
    wait_ms: int | None = None
    now_ms: int = 0
    more: tuple[Waiting, ...] = ()


def _run(
    script: lua.Script, client: redis.Redis, key: str, keys: tuple[str, ...], argv: tuple[Any, ...]
) -> Any:
    try:
        return script(client, keys, argv)
    except RedisError as exc:
        raise routing.note(exc, client, key) from None


def park(  # noqa: PLR0913 - the ARGV of park-3.lua / park_slot-2.lua, each distinct
    client: redis.Redis,
    key: str,
    mode: str,
    task_id: str,
    message: str,
    max_length: int,
    lifetime_ms: int,
    limit: int = 1,
    handed_over: bool = False,
    min_replicas: int = 0,
) -> Parked:
    """Park a duplicate of ``key`` (``mode`` ``"coalesce"`` or ``"queue"``) in its line.

    Args:
        task_id: coalesce: a fresh task id for a new pending run (a later duplicate joins the
            existing one); queue: the duplicate's own task id.
        message: the message to publish when the key is handed over.
        max_length: queue: the most elements the line holds (``lease_queue_max``).
        lifetime_ms: the line's lifetime, int milliseconds.
        limit: the key's ``lease_limit``: above 1 it parks only while all ``limit`` slots are
            held, reserved ones included (``handoff/park_slot-2.lua``), else answers ``"free"``.
        handed_over: the duplicate is a copy of a handed-over run (its hand-over header):
            one whose task id already ran to its release answers ``"ran"`` (not parked).
        min_replicas: ``lease_min_replicas``: above 0, a park counts only once that many
            replicas acknowledged it (``WAIT`` in the same round trip): a park a failover
            loses would be a duplicate acknowledged and never run. Not acknowledged, it is
            left as it is (a copy sent again keeps its place: a line holds a task id once).

    Raises:
        NotReplicated: fewer than ``min_replicas`` replicas acknowledged the park in time.
        PrimaryUnconfirmed: a Sentinel-managed client parked on a node the sentinels do not
            name as primary now (:mod:`celery_lease.store.primary`): the park does not count.
        redis.exceptions.RedisError: on store errors (a line key of another type included).
    """
    confirmed = primary.managed(client)
    before = primary.written_to(client) if confirmed else None
    argv: tuple[Any, ...] = (mode, task_id, message, max_length, lifetime_ms)
    script, keys = _park, [key, line_key(key), reservation_key(key)]
    if limit > 1:
        script, keys, argv = _park_slot, [key, line_key(key)], (*argv, limit)
    else:
        argv = (*argv, "1" if handed_over else "0")
    if min_replicas > 0:
        try:
            reply = replicated.counted(
                script, client, keys, argv, min_replicas, _parked, None, "park"
            )
        except RedisError as exc:
            raise routing.note(exc, client, key) from None
    else:
        reply = _run(script, client, key, tuple(keys), argv)
    code = int(reply[0])
    if confirmed and code == 1:
        # A duplicate parked on a primary a failover demoted (still writable on an old
        # connection) would be acknowledged and then lost with that node's writes: on
        # Sentinel a park counts once the sentinels confirm the node, else it is a store
        # error and the duplicate is kept by lease_on_store_error, not acknowledged.
        try:
            problem = primary.confirm(client, before)
        except RedisError as exc:
            raise routing.note(exc, client, key) from None
        if problem is not None:
            raise routing.note(problem, client, key)
    if code == 1:
        covering = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        return Parked("parked", covering, int(reply[2]), covering != task_id)
    return Parked({0: "free", -2: "ran"}.get(code, "full"), "", int(reply[1]))


def _parked(reply: Any) -> bool:
    return int(reply[0]) == 1  # written: the others write nothing


def _handoff(reply: list[Any]) -> HandOff:
    handed = Waiting.parse(reply[1]) if reply[1] else None
    return HandOff(True, handed, tuple(Waiting.parse(r) for r in reply[3:]), None, int(reply[2]))


def _slot_handoff(reply: list[Any]) -> HandOff:
    count = int(reply[2])
    handed = [Waiting.parse(r) for r in reply[3 : 3 + count]]
    return HandOff(
        True,
        handed[0] if handed else None,
        tuple(Waiting.parse(r) for r in reply[3 + count :]),
        None,
        int(reply[1]),
        tuple(handed[1:]),
    )


def release_handing_over(  # noqa: PLR0913 - the release scripts' distinct ARGV
    client: redis.Redis,
    key: str,
    token: str,
    reserve_ms: int,
    lifetime_ms: int,
    timeout_ms: int,
    ran: str = "",
    limit: int = 1,
    mode: str = "queue",
    handed_over: bool = True,
    retried: bool = True,
) -> HandOff:
    """Release ``key`` if ``token`` holds it, and hand it over to the next waiting run (the
    reservation holds the key for ``reserve_ms`` int milliseconds). Safe to repeat: a repeat
    answers ``released=True`` and hands nothing over again.

    Args:
        lifetime_ms: the lifetime of the line and the reservation, int milliseconds.
        timeout_ms: the wait timeout, int milliseconds (0: none).
        ran: the releasing execution's task id when it is a handed-over run or its run
            ended for good, else '': noted, so that a second copy of it is refused (a
            handed-over run's, or when a line or a reservation is there); a run that ended
            for good also takes its own element still waiting in the line out (a copy of a
            waiting run took the key meanwhile).
        handed_over: the releasing execution is a handed-over run.
        retried: its run ended in a retry (its element, if any, is its retry's: kept).
        limit: the key's ``lease_limit``: above 1, ``token``'s slot is released and each slot
            then free is reserved for the head of the line (``handoff/release_slot_handoff-4.lua``;
            ``handed``, then ``more``), for ``reserve_ms`` each; a repeat (its first reply
            lost, so nothing was published) answers again the reservations it made that no
            run has taken yet.
        mode: the line's policy, ``"coalesce"`` (a later duplicate may join the reserved run:
            ``limit`` 1 only) or ``"queue"``.

    On a Sentinel-managed client a release that found its token counts only once the sentinels
    confirm the node that answered it, as :func:`celery_lease.store.release` does
    (:func:`celery_lease.store.primary.released`): one answered by a primary a failover
    demoted is sent again to the primary they name, and only that answer is returned, with
    the run it handed over and the waiters it found expired (the first answer's are dropped:
    they came from a line the new primary may not have, and publishing both could run a
    handed-over run twice). Token-checked, so the second send hands the key over only where
    the first never arrived; where it did, it finds the token gone and hands nothing over
    (the reservation the first wrote is published by the crash sweep once due). Unconfirmed
    twice, or not holding the key on the new primary: ``released=False`` and nothing handed
    over (what waits there is handed over by that primary's holder, or by the sweep).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    keys = (key, fence_key(key), line_key(key), reservation_key(key))
    argv: tuple[Any, ...] = (token, reserve_ms, lifetime_ms, timeout_ms, ran)
    script, parse = _release, _handoff
    if limit > 1:
        script, parse, argv = _release_slot, _slot_handoff, (*argv, limit)
    else:
        argv = (*argv, mode, "2" if retried else "1" if handed_over else "0")

    def send() -> HandOff:
        reply = _run(script, client, key, keys, argv)
        return parse(reply) if isinstance(reply, list) else HandOff(bool(reply))

    return primary.released(client, key, send, _found, HandOff(False))


def _found(got: HandOff) -> bool:
    return got.released


def recover(
    client: redis.Redis,
    key: str,
    reserve_ms: int,
    lifetime_ms: int,
    timeout_ms: int,
    mode: str = "queue",
) -> HandOff:
    """The crash sweep's look at ``key``: hand it over only if nobody holds it and no
    reservation is due (``handoff/release_handoff-4.lua`` without a token); ``mode`` as for
    :func:`release_handing_over`.

    Returns:
        ``wait_ms`` set: held or reserved, look again then; ``handed`` set: publish it;
        neither: nothing waits. Both set: a limited key (``lease_limit`` above 1), whose slot
        reservations past due are published again (``handed``, then ``more``) while its
        slots are held.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    reply = _run(
        _release,
        client,
        key,
        (key, fence_key(key), line_key(key), reservation_key(key)),
        ("", reserve_ms, lifetime_ms, timeout_ms, "", mode),
    )
    code = int(reply[0])
    if code == 0:
        return HandOff(True, wait_ms=int(reply[1]))
    if code == 2:  # a limited key's reservations whose publish was lost
        again = [Waiting.parse(r) for r in reply[2:]]
        return HandOff(True, again[0], (), int(reply[1]), 0, tuple(again[1:]))
    return _handoff(reply)


def read_line(client: redis.Redis, key: str) -> tuple[list[Waiting], Waiting | None]:
    """The elements waiting in ``key``'s line, and the run it is reserved for (not started),
    for ``celery lease ls``. Keys of another type read as empty.

    Raises:
        redis.exceptions.RedisError: on store errors other than a key of another type.
    """
    pipe = client.pipeline(transaction=False)
    pipe.lrange(line_key(key), 0, -1)
    pipe.hget(reservation_key(key), "el")
    line, reserved = pipe.execute(raise_on_error=False)
    elements = [Waiting.parse(x) for x in line] if isinstance(line, list) else []
    handed = Waiting.parse(reserved) if isinstance(reserved, (bytes, str)) else None
    return elements, handed


def watch(
    client: redis.Redis, prefix: str, key: str, delay_ms: int, keep_earlier: bool = False
) -> None:
    """Note ``key`` for the sweep to look at in ``delay_ms`` int milliseconds (store clock);
    ``keep_earlier``: unless it is noted for sooner already (a debounce burst's note).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    index = handoff_index_key(prefix)
    _run(
        _watch,
        client,
        index,
        (index,),
        (key, max(int(delay_ms), 0), INDEX_LIFETIME_MS, "1" if keep_earlier else "0"),
    )


def take_due(client: redis.Redis, prefix: str, limit: int, ahead_ms: int) -> list[tuple[str, int]]:
    """The keys under ``prefix`` due for a look, each scored ``ahead_ms`` int milliseconds
    ahead meanwhile; ``(key, score)`` pairs.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    index = handoff_index_key(prefix)
    flat = _run(_due, client, index, (index,), (limit, ahead_ms))
    pairs = zip(flat[::2], flat[1::2], strict=True)
    return [(k.decode() if isinstance(k, bytes) else str(k), int(s)) for k, s in pairs]


def forget(client: redis.Redis, prefix: str, key: str, score: int) -> bool:
    """Drop ``key`` from the sweep's index unless noted again since it was taken at ``score``.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    index = handoff_index_key(prefix)
    return bool(_run(_unwatch, client, index, (index,), (key, score)))
