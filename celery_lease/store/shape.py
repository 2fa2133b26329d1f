"""The shape of a lease key: one holder (the plain lease) or ``N`` slots (``lease_limit=N``).

Every caller that takes, releases or revokes a lease asks its key's shape, so the difference
between a plain key and a slotted one (:mod:`celery_lease.store.slots`) lives here alone:
:data:`PLAIN` for a limit of 1, :func:`key_shape` for any limit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from . import protocol, slots

__all__ = ["PLAIN", "KeyShape", "key_shape"]

Release = Callable[[redis.Redis, str, str], bool]


@dataclass(eq=False)  # compared by identity: PLAIN is one object
class KeyShape:
    """How one kind of key is taken and given back (not frozen: a test may wrap a call).

    Attributes:
        limit: how many holders the key has room for (int >= 1; 1: the plain lease).
        acquire: the grant, called as :func:`celery_lease.store.acquire` is (same arguments,
            same :class:`~celery_lease.store.AcquireResult`).
        release: the token-checked release, ``release(client, key, token) -> bool``.
        release_and_wake: the release that also wakes a waiting hold.
        revoke: the token-checked delete an operator sends (``celery lease revoke``).
        pass_turn: ``pass_turn(client, key) -> bool``, what a waiting hold that stops waiting
            sends: wake the next waiter if the key has room (is free; has a free slot).
    """

    limit: int
    acquire: Callable[..., Any]
    release: Release
    release_and_wake: Release
    revoke: Release
    pass_turn: Callable[[redis.Redis, str], bool]


#: The plain lease: one holder, the key's value is its token.
PLAIN = KeyShape(
    1,
    protocol.acquire,
    protocol.release,
    protocol.release_and_wake,
    protocol.revoke,
    protocol.pass_turn,
)


def key_shape(limit: int, same_task_id: bool = True) -> KeyShape:
    """The shape of a key with room for ``limit`` holders (int >= 1): :data:`PLAIN` at 1,
    else ``limit`` slots, each leased on its own. ``same_task_id=False`` (a hold, whose task
    id is a thread name) takes a slot whatever task id holds the others."""
    if limit == 1:
        return PLAIN
    return KeyShape(
        limit,
        slots.SlotGrant(limit, same_task_id),
        slots.release_slot,
        slots.release_slot_and_wake,
        slots.revoke_slot,
        functools.partial(slots.pass_slot_turn, limit=limit),
    )
