"""A library's tasks: a plain shared task and an autoretry task with a bound ``self``."""

from __future__ import annotations

import time

from celery import shared_task


@shared_task(name="thirdparty.close_day")
def close_day(day: str, note: str = "") -> str:
    """Close one day's books (slowly)."""
    time.sleep(float(note or 0))
    return f"closed {day}"


class Flaky(Exception):
    """Raised by ``sync_account`` on its first tries."""


@shared_task(
    name="thirdparty.sync_account",
    bind=True,
    autoretry_for=(Flaky,),
    retry_backoff=False,
    default_retry_delay=0.05,
    max_retries=5,
)
def sync_account(self, account_id: int, fail_times: int = 0) -> dict:  # type: ignore[no-untyped-def]
    """Sync one account; fails ``fail_times`` times first (autoretry retries it)."""
    if self.request.retries < fail_times:
        raise Flaky(account_id)
    return {
        "account_id": account_id,
        "retries": self.request.retries,
        "fencing_token": self.lease.fencing_token if self.lease else None,
    }
