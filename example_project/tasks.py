"""The example project's tasks: three ways a job must not run twice at once.

- :func:`sync_account`: leased per account (a subset of its arguments), writes through a fenced
  ledger so a stale holder's late write is refused;
- :func:`refresh_dashboard`: sent by Celery beat every ``DASHBOARD_PERIOD`` seconds and
  sometimes slower than that; a run sent while the previous one is still going is skipped;
- :func:`reindex`: a long job that saves a checkpoint when it loses its lease, so the next run
  resumes instead of starting over.

The "remote" work is simulated with sleeps so the example runs anywhere.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import redis

from celery_lease import Lease, LeasedTask, LeaseLost

from .celery_app import app, redis_url
from .fencing import RedisFencedStore

logger = logging.getLogger(__name__)

#: Simulated latency of one page of the remote API (float seconds).
PAGE_SECONDS = 0.2
#: Simulated time of one reindex batch (float seconds).
BATCH_SECONDS = 0.2


@functools.lru_cache(maxsize=1)
def downstream() -> RedisFencedStore:
    """The fenced store the tasks write to (Redis at ``REDIS_URL``, keys ``example:*``)."""
    client = redis.Redis.from_url(redis_url(), socket_timeout=5.0, socket_connect_timeout=5.0)
    return RedisFencedStore(client, prefix="example")


def held(task: LeasedTask) -> Lease:
    """The running execution's lease (``task.lease`` is ``None`` only outside an execution)."""
    lease = task.lease
    if lease is None:
        raise RuntimeError(f"{task.name} is not running as a leased execution")
    return lease


def _fenced_write(task: LeasedTask, record: str, value: str) -> None:
    """Write ``value`` to ``record`` with this execution's fencing token, or stop.

    Raises:
        LeaseLost: the store refused the token: a later holder of this lease has written, so
            this execution must stop acting as the holder.
    """
    lease = held(task)
    if not downstream().write(record, value, lease.fencing_token):
        raise lease.lose()  # recorded (log, signal, Flower) like a loss the heartbeat finds


def _remote_pages(account_id: int, since: str | None, page_size: int) -> Iterator[dict[str, Any]]:
    """Pretend to page through a remote API (three pages, :data:`PAGE_SECONDS` each)."""
    for number in range(3):
        time.sleep(PAGE_SECONDS)
        yield {"account": account_id, "since": since, "page": number, "size": page_size}


@app.task(base=LeasedTask, bind=True, lease_key=("account_id",))  # type: ignore[untyped-decorator]
def sync_account(
    self: LeasedTask, account_id: int, since: str | None = None, page_size: int = 100
) -> dict[str, Any]:
    """Copy one account's changes from a remote API into the ledger.

    The lease key is the account alone (``lease_key=("account_id",)``): ``sync_account(42)``
    and ``sync_account(42, since="2024-01-01")`` are the same job and never overlap, while
    ``sync_account(43)`` runs alongside them.

    Returns:
        ``{"account_id", "pages", "fencing_token"}``; a skipped duplicate returns the marker
        that :func:`celery_lease.is_skipped` recognises instead.
    """
    pages = 0
    for page in _remote_pages(account_id, since, page_size):
        _fenced_write(self, f"ledger:{account_id}", json.dumps(page))
        pages += 1
    return {"account_id": account_id, "pages": pages, "fencing_token": held(self).fencing_token}


@app.task(base=LeasedTask, bind=True, lease_key=())  # type: ignore[untyped-decorator]
def refresh_dashboard(self: LeasedTask, work_seconds: float | None = None) -> dict[str, Any]:
    """Rebuild the dashboard; beat sends this every ``DASHBOARD_PERIOD`` seconds.

    A run usually takes half to one and a half periods (``work_seconds``, or the
    ``DASHBOARD_WORK_SECONDS`` environment variable, fixes it; float seconds).
    ``lease_key=()`` gives the task one lease whatever its arguments, so the beat tick that
    arrives while a slow run is still going is skipped rather than run alongside it, and the
    slow run keeps its lease by renewal however long it takes.
    """
    if work_seconds is None and os.environ.get("DASHBOARD_WORK_SECONDS"):
        work_seconds = float(os.environ["DASHBOARD_WORK_SECONDS"])
    period = float(os.environ.get("DASHBOARD_PERIOD", "60"))
    seconds = random.uniform(0.5, 1.5) * period if work_seconds is None else work_seconds
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        time.sleep(min(1.0, max(seconds - (time.monotonic() - started), 0.0)))
    _fenced_write(self, "dashboard", json.dumps({"built_at": time.time()}))
    return {"seconds": round(time.monotonic() - started, 3)}


@app.task(base=LeasedTask, bind=True, lease_key=("index",))  # type: ignore[untyped-decorator]
def reindex(
    self: LeasedTask, index: str, total_batches: int = 50, restart: bool = False
) -> dict[str, Any]:
    """Rebuild a search index batch by batch, resuming from the last checkpoint.

    When the lease is lost (:class:`~celery_lease.LeaseLost` is raised inside the loop), the
    task saves how far it got and re-raises, so the execution is recorded as failed and the
    next run resumes there. The checkpoint is a fenced write: if a successor already holds the
    lease and has written, the stale checkpoint is refused and the successor's progress stands.

    Args:
        index: the index to rebuild (the lease key).
        total_batches: number of batches (int).
        restart: ignore the checkpoint and start from batch 0.

    Returns:
        ``{"index", "resumed_from", "batches"}``.
    """
    record = f"reindex:{index}"
    saved = downstream().read(record).value
    start = 0 if restart or saved is None else int(saved)
    start = 0 if start >= total_batches else start  # the last run finished: a new rebuild
    done = start
    try:
        for batch in range(start, total_batches):
            time.sleep(BATCH_SECONDS)  # index the batch
            done = batch + 1
            if done % 10 == 0 or done == total_batches:
                _fenced_write(self, record, str(done))
    except LeaseLost:
        kept = downstream().write(record, str(done), held(self).fencing_token)
        logger.warning(
            "reindex %s: lease lost after batch %d; checkpoint %s",
            index,
            done,
            "saved" if kept else "refused (a successor has moved on)",
        )
        raise
    return {"index": index, "resumed_from": start, "batches": done}
