"""Reading back what the store holds, and beat's last-run record.

- A lease's value and lifetime, for ``celery lease ls`` / ``show``: :func:`read` (one key,
  both from the same instant) and :func:`read_many` (a batch, one round trip).
- Beat's last-run record (``<beat lease key>:last-run``, a hash of entry name -> the store's
  clock at its last send, epoch seconds): :func:`record_run` stamps it inside the store
  (``record_run-1.lua``), :func:`last_run_ages` reads how long ago each entry ran on that same
  clock (``last_runs-1.lua``). No host's wall clock is written, so beats on hosts whose clocks
  disagree still agree on when an entry last ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import lua

__all__ = ["last_run_ages", "read", "read_many", "record_run"]

_record_run = lua.load("record_run-1.lua")
_last_runs = lua.load("last_runs-1.lua")


def read(client: Any, key: str) -> tuple[bytes | None, int]:
    """``(value, pttl)`` of ``key``, read in one ``MULTI`` (the same instant): ``None`` and a
    negative ``pttl`` when it is absent; ``pttl`` is int milliseconds, -1 without a lifetime.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    pipe = client.pipeline(transaction=True)
    pipe.get(key)
    pipe.pttl(key)
    value, pttl = pipe.execute()
    return value, int(pttl)


def read_many(client: Any, keys: Sequence[str]) -> list[tuple[bytes | None, int]]:
    """``(value, pttl)`` of each of ``keys``, in one round trip (one per primary on a cluster).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
        pipe.pttl(key)
    replies = pipe.execute()
    return [(replies[2 * i], int(replies[2 * i + 1])) for i in range(len(keys))]


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
    clock (so no host's wall clock enters it), as of the moment the store answered; stamps
    that are not numbers are left out, one ahead of the store's clock counts as 0.0.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    seconds, micros, fields = _last_runs(client, [state_key], [])
    now = int(seconds) + int(micros) / 1e6
    ages = {}
    for name, value in zip(fields[::2], fields[1::2], strict=True):
        try:
            stamp = float(value)
        except ValueError:
            continue
        ages[name.decode() if isinstance(name, bytes) else str(name)] = max(now - stamp, 0.0)
    return ages
