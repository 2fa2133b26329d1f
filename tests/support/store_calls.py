"""Helpers for tests that drive :mod:`celery_lease.core.lifecycle` in process against real Redis.

Nothing here replaces the store: the real calls run, and only their replies may be withheld,
or their arguments recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from celery_lease import LeaseLost, store

__all__ = ["NoTarget", "lose_first_reply", "spy"]


class NoTarget:
    """A loss target that interrupts nothing; it records what it was given."""

    mechanism = "none"

    def __init__(self) -> None:
        self.finished = False
        self.delivered: list[LeaseLost] = []

    def deliver(self, error: LeaseLost) -> bool:
        self.delivered.append(error)
        return True

    def finish(self) -> None:
        self.finished = True


def lose_first_reply(
    monkeypatch: pytest.MonkeyPatch, name: str, after: Callable[[], None]
) -> list[int]:
    """The first call of ``store.<name>`` runs on the server, then its reply is lost as a
    connection error (``after`` runs first); the later calls run unchanged. Returns a list
    that gets one element per call."""
    real = getattr(store, name)
    calls: list[int] = []

    def first_reply_lost(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        answer = real(*args, **kwargs)
        if len(calls) == 1:
            after()
            raise RedisConnectionError("reply lost")
        return answer

    monkeypatch.setattr(store, name, first_reply_lost)
    if hasattr(store.PLAIN, name):  # where lifecycle.take finds the plain lease's acquire
        monkeypatch.setattr(store.PLAIN, name, first_reply_lost)
    return calls


def spy(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[tuple[Any, ...]]:
    """Record the arguments of each call of ``owner.name`` (which still runs)."""
    real, calls = getattr(owner, name), []

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return calls
