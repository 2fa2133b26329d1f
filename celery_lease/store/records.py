"""Reading back what the store holds, and beat's last-run record.

- A lease's value and lifetime, for ``celery lease ls`` / ``show``: :func:`read` (one key,
  both from the same instant) and :func:`read_many` (a batch, one round trip).
- Beat's last-run record (``<beat lease key>:last-run``, a hash of entry name -> epoch
  seconds): :func:`record_run` and :func:`last_runs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["last_runs", "read", "read_many", "record_run"]


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


def record_run(client: Any, state_key: str, name: str, at: float) -> None:
    """Record that beat sent entry ``name`` at ``at`` (epoch float seconds).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    client.hset(state_key, name, repr(at))


def last_runs(client: Any, state_key: str) -> dict[str, float]:
    """Entry name -> epoch float seconds of its last recorded send; unreadable entries are
    left out.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    runs = {}
    for name, value in client.hgetall(state_key).items():
        try:
            runs[name.decode() if isinstance(name, bytes) else str(name)] = float(value)
        except ValueError:
            continue
    return runs
