"""Once per window (``lease_cooldown``): which release an execution's ending sends.

An execution that ended with a success (or, with ``lease_cooldown_after="any"``, with a
failure too) releases its lease into a cooldown record
(:func:`celery_lease.store.release_into_cooldown`): the key stays taken for ``lease_cooldown``
seconds, and a copy that starts meanwhile meets the task's ``lease_on_conflict``. A retry
(``self.retry()``) is not an ending: its execution goes on in the retry, and releases as usual.
Every other ending, and every task without ``lease_cooldown``, sends the plain release.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from .. import store
from ..core import lifecycle
from ..settings.config import LeaseOptions
from .base import Policy

if TYPE_CHECKING:
    from ..core.lease import Lease

__all__ = ["ENDINGS", "Cooldown", "release_for"]

#: How an execution's body ended, as :func:`release_for` takes it.
ENDINGS = ("success", "failure", "retry")


def release_for(options: LeaseOptions, ending: str) -> Callable[[redis.Redis, str, str], bool]:
    """The token-checked release for an execution of a task with ``options`` whose body ended
    with ``ending`` (one of :data:`ENDINGS`): :func:`celery_lease.store.release`, or the release
    into a cooldown of ``options.cooldown`` seconds.

    Raises:
        ValueError: ``ending`` is not one of :data:`ENDINGS`.
    """
    if ending not in ENDINGS:
        raise ValueError(f"ending={ending!r} is not one of {ENDINGS}")
    if (
        options.cooldown is None
        or ending == "retry"
        or (ending == "failure" and options.cooldown_after != "any")
    ):
        return store.release
    cooldown_ms = round(options.cooldown * 1000)

    def release(client: redis.Redis, key: str, token: str) -> bool:
        return store.release_into_cooldown(client, key, token, cooldown_ms)

    return release


class Cooldown(Policy):
    """``lease_cooldown``: an ending it counts releases into a cooldown record."""

    name = "lease_cooldown"
    order = 10  # before the hand-over: a key in its cooldown is handed to nobody

    def applies(self, options: LeaseOptions, limit: Any) -> bool:
        return options.cooldown is not None

    def release(self, task: Any, lease: Lease, ending: str, wait: bool) -> lifecycle.Ending | None:
        release = release_for(lease.options, ending)
        if release is store.release or lease.limit > 1:  # one slot has no cooldown
            return None
        return lifecycle.end(lease, sender=task, release=release, wait=wait)
