"""The doctor's check of the waiting copies' claims (``lease_dedupe``): each listed with its
age, a claim that outlived what its lifetime allows flagged (docs/howto/shaping/dedupe.md)."""

from __future__ import annotations

from typing import Any

from redis.exceptions import RedisError

from ...store.url import safe_url
from ..finding import Finding
from ..inspection import ClaimInfo, client, scan_claims

__all__ = ["check_claims", "claim_findings"]

#: One finding: ``(level, message, fix)``, as :class:`celery_lease.ops.finding.Finding` holds it.
Found = tuple[str, str, str]

#: Float seconds a claim may be older than its lifetime before it counts as extended (the
#: server expires keys lazily and in sampled sweeps, so a lapsed key may linger briefly).
_SLACK = 1.0


def check_claims(url: str, prefixes: set[str], app: Any = None) -> list[Finding]:
    """The waiting copies' claims (``lease_dedupe``) under ``prefixes`` on the store at
    ``url``, with their age; one that outlived its lifetime or its message is flagged
    (:func:`claim_findings`)."""
    subject = f"store {safe_url(url)}"
    return [
        Finding(level, subject, message, fix)
        for level, message, fix in claim_findings(url, prefixes, app)
    ]


def claim_findings(url: str, prefixes: set[str], app: Any = None) -> list[Found]:
    """The waiting copies' claims under ``prefixes`` on the store at ``url``, with their age,
    as ``(level, message, fix)`` (:func:`check_claims` words them).

    A claim without a lifetime, or older than the lifetime it was given, is a fault: it folds
    every publish of its key onto a copy that may never run. One whose task the result
    backend knows as started or finished outlived its message (it should have been cleared;
    it lapses at its lifetime). Nothing is reported when there are none, or when the store
    does not answer (:func:`celery_lease.ops.doctor.check_store` says so).
    """
    found: list[Found] = []
    for prefix in sorted(prefixes):
        try:
            claims = list(scan_claims(client(url, app), prefix))
        except RedisError:
            return found
        found += [f for c in claims if (f := _judge(c, app)) is not None]
        if claims:
            oldest = max(c.age for c in claims)
            found.append(
                (
                    "info",
                    f"{len(claims)} waiting copy claim(s) under {prefix}:* "
                    f"(lease_dedupe), the oldest {oldest:.1f}s old",
                    "",
                )
            )
    return found


def _judge(c: ClaimInfo, app: Any) -> Found | None:
    where = f"the claim of waiting copy {c.task}[{c.task_id}] at {c.key}:waiting"
    if c.ttl < 0 or c.age > c.lifetime + _SLACK:
        how = "it has no expiry" if c.ttl < 0 else "its expiry was extended"
        return (
            "fail",
            f"{where} is {c.age:.0f}s old, past its lifetime of {c.lifetime:g}s "
            f"({how}): publishes of the key are folded onto a copy that may never "
            f"run",
            f"redis-cli DEL {c.key}:waiting (a message of it still in the queue runs all the same)",
        )
    state = _state(app, c.task_id)
    if state not in (None, "PENDING"):
        return (
            "warn",
            f"{where} outlived its message (the result backend has the task "
            f"{state}); it lapses in {c.ttl:.0f}s",
            "a worker before lease_dedupe, "
            "or a claim the store could not clear: docs/howto/shaping/dedupe.md says how "
            "a claim ends",
        )
    return None


def _state(app: Any, task_id: str) -> str | None:
    """The result backend's state of ``task_id``; None without a backend, or on an error."""
    if app is None or not app.conf.get("result_backend"):
        return None
    try:
        return str(app.AsyncResult(task_id).state)
    except Exception:
        return None
