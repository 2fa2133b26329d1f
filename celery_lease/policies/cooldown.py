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

import redis

from .. import store
from ..settings.config import LeaseOptions

__all__ = ["ENDINGS", "release_for"]

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
