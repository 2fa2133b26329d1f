"""Whether a write landed on the node that is the primary now (Sentinel).

Sentinel promotes a replica in a fraction of a second, but leaves the old primary a writable
primary until it reconfigures it (about ten seconds after a ``SENTINEL FAILOVER``, measured;
for ever while the old primary is partitioned from the sentinels but not from its clients). A
client that keeps a pooled connection to the old primary goes on granting and renewing leases
there, with no error, while the new primary lets the same keys lapse and grants them to
others. Nothing the old primary answers can tell: it still calls itself a primary.

So a grant or renewal made through a Sentinel-managed client counts only once the sentinels
confirm, after its reply, that the node it was written to is still the one they name
(``SENTINEL GET-MASTER-ADDR-BY-NAME``, which names a promoted replica as soon as the
failover's leader has seen it promoted, before redis-py's own discovery does):

- the sentinels counted are the group that monitors the service now, as its live sentinels
  know it (:mod:`celery_lease.store.sentinels`), not only those ``lease_backend`` lists: a
  stale list (a hung sentinel, a port nobody listens on) neither refuses every write nor
  counts as an answer;
- every member that answered at the last look is asked at once (all requests written before
  any reply is read: one round trip, the whole check bounded by the store timeout, so that a
  renewal with its check takes at most two store timeouts, less than the renew interval); one
  that does not answer is left out of the next checks until a background look finds it again;
- the write counts when a majority of the group answered and every one that answered names
  the node written to;
- otherwise it does not count (:class:`~celery_lease.store.errors.PrimaryUnconfirmed`, a store
  error naming the sentinels that do not answer: a grant is released and the task's
  ``lease_on_store_error`` applies; a renewal is tried again until the lease's deadline, when
  the holder gets ``LeaseLost``), and the client is told to look for the primary again, so
  the next write goes to the new one.

A release (:func:`released`: the plain one, the hand-over's and the cooldown's) counts the same
way, but never raises for it: one unconfirmed is sent once more, to the primary the sentinels
name, and only that answer counts, or else the release answers "not released".

Standalone and cluster clients have nothing to confirm here (a cluster node that lost its
slots answers ``MOVED``); :func:`managed` is False for them and costs one attribute read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from redis.exceptions import RedisError

from . import sentinels
from .errors import PrimaryUnconfirmed

__all__ = ["Address", "confirm", "confirmed_grant", "managed", "released", "written_to"]

logger = logging.getLogger("celery_lease")

Address = tuple[str, int]
Reply = TypeVar("Reply")


def managed(client: Any) -> bool:
    """True for a Sentinel-managed client (the only kind whose writes are confirmed here)."""
    return sentinels.manager_of(client) is not None


def written_to(client: Any) -> Address | None:
    """The primary a Sentinel-managed ``client`` sends its writes to now, as ``(host, port)``
    (None: not a Sentinel client, or no connection made yet). Read it just before a write and
    pass it to :func:`confirm` after the reply."""
    if not managed(client):
        return None
    address = client.connection_pool.master_address
    return None if address is None else (str(address[0]), int(address[1]))


def confirm(client: Any, before: Address | None) -> PrimaryUnconfirmed | None:
    """None when the write that ``client`` just made, to the primary ``before`` (from
    :func:`written_to` just before the write), landed on the node the sentinels name as
    primary now; else the :class:`PrimaryUnconfirmed` error saying why.

    When the sentinels name another node, the client's pool is asked to find the primary
    again (redis-py drops its idle connections to the old one when it does).

    Never raises a store error: a sentinel that does not answer is counted as such.
    """
    if not managed(client):
        return None
    pool = client.connection_pool
    manager = pool.sentinel_manager
    after = written_to(client)
    if before is None:  # the write made the pool's first connection
        before = after
    if before is None or after != before:
        # A connection made during the write found another primary: which node the write
        # went to is not known. Writing again (the same token) lands on the new one.
        return PrimaryUnconfirmed(
            "the client moved to another primary during the write (Sentinel failover)",
            moved_during_write=True,
        )
    budget = pool.connection_kwargs.get("socket_timeout") or 1.0  # the store timeout
    group = sentinels.group_for(manager, pool.service_name, budget)
    named = _ask_all(manager, group.answering, pool.service_name, budget)
    answered = [address for address in named.values() if isinstance(address, tuple)]
    silent = {a: why for a, why in named.items() if isinstance(why, str)}
    if silent or len(answered) < group.majority:  # look again soon, in the background
        sentinels.heard_nothing(manager, pool.service_name, budget, silent)
    if len(answered) < group.majority:
        return _too_few(group, silent, len(answered), before)
    others = sorted({f"{h}:{p}" for h, p in answered if (h, p) != before})
    if not others:
        return None
    _rediscover(pool)
    return PrimaryUnconfirmed(
        f"written to {before[0]}:{before[1]}, but the sentinels name {', '.join(others)} as "
        f"primary now (a failover): the write does not count"
    )


def released(
    client: Any, key: str, send: Callable[[], Reply], found: Callable[[Reply], bool], lost: Reply
) -> Reply:
    """The answer of a token-checked release of lease ``key`` that counts: ``send()``'s reply,
    once the sentinels confirm the node it was written to when ``found(reply)`` (the token was
    there: the release deleted the key, now or earlier); ``lost`` when they do not, twice.

    A primary demoted by a failover still answers old connections, with a token whose grant
    never replicated, while the new primary may have granted the key to another execution:
    its "released" may hide a loss. So an unconfirmed release is sent once more (``send()``
    again, token-checked: where the first one landed on the counted primary, the second finds
    the token gone and changes nothing), to the primary the sentinels name (:func:`confirm`
    told the pool to look for it), and only that reply counts, confirmed in turn. An earlier
    reply is dropped with everything it answered (a hand-over's run, a cooldown): a caller
    acts on one reply only. A reply with ``found`` False is final at once: nothing is
    confirmed for it. One that too few sentinels answered for is ``lost`` at once (logged at
    DEBUG: the grant it undoes, or the holder's loss, is what is reported). Used by
    :func:`celery_lease.store.release`,
    :func:`celery_lease.store.handoff.release_handing_over` and
    :func:`celery_lease.store.release_into_cooldown`.

    Costs nothing but one attribute read on a standalone or cluster client (``send()`` once),
    one round trip to the sentinels per release on a Sentinel-managed one.

    Raises:
        redis.exceptions.RedisError: what ``send()`` raises (a store error).
    """
    if not managed(client):
        return send()
    for _ in (1, 2):
        before = written_to(client)
        reply = send()
        if not found(reply):
            return reply
        problem = confirm(client, before)
        if problem is None:
            return reply
        if problem.unanswered:  # too few sentinels answer: asking again would not help
            logger.debug("lease release of %s not confirmed by the sentinels: %s", key, problem)
            return lost
        logger.warning(
            "lease release of %s not confirmed by the sentinels (%s): sent to the "
            "primary they name",
            key,
            problem,
        )
    return lost


def _ask_all(
    manager: Any, asked: tuple[Address, ...], service: str, budget: float
) -> dict[Address, Address | str]:
    """Each sentinel of ``asked``'s primary for ``service``, or why it named none, asked of
    all at once within ``budget`` float seconds (:func:`celery_lease.store.sentinels.ask`)."""
    replies = sentinels.ask(
        [sentinels.client_of(manager, a) for a in asked],
        [("SENTINEL", "GET-MASTER-ADDR-BY-NAME", service)],
        budget,
    )
    named: dict[Address, Address | str] = {}
    for address, reply in zip(asked, replies, strict=True):
        found = reply if isinstance(reply, str) else _address(reply[0])
        named[address] = f"does not know {service!r}" if found is None else found
    return named


def _too_few(
    group: sentinels.Group, silent: dict[Address, str], answered: int, before: Address
) -> PrimaryUnconfirmed:
    """The error for a write that too few of the group's sentinels confirmed, naming the
    sentinels that do not answer (addresses only)."""
    quiet = replace(group, silent=tuple({**dict(group.silent), **silent}.items()))
    names = tuple(dict.fromkeys(sentinels.named(a) for a, _ in quiet.silent))
    return PrimaryUnconfirmed(
        f"only {answered} of the {len(group.members)} sentinels of the group answered (a "
        f"majority, {group.majority}, must name the primary; not answering: "
        f"{quiet.describe_silent() or 'none'}): whether {before[0]}:{before[1]} is still the "
        f"primary cannot be known",
        unanswered=names,
    )


def _address(reply: Any) -> Address | None:
    if not isinstance(reply, (list, tuple)) or len(reply) != 2:
        return None  # an error, or a sentinel that does not know the service
    host, port = reply
    try:
        return (host.decode() if isinstance(host, bytes) else str(host), int(port))
    except (TypeError, ValueError):
        return None


def _rediscover(pool: Any) -> None:
    """Make the next connection of ``pool`` go to the primary the sentinels name now."""
    try:
        pool.get_master_address()  # drops idle connections to the old primary when it moved
    except RedisError:
        pool.reset()  # no primary found yet: every connection is made afresh


def confirmed_grant(client: Any, send: Callable[[], Any]) -> Any:
    """``send()`` a grant's script (its reply ``[granted, ...]``) and, for a Sentinel-managed
    ``client``, count a grant only once :func:`confirm` says it landed on the primary the
    sentinels name: a grant whose write found the new primary as it went is sent once more,
    where it can be confirmed (the script recognises its own token). Returns the reply.

    Raises:
        PrimaryUnconfirmed: the grant could not be confirmed; the caller releases the token
            (it may hold the key), as :func:`celery_lease.core.lifecycle.take` does.
        redis.exceptions.RedisError: what ``send`` raises.
    """
    if not managed(client):
        return send()
    for attempt in (1, 2):
        before = written_to(client)
        reply = send()
        if not reply[0]:
            break
        problem = confirm(client, before)
        if problem is None:
            break
        if not (problem.moved_during_write and attempt == 1):
            raise problem
    return reply
