"""The release into a cooldown (``lease_cooldown``): the key stays taken for a while after an
execution ended, as a cooldown record written by the release itself.

The record is the lease value with ``"cooldown_until_ms"`` in its holder JSON
(:attr:`celery_lease.store.value.Holder.cooldown_until`) and the cooldown as its lifetime, on the
store's clock (``scripts/cooldown/release_cooldown-2.lua``; docs/reference/scripts.md says why
each step is safe). An acquire finds it held as by any holder; ``celery lease ls`` lists it and
``celery lease release`` ends it (:func:`celery_lease.store.revoke`: the record keeps the
holder's token).
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from redis.exceptions import RedisError

from ..base.keys import fence_key
from . import lua, primary, routing
from .protocol import FENCE_COUNTER_EXTRA_MS

__all__ = ["release_into_cooldown"]

logger = logging.getLogger("celery_lease")

_release_cooldown = lua.load("cooldown/release_cooldown-2.lua")


def release_into_cooldown(client: redis.Redis, key: str, token: str, cooldown_ms: int) -> bool:
    """Release lease ``key`` held by ``token`` into a cooldown of ``cooldown_ms`` (int
    milliseconds, > 0): in one script, the key becomes a cooldown record that expires after
    the cooldown (the store's clock), so that no copy starts in between. Answers as
    :func:`celery_lease.store.release` does: True when released (now, or by an earlier call
    with ``token``: a repeat does not start the cooldown again), False when ``token`` no longer
    held the key (no cooldown is written then).

    A store out of memory (``maxmemory``) refuses the record: the lease is released without a
    cooldown (True), and a warning names the fix.

    The idea: sidekiq-unique-jobs' ``until_expired`` lock and Oban's uniqueness ``period``
    (docs/howto/shaping/cooldown.md compares them).

    On a Sentinel-managed client a release that found its token counts only once the sentinels
    confirm the node that answered it, as :func:`celery_lease.store.release` does
    (:func:`celery_lease.store.primary.released`): a cooldown written on a primary a failover
    demoted would be lost with it, and its "released" may hide a loss; it is sent again to
    the primary they name (token-checked: a repeat writes nothing), whose answer counts.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    keys, argv = (key, fence_key(key)), (token, cooldown_ms, FENCE_COUNTER_EXTRA_MS)

    def send() -> Any:
        try:
            return _release_cooldown(client, keys, argv)
        except RedisError as exc:
            raise routing.note(exc, client, key) from None

    reply = primary.released(client, key, send, bool, 0)  # 1 and a refusal's text: released
    if isinstance(reply, (bytes, str)):  # released, the record refused: the server's reason
        text = reply.decode() if isinstance(reply, bytes) else reply
        logger.warning(
            "lease %s released without its cooldown: the store refused the "
            "cooldown record (%s), so a copy may start at once. Fix: free memory "
            "on the store (maxmemory)",
            key,
            text,
        )
        return True
    return bool(reply)
