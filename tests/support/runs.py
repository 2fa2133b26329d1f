"""A journal of task runs in a Redis list, for the test apps whose tasks record each run."""

from __future__ import annotations

import json
from typing import Any

import redis


def record(url: str, tag: str, **fields: Any) -> None:
    """Append ``fields`` (JSON) to the list ``runs:<tag>`` of the Redis at ``url``."""
    client = redis.Redis.from_url(url)
    try:
        client.rpush(f"runs:{tag}", json.dumps(fields))
    finally:
        client.close()


def read(url: str, tag: str) -> list[dict[str, Any]]:
    """What the runs of ``tag`` recorded at ``url``, in order."""
    client = redis.Redis.from_url(url)
    try:
        return [json.loads(x) for x in client.lrange(f"runs:{tag}", 0, -1)]
    finally:
        client.close()


def store_time(url: str) -> float:
    """The Redis server's clock at ``url``: float seconds since the epoch."""
    client = redis.Redis.from_url(url)
    try:
        seconds, micros = client.time()
        return float(seconds + micros / 1e6)
    finally:
        client.close()
