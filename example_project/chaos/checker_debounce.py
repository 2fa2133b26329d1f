"""Property 11 of the checker: ``lease_debounce`` kept its word.

Every publish of the debounce job recorded its burst's task id (``Job.folded_onto``) and a
bracket around its decision in the store (``decided_lower``, ``decided_upper``). For each
burst (the jobs that name one task id):

- **once**: no two executions of the burst's task id both ended normally
  (``burst-ran-twice``), unless a fault emptied the store between them (a timer that then
  finds no record runs as published), or the store did not confirm the earlier one's
  release (it has no record that the run ran: a run that died before its release);
- **with the latest arguments**: the run's job (the arguments it ran with) is not one whose
  publish was surely decided before another publish of the same burst
  (``not-latest-arguments``), unless a fault emptied the store in between (the timer then
  runs with the arguments it was published with);
- **by the cap**: the run was granted by the burst's first publish plus
  ``lease_debounce_max`` plus :data:`SLACK`, unless a fault, or another execution of the key
  holding it past the cap, came in between (those are counted, not reported:
  ``ran-past-cap``);
- **never left waiting**: no burst record was left at the end older than its cap plus
  :data:`SLACK` (``burst-left-waiting``).

Never two running is property 6's rule, which holds for these keys too; a burst whose run
never happened is property 4's unresolved job.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict
from typing import Any

from .history import Execution, History, Job

__all__ = ["SLACK", "debounce", "lateness"]

#: Float seconds a burst's run may start past its cap (a busy pool, the timer's own trip)
#: beyond one TTL (a lost timer is published again one TTL past due by the sweep).
SLACK = 2.0


def _bursts(history: History) -> dict[str, list[Job]]:
    found: dict[str, list[Job]] = defaultdict(list)
    for job in history.jobs:
        if job.disposition == "debounced" and job.decided_upper is not None:
            found[job.folded_onto or job.task_id].append(job)
    return found


def first_publish(jobs: list[Job]) -> float:
    """When the first publish of a burst (``jobs``) was surely decided: float seconds."""
    return min(j.decided_upper or 0.0 for j in jobs)


def _excused(history: History, key: str, first: float, run: Execution) -> bool:
    """A fault between the first publish and the grant, or another execution of the key
    holding it past the cap (the burst waits for its release), makes lateness no promise
    broken."""
    deadline = first + history.debounce_cap
    if any(f.started_at <= run.grant_upper and f.ended_at >= first for f in history.faults):
        return True
    return any(
        e.key == key
        and e.token != run.token
        and e.grant_lower < run.grant_lower
        and (e.body_end is None or e.body_end > deadline)
        for e in history.executions
    )


def _ran_twice(history: History, done: list[Execution]) -> bool:
    """Two of a burst's runs that ended normally (``done``, in grant order) where the later
    one should not have run: the store confirmed the earlier one's release (``released`` is
    True, so it had the record that the run ran) and no fault emptied the store between them.
    A run whose release was not confirmed (the store paused past its TTL, so its lease had
    lapsed and a retried copy held the key when the release came) left no such record: for
    the store it is a run that died before its release, and a copy of it runs again, as
    documented (docs/howto/shaping/handover.md, "Crashes")."""
    return any(
        earlier.released is True and not _erased_between(history, earlier, later)
        for n, earlier in enumerate(done)
        for later in done[n + 1 :]
    )


def _erased_between(history: History, first: Execution, later: Execution) -> bool:
    """A fault that loses the store's data (:func:`~.checker.empties`) between two runs of one
    burst: a timer of it that arrives then finds no record, or the record as it was before
    the fire, and runs (as documented: a store that lost state cannot tell it ran). A failover
    to a node in sync is no excuse: every debounce decision counts only once the sentinels
    confirm the node that made it."""
    from .checker import empties  # the checker imports this module

    return any(
        empties(f) and f.ended_at >= first.grant_lower and f.started_at <= later.grant_upper
        for f in history.faults
    )


def lateness(history: History) -> list[float]:
    """Float seconds each burst's first run was granted after its first publish plus the cap
    (negative: before it), for the summary."""
    by_task = _runs_by_task(history)
    found = []
    for task_id, jobs in _bursts(history).items():
        runs = by_task.get(task_id)
        if runs:
            first = first_publish(jobs)
            found.append(
                round(
                    min(r.grant_upper for r in runs)
                    - first  # type: ignore[operator]
                    - history.debounce_cap,
                    3,
                )
            )
    return found


def _runs_by_task(history: History) -> dict[str, list[Execution]]:
    found: dict[str, list[Execution]] = defaultdict(list)
    for e in history.executions:
        found[e.task_id].append(e)
    return found


def debounce(history: History) -> list[Any]:
    """Property 11 (see the module docstring): the violations found."""
    from .checker import ERASING_FAULTS, Violation  # the checker imports this module

    if history.debounce_cap <= 0:
        return []
    found: list[Violation] = []
    by_task = _runs_by_task(history)
    for task_id, jobs in _bursts(history).items():
        key = jobs[0].key
        runs = sorted(by_task.get(task_id, []), key=lambda e: e.grant_upper)
        done = [e for e in runs if e.outcome == "ok"]
        if _ran_twice(history, done):
            found.append(
                Violation(
                    11,
                    "burst-ran-twice",
                    f"{key}: burst {task_id} ran to its end {len(done)} times",
                    key,
                    {"runs": [asdict(e) for e in done]},
                )
            )
        if not runs:
            continue
        ran = next((j for j in jobs if j.job == runs[0].job), None)
        later = [
            j
            for j in jobs
            if ran is not None
            and j.decided_lower is not None
            and j.decided_lower > ran.decided_upper
        ]  # type: ignore[operator]
        since = first_publish(jobs)
        erased = any(
            f.kind in ERASING_FAULTS and f.ended_at >= since and f.started_at <= runs[0].grant_upper
            for f in history.faults
        )
        if later and not erased:  # an emptied store: the timer runs its first arguments
            found.append(
                Violation(
                    11,
                    "not-latest-arguments",
                    f"{key}: burst {task_id} ran with job {ran.job}'s "
                    f"arguments, but {len(later)} publish(es) of it came surely after",
                    key,
                    {"ran": asdict(ran), "later": [asdict(j) for j in later]},
                )
            )  # type: ignore[arg-type]
        first = first_publish(jobs)
        late = runs[0].grant_lower - (first + history.debounce_cap)  # type: ignore[operator]
        if late > history.ttl + SLACK and not _excused(history, key, first, runs[0]):
            found.append(
                Violation(
                    11,
                    "ran-past-cap",
                    f"{key}: burst {task_id} was granted {late:.3f}s past its "
                    f"first publish plus lease_debounce_max={history.debounce_cap:g}",
                    key,
                    {"run": asdict(runs[0]), "first_publish": first},
                )
            )
    for claim in history.leftover_claims:
        limit = claim.get("lifetime", 0.0) + history.ttl + SLACK
        if claim.get("debounced") and claim["age"] > limit:
            found.append(
                Violation(
                    11,
                    "burst-left-waiting",
                    f"{claim['key']}: burst {claim['task_id']} is still "
                    f"waiting {claim['age']:.1f}s after its first publish (cap "
                    f"{claim['lifetime']:g}s)",
                    claim["key"],
                    dict(claim),
                )
            )
    return found
