"""The doctor's check of a Sentinel store's sentinels: each one that does not answer, named,
and whether leases can be granted now (a majority of the group the live sentinels know
answers: :mod:`celery_lease.store.sentinels`). The worker's start check logs it too."""

from __future__ import annotations

from typing import Any

from redis.exceptions import RedisError

from ...store import sentinels
from ...store.url import safe_url
from ..finding import Finding
from ..inspection import client

__all__ = ["check_sentinels", "sentinel_finding"]


def check_sentinels(url: str, app: Any = None) -> list[Finding]:
    """How the sentinels of the store at ``url`` answer (:func:`sentinel_finding`); nothing for
    a store that is not Sentinel-managed. Asked even when the store cannot be reached: the
    sentinels may be why."""
    if not url.lower().startswith("sentinel://"):
        return []
    try:
        group = sentinels.look_for(client(url, app))
    except RedisError:  # the client could not be built: check_store says why
        return []
    return [] if group is None else [sentinel_finding(f"store {safe_url(url)}", group)]


def sentinel_finding(subject: str, group: sentinels.Group) -> Finding:
    """OK when every sentinel answers; WARN naming those that do not while a majority of the
    group answers (leases are granted); FAIL when it does not (every grant is refused)."""
    count = (
        f"{len(group.answering)} of the {len(group.members)} sentinels of the group answer "
        f"(a majority is {group.majority})"
    )
    if not group.silent:
        return Finding("ok", subject, f"{count}: leases can be granted")
    silent = f"sentinels not answering: {group.describe_silent()}"
    more = [fix for fix in (_forget_fix(group), _listing_fix(group)) if fix]
    if group.grantable:
        return Finding(
            "warn",
            subject,
            f"{silent}; leases can be granted: {count}",
            "; ".join(["restart or replace the sentinels that do not answer", *more]),
        )
    return Finding(
        "fail",
        subject,
        f"{silent}; leases cannot be granted: {count}, every grant is refused "
        f"(PrimaryUnconfirmed) and tasks follow lease_on_store_error",
        "; ".join(
            [
                "restart the sentinels that do not answer, or mend the network to them, "
                "until a majority of the group answers",
                *more,
            ]
        ),
    )


def _forget_fix(group: sentinels.Group) -> str:
    """How to drop a member that is gone for good ("" when every silent one is no member):
    sentinels never forget one by themselves, and it counts towards the majority."""
    if not any(address in group.members for address, _ in group.silent):
        return ""
    return (
        "a sentinel removed for good stays a member of the group (and counts towards its "
        "majority) until SENTINEL RESET <master_name> is sent to each live sentinel"
    )


def _listing_fix(group: sentinels.Group) -> str:
    """How to mend ``lease_backend`` when it lists sentinels outside the group or misses
    members ("" when it lists the group)."""
    stale = [a for a in group.listed if a not in group.members]
    missing = [a for a in group.members if a not in group.listed]
    if not stale and not missing:
        return ""
    members = ", ".join(sentinels.named(a) for a in sorted(group.members))
    return f"list the group's sentinels in lease_backend ({members})"
