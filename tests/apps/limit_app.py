"""The leased tasks of the ``lease_limit`` tests, on the fault tests' app (``lease_app``: same
environment, same ``journal``).

Each task counts the executions of its tag running at once in the broker's Redis
(``running:<tag>``, ``INCR`` at the start, ``DECR`` at the end) and journals the count it saw at
its start, so a test reads the most that ever ran at once.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from celery_lease import LeasedTask, LeaseLost
from tests.apps.lease_app import _journal, app, record

__all__ = ["app"]


#: What every task here shares: a bound leased task, its key the tag.
_COMMON: dict[str, Any] = {"shared": False, "bind": True, "base": LeasedTask, "lease_key": ("tag",)}


def _run(task: Any, tag: str, seconds: float, mode: str, **noted: Any) -> str:
    running = _journal.incr(f"running:{tag}")
    record("start", tag, running=running, limit=task.lease.limit, **noted)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.02 if mode == "chunks" else min(0.2, seconds))
            task.lease.check()
    except LeaseLost as exc:
        record("lost", tag, cause=exc.cause)
        raise
    finally:
        _journal.decr(f"running:{tag}")
    record("end", tag)
    return tag


@app.task(**_COMMON, name="limit.retry", lease_limit=3, lease_on_conflict="retry", max_retries=0)
def limited_retry(self: Any, tag: str, seconds: float, mode: str = "sleep") -> str:
    """Up to 3 at once per tag; the others look again (using up no retry: max_retries=0)."""
    return _run(self, tag, seconds, mode)


@app.task(**_COMMON, name="limit.skip", lease_limit=3)
def limited_skip(self: Any, tag: str, seconds: float, mode: str = "sleep") -> str:
    """Up to 3 at once per tag; the others are skipped."""
    return _run(self, tag, seconds, mode)


def _tenant_limit(tenant: str, seconds: float) -> int:
    return 2 if tenant == "small" else 4


@app.task(**{**_COMMON, "lease_key": ("tenant",)}, name="limit.tenant", lease_limit=_tenant_limit)
def per_tenant(self: Any, tenant: str, seconds: float) -> str:
    """2 at once for tenant ``small``, 4 for any other (a callable limit)."""
    return _run(self, tenant, seconds, "sleep")


@app.task(**_COMMON, name="limit.dedupe", lease_limit=2, lease_dedupe=True)
def limited_dedupe(self: Any, tag: str, seconds: float, mode: str = "sleep") -> str:
    """Up to 2 at once per tag, and at most one copy waiting (``lease_dedupe``)."""
    return _run(self, tag, seconds, mode)


#: The waiting policies with a limit: a TTL long enough (renewed every 2 s) that a run started
#: by polling would start seconds after a release, not at it.
_WAITING: dict[str, Any] = {**_COMMON, "lease_limit": 2, "lease_ttl": 6.0}


@app.task(**_WAITING, name="limit.queue", lease_on_conflict="queue")
def limited_queue(self: Any, tag: str, seconds: float, seq: int = 0) -> str:
    """Up to 2 at once per tag; the others wait in the key's line, each run at a release."""
    return _run(self, tag, seconds, "chunks", seq=seq)


@app.task(**_WAITING, name="limit.retry_line", lease_on_conflict="retry", max_retries=0)
def limited_retry_line(self: Any, tag: str, seconds: float, seq: int = 0) -> str:
    """Up to 2 at once per tag; the others wait in the line (no retry used: max_retries=0)."""
    return _run(self, tag, seconds, "chunks", seq=seq)


@app.task(**_WAITING, name="limit.coalesce", lease_on_conflict="coalesce")
def limited_coalesce(self: Any, tag: str, seconds: float, seq: int = 0) -> str:
    """Up to 2 at once per tag; the duplicates meanwhile become one pending run (latest
    arguments), run when a slot frees."""
    return _run(self, tag, seconds, "chunks", seq=seq)


if os.environ.get("KILL_BEFORE_HANDOFF_PUBLISH") == "1":
    # The worker dies between a slot's release (which reserved the freed slot for the line's
    # head, in the same script) and the publish of that run: the publish is lost.
    from celery_lease.policies import handoff as _handoff

    _publish_released = _handoff.publish_released

    def _die_before_publishing(task: Any, lease: Any, got: Any) -> None:
        if got is not None and got.handed is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        _publish_released(task, lease, got)

    _handoff.publish_released = _die_before_publishing  # type: ignore[assignment]
