"""The sentinel group of a Sentinel-managed client, as its live sentinels know it.

``lease_backend`` lists some sentinels; the group that decides failovers is the set of
sentinels that monitor the service now, which each of them names (``SENTINEL SENTINELS``,
plus itself: a sentinel forgets another only when reset). The list goes stale when sentinels
are replaced: a hung one, a port nobody listens on, while the group elsewhere is healthy. The
primary check (:mod:`celery_lease.store.primary`) counts its majority over the group, so dead
list entries neither refuse every grant nor count as answers.

What counts as the group (:class:`Group`):

- its members: every sentinel an answering sentinel names, and those that answer (each one
  once, by its run id: one sentinel may be listed under one address and named under another);
- it shrinks only when a majority of the group known before answers: a partition or a reset
  sentinel that names fewer peers cannot make a minority look like a majority;
- a listed sentinel that does not answer, or that does not monitor the service, is no member.

The group is looked at (:func:`look`: every listed sentinel and member asked at once for
``SENTINEL MYID`` and ``SENTINEL SENTINELS``, those it names then asked in turn) once per
client before its first confirmation, then again in a background thread once the last look is
:data:`LIFETIME` float seconds old, or soon after a member stops answering: the write path
pays no round trip for it. A member that stops answering is left out of the next
confirmations at once (:func:`heard_nothing`), so that a hung sentinel costs one store
timeout, not one per write.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import redis
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..base import clock

__all__ = [
    "LIFETIME",
    "Address",
    "Group",
    "ask",
    "client_of",
    "group_for",
    "heard_nothing",
    "look",
    "look_for",
    "manager_of",
    "named",
]

Address = tuple[str, int]

#: Float seconds a look at the group is used before the next one is started (in the
#: background: the write path goes on with the last one meanwhile).
LIFETIME = 10.0
#: Float seconds between two looks started because a member stopped answering.
RELOOK_GAP = 1.0
#: Rounds of a look: the listed sentinels and known members, then those they name, then those
#: these name (a group replaced twice over since the list was written).
ROUNDS = 3


def named(address: Address) -> str:
    """``"host:port"`` of a sentinel (never credentials: the URL's are not kept here)."""
    return f"{address[0]}:{address[1]}"


@dataclass(frozen=True)
class Group:
    """The sentinel group of one service, as last looked at.

    Attributes:
        listed: the sentinels ``lease_backend`` lists.
        members: every sentinel of the group, answering or not (its size is the one a
            majority is counted over).
        answering: the members that answered the last time they were asked.
        silent: ``(address, why)`` of each listed sentinel or member that did not answer
            (``why``: ``"timed out"``, ``"connection refused"``, ``"does not monitor
            'name'"``...).
        taken: when the look ended, :func:`celery_lease.base.clock.now` float seconds.
    """

    listed: tuple[Address, ...]
    members: tuple[Address, ...]
    answering: tuple[Address, ...]
    silent: tuple[tuple[Address, str], ...]
    taken: float

    @property
    def majority(self) -> int:
        """How many members must answer for a write to be confirmed (int)."""
        return len(self.members) // 2 + 1

    @property
    def grantable(self) -> bool:
        """True when a majority of the group answered: leases can be granted."""
        return len(self.answering) >= self.majority

    def describe_silent(self) -> str:
        """``"h:p (timed out), h:p (connection refused)"``, each silent one once ("" if none);
        a listed one that is no member of the group says so."""
        parts = []
        for address, why in self.silent:
            stale = address in self.listed and address not in self.members
            parts.append(f"{named(address)} ({why}{'; no member of the group' if stale else ''})")
        return ", ".join(parts)


def manager_of(client: Any) -> Any:
    """The ``redis.sentinel.Sentinel`` behind a Sentinel-managed ``client``, else None."""
    pool = getattr(client, "connection_pool", None)  # a cluster client has none
    return getattr(pool, "sentinel_manager", None)


class _State:
    """What one ``Sentinel`` manager learned: the group, a client per sentinel, the looks."""

    def __init__(self, manager: Any) -> None:
        self.lock = threading.Lock()
        self.group: Group | None = None
        self.clients: dict[Address, Any] = {
            _address_of(s.connection_pool.connection_kwargs): s for s in manager.sentinels
        }
        self.looking = False
        self.look_started = float("-inf")


_states: weakref.WeakKeyDictionary[Any, _State] = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()


def _state(manager: Any) -> _State:
    state = _states.get(manager)
    if state is None:
        with _states_lock:
            state = _states.get(manager)
            if state is None:
                state = _states[manager] = _State(manager)
    return state


def _address_of(kwargs: Mapping[str, Any]) -> Address:
    return (str(kwargs.get("host")), int(kwargs.get("port") or 26379))


def client_of(manager: Any, address: Address) -> Any:
    """The client of the sentinel at ``address``: the manager's own for a listed one, else
    one made once with the listed ones' settings (``sentinel_kwargs``: timeouts, TLS)."""
    state = _state(manager)
    client = state.clients.get(address)
    if client is None:
        with state.lock:
            client = state.clients.get(address)
            if client is None:
                kwargs = dict(getattr(manager, "sentinel_kwargs", None) or {})
                client = state.clients[address] = redis.Redis(
                    host=address[0], port=address[1], **kwargs
                )
    return client


Reply = list[Any] | str  # the replies of one sentinel, or why it gave none


def ask(clients: Sequence[Any], commands: Sequence[Sequence[Any]], budget: float) -> list[Reply]:
    """Send ``commands`` to every one of ``clients`` (sentinels) at once and return, per
    client, its replies (a :class:`~redis.exceptions.ResponseError` stands for an error
    reply) or why it gave none (``"timed out"``, ``"connection refused"``...).

    Every request is written before any reply is read, and the whole exchange ends within
    ``budget`` float seconds however many do not answer: no connection is begun after half of
    it (each takes at most half: see :func:`celery_lease.store.connection.build_client`), and
    no reply waited for after it. Never raises a store error.
    """
    started = clock.now()
    sent: list[tuple[Any, Any] | str] = []
    for client in clients:
        if clock.now() - started >= budget / 2:
            sent.append("not asked: the store timeout ran out")
            continue
        sent.append(_send(client.connection_pool, commands))
    return [
        entry if isinstance(entry, str) else _read(*entry, len(commands), started, budget)
        for entry in sent
    ]


def _send(pool: Any, commands: Sequence[Sequence[Any]]) -> tuple[Any, Any] | str:
    try:
        try:
            conn = pool.get_connection()
        except TypeError:  # redis-py 5.0 wants a command name
            conn = pool.get_connection("SENTINEL")
    except RedisError as exc:
        return _why(exc)
    try:
        conn.send_packed_command(conn.pack_commands(commands))
    except RedisError as exc:
        pool.release(conn)
        return _why(exc)
    return pool, conn


def _read(pool: Any, conn: Any, count: int, started: float, budget: float) -> Reply:
    replies: list[Any] = []
    try:
        while len(replies) < count:
            if not conn.can_read(timeout=max(budget - (clock.now() - started), 0.0)):
                conn.disconnect()  # a late reply must not be read as another's
                return "timed out"
            try:
                replies.append(conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies
    except RedisError as exc:
        conn.disconnect()
        return _why(exc)
    finally:
        pool.release(conn)


def _why(exc: RedisError) -> str:
    if isinstance(exc, RedisTimeoutError):
        return "timed out"
    text = str(exc).lower()
    if "refused" in text:
        return "connection refused"
    return f"{type(exc).__name__}: {exc}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _peers(reply: Any) -> list[tuple[str, Address]]:
    """``(run id, address)`` of each sentinel in a ``SENTINEL SENTINELS`` reply (RESP2 flat
    lists or RESP3 maps)."""
    found = []
    for entry in reply if isinstance(reply, list) else []:
        if isinstance(entry, list):
            entry = dict(zip(entry[::2], entry[1::2], strict=False))
        if not isinstance(entry, dict):
            continue
        fields = {_text(k): _text(v) for k, v in entry.items()}
        try:
            address = (fields["ip"], int(fields["port"]))
        except (KeyError, ValueError):
            continue
        found.append((fields.get("runid") or named(address), address))
    return found


@dataclass
class _Look:
    """A look in progress: members by run id, who answered, who did not and why."""

    service: str
    members: dict[str, Address]
    answering: dict[Address, str]  # address -> run id
    silent: dict[Address, str]

    def heard(self, address: Address, reply: Reply) -> None:
        if isinstance(reply, str):
            self.silent[address] = reply
            return
        myid, peers = reply
        if isinstance(peers, ResponseError):
            self.silent[address] = f"does not monitor {self.service!r}"
            return
        runid = named(address) if isinstance(myid, ResponseError) else _text(myid)
        self.answering[address] = runid
        self.members[runid] = address  # the address it answered on wins
        for peer_id, peer in _peers(peers):
            self.members.setdefault(peer_id, peer)


def look(manager: Any, service: str, budget: float) -> Group:
    """Look at the group of ``service`` now (see the module docstring): each round asks the
    listed sentinels, the members known before and those named since, all at once within
    ``budget`` float seconds. The result is kept for the next confirmations. Never raises a
    store error: a sentinel that does not answer is named in :attr:`Group.silent`."""
    state = _state(manager)
    before = state.group
    listed = tuple(_address_of(s.connection_pool.connection_kwargs) for s in manager.sentinels)
    seen = _Look(service, {}, {}, {})
    asked: set[Address] = set()
    todo = list(dict.fromkeys([*listed, *(before.members if before else ())]))
    for _ in range(ROUNDS):
        if not todo:
            break
        for address, reply in zip(todo, _ask_each(manager, todo, service, budget), strict=True):
            seen.heard(address, reply)
        asked.update(todo)
        todo = [a for a in dict.fromkeys(seen.members.values()) if a not in asked]
    group = _group(before, listed, seen, todo)
    with state.lock:
        state.group = group
    return group


def _ask_each(manager: Any, todo: list[Address], service: str, budget: float) -> list[Reply]:
    """Each sentinel of ``todo``'s run id and peers, asked in a thread of its own: one that
    hangs while it is connected to (half the budget) holds up no other, so that each is
    named with what it did."""
    commands = [("SENTINEL", "MYID"), ("SENTINEL", "SENTINELS", service)]
    with ThreadPoolExecutor(len(todo), thread_name_prefix="celery-lease-sentinels") as pool:
        return list(pool.map(lambda a: ask([client_of(manager, a)], commands, budget)[0], todo))


def _group(
    before: Group | None, listed: tuple[Address, ...], seen: _Look, unasked: list[Address]
) -> Group:
    members = list(dict.fromkeys(seen.members.values()))
    if (
        before is not None
        and len([a for a in seen.answering if a in before.members]) < before.majority
    ):
        # Too few of the group known before answered to tell that it shrank.
        members += [a for a in before.members if a not in members]
    silent = {**seen.silent, **dict.fromkeys(unasked, "not asked: named too late")}
    silent.update({a: "not asked" for a in members if a not in seen.answering and a not in silent})
    return Group(
        listed,
        tuple(members),
        tuple(a for a in members if a in seen.answering),
        tuple(silent.items()),
        clock.now(),
    )


def look_for(client: Any) -> Group | None:
    """A look now (:func:`look`) at the group of a Sentinel-managed ``client``, each round
    within its store timeout; None for any other client. Never raises a store error."""
    manager = manager_of(client)
    if manager is None:
        return None
    pool = client.connection_pool
    budget = pool.connection_kwargs.get("socket_timeout") or 1.0
    return look(manager, pool.service_name, budget)


def group_for(manager: Any, service: str, budget: float) -> Group:
    """The group of ``service`` for a confirmation: the last look, and a new one started in
    the background once it is :data:`LIFETIME` old; the first time, a look made now (within
    ``budget`` float seconds per round). Never raises a store error."""
    state = _state(manager)
    group = state.group
    if group is None:
        return look(manager, service, budget)
    if clock.now() - group.taken >= LIFETIME:
        _look_soon(state, manager, service, budget, 0.0)
    return group


def heard_nothing(manager: Any, service: str, budget: float, silent: Mapping[Address, str]) -> None:
    """Record that the members ``silent`` (address -> why) did not answer a confirmation:
    they are left out of the next ones until a look (started now, in the background, at most
    every :data:`RELOOK_GAP` seconds) finds them answering again."""
    state = _state(manager)
    with state.lock:
        group = state.group
        if group is not None:
            state.group = replace(
                group,
                answering=tuple(a for a in group.answering if a not in silent),
                silent=(*((a, w) for a, w in group.silent if a not in silent), *silent.items()),
            )
    _look_soon(state, manager, service, budget, RELOOK_GAP)


def _look_soon(state: _State, manager: Any, service: str, budget: float, gap: float) -> None:
    """Start a look in a background thread, unless one runs or one started ``gap`` ago."""
    with state.lock:
        if state.looking or clock.now() - state.look_started < gap:
            return
        state.looking, state.look_started = True, clock.now()

    def run() -> None:
        try:
            look(manager, service, budget)
        finally:
            state.looking = False

    threading.Thread(target=run, name="celery-lease-sentinels", daemon=True).start()


def _forget() -> None:
    """After a fork: the parent's looks and locks are not the child's (its clients are new)."""
    global _states_lock
    _states.clear()
    _states_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
