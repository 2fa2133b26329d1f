"""Property 9 of the checker, newest wins (``lease_on_conflict="preempt"``), read from the
take-overs the newcomers recorded (:class:`~example_project.chaos.history.Preemption`).

For each take-over of a holder ``a`` by a newcomer ``b``:

- ``preempted-write-accepted``: no write of ``a`` was accepted once the guard had accepted one
  of ``b`` (the guard's order, by write id): the old holder's fenced writes after the take-over
  are refused.
- ``overlap-too-long``: ``a`` stopped acting (its last write started, its loss was noted, its
  body ended) no later than ``lease_preempt_grace`` + one renewal interval (TTL / 3) +
  :data:`SLACK` after the take-over was done (``at``: the script had run by then). The notice
  tells ``a`` at once; a lost notice leaves it to the renewal. A fault in between (a paused
  store or worker, a black hole) excuses it: neither could reach ``a`` then.
- ``preempted-not-told-so``: an ``a`` that caught ``LeaseLost`` caught it with cause
  ``preempted``, whether the notice or the renewal told it; excused when one of ``a``'s writes
  was refused first (the job then raises its own ``lease.lose()``), when ``b`` was taken over
  in turn before ``a`` learnt it (the key no longer names ``a``'s token), and when a fault
  overlaps.

Only what the recorded brackets prove is concluded; each violation carries its evidence.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict
from typing import Any

from .history import Execution, History, Preemption

__all__ = ["SLACK", "preemptions", "summary"]

#: Float seconds allowed on top of grace + renewal interval: the body's step between checks
#: (0.3 s), a renewal's round trip and a loaded machine's scheduling.
SLACK = 1.5


def _end(a: Execution, history: History) -> float:
    """The last moment ``a`` is known to have been acting."""
    writes = [w.started_at for w in history.writes if w.token == a.token]
    return max([t for t in (a.lost_at, a.body_end) if t is not None] + writes + [a.grant_upper])


def _faulted(history: History, start: float, end: float) -> bool:
    return any(f.started_at <= end and f.ended_at >= start for f in history.faults)


def _pairs(history: History) -> list[tuple[Preemption, Execution, Execution | None]]:
    runs = {e.token: e for e in history.executions}
    return [
        (p, runs[p.preempted], runs.get(p.token))
        for p in history.preemptions
        if p.preempted in runs
    ]


def preemptions(history: History) -> list[Any]:
    """Property 9's violations in ``history`` (``Violation`` objects of the checker)."""
    from .checker import Violation  # the checker imports this module inside check()

    found: list[Violation] = []
    bound = history.preempt_grace + history.ttl / 3 + SLACK
    taken_from = {p.preempted: p for p in history.preemptions}
    for p, a, b in _pairs(history):
        evidence = {
            "preemption": asdict(p),
            "preempted": asdict(a),
            "newcomer": asdict(b) if b else None,
        }
        mine = sorted(
            (w for w in history.writes if w.key == a.key and w.token in (a.token, p.token)),
            key=lambda w: w.id,
        )
        first_new = next((w.id for w in mine if w.token == p.token and w.accepted), None)
        late = [
            w
            for w in mine
            if w.token == a.token and w.accepted and first_new is not None and w.id > first_new
        ]
        if late:
            found.append(
                Violation(
                    9,
                    "preempted-write-accepted",
                    f"{a.key}: {a.token} (token {a.fence}) had {len(late)} write(s) accepted after "
                    f"the newcomer {p.token}'s first accepted write",
                    a.key,
                    {**evidence, "late_writes": [asdict(w) for w in late]},
                )
            )
        end = _end(a, history)
        if end - p.at > bound and not _faulted(history, p.at, end):
            found.append(
                Violation(
                    9,
                    "overlap-too-long",
                    f"{a.key}: {a.token} was still acting {end - p.at:.3f}s after {p.token} took "
                    f"the key over, past grace + TTL/3 + slack = {bound:.3f}s",
                    a.key,
                    evidence,
                )
            )
        refused_first = any(w.token == a.token and not w.accepted for w in history.writes)
        retaken = taken_from.get(p.token)
        told_at = a.lost_at if a.lost_at is not None else end
        if (
            a.outcome == "lost"
            and a.lost_cause != "preempted"
            and not refused_first
            and not (retaken is not None and retaken.at <= told_at + SLACK)
            and not _faulted(history, p.at - history.ttl, told_at)
        ):
            found.append(
                Violation(
                    9,
                    "preempted-not-told-so",
                    f"{a.key}: {a.token} was taken over by {p.token} but caught LeaseLost with "
                    f"cause {a.lost_cause!r}, not 'preempted' (notified={p.notified})",
                    a.key,
                    evidence,
                )
            )
    return found


def summary(history: History) -> dict[str, Any]:
    """Counts of the take-overs: how many, how many were notified, how the preempted
    executions ended, and how long each went on after its take-over (float seconds)."""
    pairs = _pairs(history)
    overlaps = [max(_end(a, history) - p.at, 0.0) for p, a, _ in pairs]
    return {
        "preemptions": len(history.preemptions),
        "preemptions_not_notified": sum(1 for p in history.preemptions if p.notified == 0),
        "preempted_by_outcome": dict(
            Counter(
                f"{a.outcome}:{a.lost_cause}" if a.outcome == "lost" else str(a.outcome)
                for _, a, _ in pairs
            )
        ),
        "preempted_acting_after_take_over_s": {
            "median": round(statistics.median(overlaps), 3) if overlaps else None,
            "max": round(max(overlaps), 3) if overlaps else None,
        },
    }
