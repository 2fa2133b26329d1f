"""Reading back what the store holds, and beat's last-run record.

- A lease's value and lifetime, for ``celery lease ls`` / ``show``: :func:`read` (one key,
  both from the same instant) and :func:`read_many` (a batch, one round trip). A key of
  another type than a string is read as :class:`~celery_lease.store.value.OtherType` (no
  ``WRONGTYPE`` error reaches the caller): a key celery-lease did not write.
- Beat's last-run record (``<beat lease key>:last-run``, a hash of entry name -> epoch
  seconds): :func:`record_run` and :func:`last_runs`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError

from .errors import is_wrong_type
from .value import OtherType

__all__ = ["Found", "last_runs", "read", "read_many", "record_run"]

#: What a read of ``key`` finds: its bytes, a key of another type, or None when absent.
Found = bytes | OtherType | None


def _other_type(client: Any, key: str) -> OtherType:
    kind = client.type(key)
    return OtherType(kind.decode() if isinstance(kind, bytes) else str(kind))


def read(client: Any, key: str) -> tuple[Found, int]:
    """``(value, pttl)`` of ``key``, read in one ``MULTI`` (the same instant): ``None`` and a
    negative ``pttl`` when it is absent, an :class:`OtherType` for a key of another type;
    ``pttl`` is int milliseconds, -1 without a lifetime.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    pipe = client.pipeline(transaction=True)
    pipe.get(key)
    pipe.pttl(key)
    value, pttl = pipe.execute(raise_on_error=False)
    return _checked(client, key, value), int(_raised(pttl))


def read_many(client: Any, keys: Sequence[str]) -> list[tuple[Found, int]]:
    """``(value, pttl)`` of each of ``keys`` (as :func:`read`), in one round trip (one per
    primary on a cluster; one more for each key of another type).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
        pipe.pttl(key)
    replies = pipe.execute(raise_on_error=False)
    return [(_checked(client, key, replies[2 * i]), int(_raised(replies[2 * i + 1])))
            for i, key in enumerate(keys)]


def _raised(reply: Any) -> Any:
    if isinstance(reply, Exception):
        raise reply
    return reply


def _checked(client: Any, key: str, reply: Any) -> Found:
    """A GET's reply: an error reply raised, except ``WRONGTYPE`` (then the key's type)."""
    if isinstance(reply, Exception):
        if is_wrong_type(reply):
            return _other_type(client, key)
        raise reply
    return reply if reply is None or isinstance(reply, bytes) else str(reply).encode()


def record_run(client: Any, state_key: str, name: str, at: float) -> None:
    """Record that beat sent entry ``name`` at ``at`` (epoch float seconds).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    client.hset(state_key, name, repr(at))


def last_runs(client: Any, state_key: str) -> dict[str, float]:
    """Entry name -> epoch float seconds of its last recorded send; entries that are not
    ``repr(float)`` of a finite time, or whose name is not UTF-8, are left out, and a key of
    another type than a hash reads as no record at all.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    try:
        found = client.hgetall(state_key)
    except ResponseError as exc:
        if is_wrong_type(exc):
            return {}
        raise
    runs = {}
    for name, value in found.items():
        try:
            at = float(value)
            text = name.decode() if isinstance(name, bytes) else str(name)
        except (ValueError, TypeError, UnicodeDecodeError):
            continue
        if math.isfinite(at):
            runs[text] = at
    return runs
