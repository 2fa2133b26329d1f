"""Reading back what the store holds, and beat's last-run record.

- A lease's value and lifetime, for ``celery lease ls`` / ``show``: :func:`read` (one key,
  both from the same instant) and :func:`read_many` (a batch, one round trip). A key of
  another type than a string is read as :class:`~celery_lease.store.value.OtherType` (no
  ``WRONGTYPE`` error reaches the caller): a key celery-lease did not write.
- Beat's last-run record (``<beat lease key>:last-run``, a hash of entry name -> the store's
  clock at its last send, epoch seconds): :func:`record_run` stamps it inside the store
  (``beat/record_run-1.lua``), :func:`last_run_ages` reads how long ago each entry ran on that same
  clock (``beat/last_runs-1.lua``). No host's wall clock is written, so beats on hosts whose clocks
  disagree still agree on when an entry last ran.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from . import lua
from .errors import is_wrong_type
from .value import OtherType

__all__ = ["Found", "last_run_ages", "read", "read_many", "record_run"]

#: What a read of ``key`` finds: its bytes, a key of another type, or None when absent.
Found = bytes | OtherType | None

_record_run = lua.load("beat/record_run-1.lua")
_last_runs = lua.load("beat/last_runs-1.lua")


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
    return [
        (_checked(client, key, replies[2 * i]), int(_raised(replies[2 * i + 1])))
        for i, key in enumerate(keys)
    ]


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


def record_run(client: Any, state_key: str, name: str, lifetime_ms: int) -> float:
    """Record that beat sent entry ``name`` now, stamped with the store's clock (``TIME``), and
    keep the record for at least ``lifetime_ms`` (int milliseconds) more.

    Returns:
        The stamp written: the server's clock, epoch float seconds.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    return float(_record_run(client, [state_key], [name, int(lifetime_ms)]))


def last_run_ages(client: Any, state_key: str) -> dict[str, float]:
    """Entry name -> float seconds since its last recorded send, both ends on the store's
    clock (so no host's wall clock enters it), as of the moment the store answered. Entries
    that are not a finite number, or whose name is not UTF-8, are left out, and a key of
    another type than a hash reads as no record at all; a stamp ahead of the store's clock
    counts as 0.0.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    seconds, micros, fields = _last_runs(client, [state_key], [])
    now = int(seconds) + int(micros) / 1e6
    ages = {}
    for name, value in zip(fields[::2], fields[1::2], strict=True):
        try:
            stamp = float(value)
            text = name.decode() if isinstance(name, bytes) else str(name)
        except (ValueError, TypeError, UnicodeDecodeError):
            continue
        if math.isfinite(stamp):
            ages[text] = max(now - stamp, 0.0)
    return ages
