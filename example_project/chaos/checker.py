"""The checker: pure functions that read a recorded :class:`History` and list broken promises.

Each rule concludes only what the recorded time brackets prove (a grant happened inside its
acquire round trip; a body was running when it recorded its end; a renewal's script ran after
its send), so a violation is never an artefact of timing, and each comes with its evidence.

1. Fencing order: per key, the writes the guard accepted carry non-decreasing fencing tokens,
   equal only within one execution; grants later in time carry higher tokens.
2. Exclusion on the server: the store never confirmed a holder's lease after it had granted
   the same key to a later holder.
3. No silent loser: an execution whose body was still running when a later holder was
   granted its key was told: it caught ``LeaseLost``, had a write refused, or was told at
   release that the store no longer had its token.
4. Liveness: every job ran, was skipped naming a holder, or failed with a lease error; every
   key's probe after the faults ran within TTL + 1 s; no lease was left held one TTL after the
   end; every worker answered.
5. Nothing leaked: no key of the library without a TTL; a worker's sockets to the lease store
   and its RSS did not grow beyond a slack over the run (for workers that were not restarted).
6. Never two running, and deduplication at publish kept its word: no two executions of one
   key that both ended normally, neither told of a loss, were running at one moment; a
   publish folded onto a waiting copy (``lease_dedupe``) got the result of a run granted
   after the publish was sent, never of one that had started before; with the dedupe job's
   ``lease_min_replicas`` at 1 or more, not even across a failover, and never onto a copy
   that never ran (a fold read off a demoted primary); no claim was left without a lifetime
   or past it (a claim is written before its message can run, so it then outlives its
   message by no more than its lifetime).
7. Hand-over (``lease_on_conflict`` ``coalesce`` and ``queue``): no lost trigger (every
   coalesced job's covering run ran, and did not start before the trigger was parked), FIFO
   (a waiter parked surely before another started surely before it; not for the ``limited``
   path's keys, whose queued runs start on up to N workers at once) and no lost waiter
   (property 4's unresolved jobs, the ``limited`` path's queued copies included). Never two
   running is properties 2 and 3, which hold for these keys too. A store that restarted
   empty loses what waited in it: jobs submitted before such a fault ended and not run are
   excused, and counted. A run handed the key that cannot take it within its reservation
   (one TTL) loses its place, so FIFO is not asked across a store error that long: on the
   keys of a job with ``lease_min_replicas`` at 1 or more, a failover or a pause of the
   primary (no grant counts until a replica follows the primary again).
8. Once per window (a campaign with ``lease_cooldown``): no execution was granted its key
   within the cooldown after an execution that succeeded, unless a fault erased the store's
   keys in between.
9. Newest wins (``lease_on_conflict="preempt"``, :mod:`.preempt_check`): a preempted
   holder's writes after the newcomer's are refused, it stops within grace + one renewal
   interval + a slack of the take-over, and it is told with cause ``preempted``.
10. Never more than N (a campaign with ``lease_limit=N``, the ``limited`` path's keys): no
    N + 1 executions of one key that each ended normally, none told of a loss, were running
    at one moment. Properties 2, 3 and 6's "never two running" are about one holder and do
    not apply to these keys; property 1's grant order does (one counter for all slots).
11. Debounce (``lease_debounce``, :mod:`.checker_debounce`): each burst ran once, with the
    latest arguments, no later than its cap (plus one TTL and a slack) after its first
    publish unless a fault or the key's previous run came in between; no burst was left
    waiting at the end.
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .checker_debounce import debounce as debounce_bursts
from .checker_debounce import lateness
from .history import Execution, Fault, History, Job, Parked, Write

__all__ = ["LEASE_ERRORS", "Violation", "check", "summarize"]

#: Result exception names that count as "failed with a lease error" (property 4).
LEASE_ERRORS = ("LeaseLost", "LeaseStoreUnavailable", "LeaseConflict")
#: Sockets to the lease store a worker may gain over a run before it counts as a leak (the
#: client's connection pool grows to the pool's concurrency). Only the lease store's sockets
#: are the library's: the broker's and the database's belong to Celery and to the job.
SOCKET_SLACK = 8
#: RSS growth allowed over a run: ``end <= start * RSS_FACTOR + RSS_SLACK`` (bytes).
RSS_FACTOR = 1.5
RSS_SLACK = 64 * 1024 * 1024


@dataclass
class Violation:
    """One broken promise: the property number (1-11), a rule name, a sentence, the evidence."""

    property: int
    rule: str
    message: str
    key: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def check(history: History) -> list[Violation]:
    """Every violation of the eleven properties in ``history`` (empty: all promises kept)."""
    from .preempt_check import preemptions  # it imports Violation from here

    return [
        *fencing_order(history),
        *exclusion(history),
        *silent_losers(history),
        *liveness(history),
        *leaks(history),
        *dedupe(history),
        *handover(history),
        *cooldown_windows(history),
        *preemptions(history),
        *never_more_than_n(history),
        *debounce_bursts(history),
    ]


def limited_keys(history: History) -> set[str]:
    """The keys of the ``limited`` path (``lease_limit``): up to ``history.limit`` at once."""
    return {job.key for job in history.jobs if job.path == "limited"}


def _single(history: History) -> dict[str, list[Execution]]:
    """The executions per key, the keys of one holder at a time only (not ``limited``)."""
    limited = limited_keys(history)
    return {k: v for k, v in _by_key(history.executions).items() if k not in limited}


def _untold(runs: list[Execution], refused: set[str]) -> list[Execution]:
    """The executions that ended normally and were never told of a loss (no refused write,
    not refused at release), by grant time."""
    return sorted(
        (
            e
            for e in runs
            if e.outcome == "ok"
            and e.body_end is not None
            and e.token not in refused
            and e.released is not False
        ),
        key=lambda e: e.grant_upper,
    )


def never_more_than_n(history: History) -> list[Violation]:
    """Property 10: no more than ``history.limit`` untold executions of a limited key were
    running at one moment. Each ran surely from its ``grant_upper`` (its body had started)
    to its ``body_end`` (its body was still running), so an overlap of those is proven."""
    found: list[Violation] = []
    if history.limit <= 0:
        return found
    refused = {w.token for w in history.writes if not w.accepted}
    limited = limited_keys(history)
    for key, runs in _by_key(history.executions).items():
        if key not in limited:
            continue
        done = _untold(runs, refused)
        for b in done:
            running = [a for a in done if a.grant_upper <= b.grant_upper < a.body_end]  # type: ignore[operator]
            if len(running) > history.limit:
                found.append(
                    Violation(
                        10,
                        "more-than-n",
                        f"{key}: {len(running)} executions were running at "
                        f"{b.grant_upper:.3f}, above lease_limit={history.limit}: "
                        f"{', '.join(a.token for a in running)}",
                        key,
                        {"running": [_execution(a) for a in running]},
                    )
                )
    return found


def _by_key(items: Iterable[Any]) -> dict[str, list[Any]]:
    grouped: dict[str, list[Any]] = defaultdict(list)
    for item in items:
        grouped[item.key].append(item)
    return grouped


def _write(w: Write) -> dict[str, Any]:
    return {
        "id": w.id,
        "token": w.token,
        "fence": w.fence,
        "worker": w.worker,
        "pid": w.pid,
        "accepted": w.accepted,
        "started_at": w.started_at,
        "done_at": w.done_at,
    }


def _execution(e: Execution) -> dict[str, Any]:
    return asdict(e)


def fencing_order(history: History) -> list[Violation]:
    """Property 1: accepted tokens never go down on a key; one token, one execution."""
    found: list[Violation] = []
    for key, writes in _by_key(history.writes).items():
        top: Write | None = None
        for w in sorted(writes, key=lambda w: w.id):
            if not w.accepted:
                continue
            if top is not None and w.fence < top.fence:
                found.append(
                    Violation(
                        1,
                        "lower-token-accepted",
                        f"{key}: write {w.id} with token {w.fence} was accepted after write "
                        f"{top.id} with the higher token {top.fence}",
                        key,
                        {"earlier": _write(top), "later": _write(w)},
                    )
                )
            elif top is not None and w.fence == top.fence and w.token != top.token:
                found.append(
                    Violation(
                        1,
                        "token-shared",
                        f"{key}: executions {top.token} and {w.token} wrote with the same fencing "
                        f"token {w.fence}",
                        key,
                        {"earlier": _write(top), "later": _write(w)},
                    )
                )
            if top is None or w.fence >= top.fence:
                top = w
    for key, runs in _by_key(history.executions).items():
        ordered = sorted(runs, key=lambda e: e.grant_lower)
        for i, a in enumerate(ordered):
            for b in ordered[i + 1 :]:
                if b.grant_lower > a.grant_upper and b.fence <= a.fence:
                    found.append(
                        Violation(
                            1,
                            "token-not-increasing",
                            f"{key}: execution {b.token} was granted after {a.token} but got token "
                            f"{b.fence} <= {a.fence}",
                            key,
                            {"earlier": _execution(a), "later": _execution(b)},
                        )
                    )
    return found


def _first_later_grant(runs: list[Execution]) -> dict[str, Execution]:
    """For each execution, the execution with a higher token whose grant is proven earliest."""
    ordered = sorted(runs, key=lambda e: e.fence, reverse=True)
    earliest: Execution | None = None
    result: dict[str, Execution] = {}
    for run in ordered:  # every execution seen before has a higher (or equal) token
        if earliest is not None and earliest.fence > run.fence:
            result[run.token] = earliest
        if earliest is None or run.grant_upper < earliest.grant_upper:
            earliest = run
    return result


def exclusion(history: History) -> list[Violation]:
    """Property 2: no renewal of a holder was confirmed after a later holder was granted."""
    found: list[Violation] = []
    accepted = Counter(w.token for w in history.writes if w.accepted)
    for key, runs in _single(history).items():
        later = _first_later_grant(runs)
        for a in runs:
            b = later.get(a.token)
            if b is None or a.confirmed_lower is None or a.confirmed_lower <= b.grant_upper:
                continue
            found.append(
                Violation(
                    2,
                    "overlap-on-server",
                    f"{key}: the store confirmed {a.token} (token {a.fence}) at or after "
                    f"{a.confirmed_lower:.3f}, {a.confirmed_lower - b.grant_upper:.3f}s after it "
                    f"had granted {b.token} (token {b.fence}); accepted writes: "
                    f"{accepted[a.token]} and {accepted[b.token]}",
                    key,
                    {"holder": _execution(a), "later_holder": _execution(b)},
                )
            )
    return found


def silent_losers(history: History) -> list[Violation]:
    """Property 3: a body still running when its key was granted to another was told."""
    found: list[Violation] = []
    refused = {w.token for w in history.writes if not w.accepted}
    for key, runs in _single(history).items():
        later = _first_later_grant(runs)
        for a in runs:
            b = later.get(a.token)
            if b is None or a.body_end is None or b.grant_upper >= a.body_end:
                continue
            told = a.outcome == "lost" or a.token in refused or a.released is False
            if not told:
                found.append(
                    Violation(
                        3,
                        "silent-loser",
                        f"{key}: {a.token} (token {a.fence}) was still running at "
                        f"{a.body_end:.3f}, {a.body_end - b.grant_upper:.3f}s after {b.token} "
                        f"(token {b.fence}) was granted, and was never told (outcome {a.outcome}, "
                        f"no refused write, released={a.released})",
                        key,
                        {"loser": _execution(a), "later_holder": _execution(b)},
                    )
                )
    return found


def liveness(history: History) -> list[Violation]:
    """Property 4: every job resolved, probes progressed, no lease left, no worker stuck."""
    found: list[Violation] = []
    for job in history.jobs:
        if job.resolution == "unresolved" and not wiped_after(history, job):
            found.append(
                Violation(
                    4,
                    "job-unresolved",
                    f"{job.key}: job {job.job} ({job.path}, task "
                    f"{job.task_id}) neither ran nor was skipped nor failed with a lease error: "
                    f"{job.detail}",
                    job.key,
                    asdict(job),
                )
            )
        elif job.resolution == "skipped" and not job.holder:
            found.append(
                Violation(
                    4,
                    "skip-without-holder",
                    f"{job.key}: job {job.job} was skipped without naming a holder",
                    job.key,
                    asdict(job),
                )
            )
    grants: dict[str, float] = {}
    for run in history.executions:
        grants[run.job] = min(grants.get(run.job, run.grant_upper), run.grant_upper)
    for job in history.jobs:
        if job.path != "probe":
            continue
        granted = grants.get(job.job)
        waited = None if granted is None else granted - job.submitted_at
        if job.resolution != "ran" or waited is None or waited > history.ttl + 1.0:
            found.append(
                Violation(
                    4,
                    "no-progress",
                    f"{job.key}: the probe sent after the faults "
                    f"{'was ' + job.resolution if job.resolution != 'ran' else 'ran'}"
                    f"{'' if waited is None else f' after {waited:.3f}s'}; the limit is "
                    f"TTL + 1 s = {history.ttl + 1.0:.3f}s",
                    job.key,
                    {**asdict(job), "waited": waited},
                )
            )
    for lease in history.leftover_leases:
        found.append(
            Violation(
                4,
                "lease-left-held",
                f"{lease['key']} is still held one TTL after the end",
                lease["key"],
                dict(lease),
            )
        )
    for worker in history.workers:
        if not worker.answered_ping:
            found.append(
                Violation(
                    4,
                    "worker-stuck",
                    f"worker {worker.name} ({worker.pool}) did not answer a ping at the end",
                    None,
                    asdict(worker),
                )
            )
    return found


def wiped_after(history: History, job: Job) -> bool:
    """True when a parked ``job`` (coalesce, queue, a limited job's queued copy; a debounce
    burst's record or its run in the line) may have been lost with the store's data: a restart
    of the store with an empty dataset, or a lossy failover (:func:`empties`), ended after the
    job was submitted (the wipe happens
    somewhere inside the fault's window, so one that began just before the job was parked may
    still have wiped it)."""
    return job.path in ("coalesce", "queue", "debounce", "limited") and any(
        empties(f) and f.ended_at >= job.submitted_at for f in history.faults
    )


def empties(fault: Fault) -> bool:
    """True for a fault that loses what the store answered before it: a restart with an
    empty dataset, or a failover to a node that was not in sync (``Fault.lossy``)."""
    return fault.kind == "restart_empty" or fault.lossy


def handover(history: History) -> list[Violation]:
    """Property 6: no lost trigger (coalesce), FIFO per key (queue)."""
    found: list[Violation] = []
    by_task: dict[str, list[Execution]] = defaultdict(list)
    for run in history.executions:
        by_task[run.task_id].append(run)
    parked_at = {}
    for p in history.parked:  # a redelivered copy parks again: its first park counts
        parked_at.setdefault(p.task_id, p)
    for job in history.jobs:
        if job.resolution != "coalesced" or job.covered_by is None:
            continue
        runs, park = by_task.get(job.covered_by, []), parked_at.get(job.task_id)
        if not runs:
            if not wiped_after(history, job):
                found.append(
                    Violation(
                        7,
                        "lost-trigger",
                        f"{job.key}: job {job.job} was coalesced into "
                        f"{job.covered_by}, which never ran",
                        job.key,
                        asdict(job),
                    )
                )
        elif park is not None and max(r.grant_upper for r in runs) < park.lower:
            found.append(
                Violation(
                    7,
                    "run-before-trigger",
                    f"{job.key}: job {job.job}'s covering run "
                    f"{job.covered_by} started before the job was parked",
                    job.key,
                    asdict(job),
                )
            )
    # Its first run after its first park (a retried copy may have run before it parked).
    first_run = {
        p.task_id: min(later, key=lambda r: r.grant_lower)
        for p in parked_at.values()
        if (later := [r for r in by_task.get(p.task_id, []) if r.grant_upper >= p.lower])
    }
    # A limited key's line is handed over in order too, one slot at a time, but its runs then
    # start on N workers at once: their start order is no promise (only none lost, property 4).
    limited, replicated = limited_keys(history), replicated_keys(history)
    queued = [
        p
        for p in parked_at.values()
        if p.kind == "queue" and p.task_id in first_run and p.key not in limited
    ]
    for key, waiters in _by_key(queued).items():
        for a in waiters:
            for b in waiters:
                ra, rb = first_run[a.task_id], first_run[b.task_id]
                if (
                    a.upper < b.lower
                    and rb.grant_upper < ra.grant_lower
                    and not _order_excused(history, a, ra, rb, key in replicated)
                ):
                    found.append(
                        Violation(
                            7,
                            "out-of-order",
                            f"{key}: {b.task_id} was parked after {a.task_id} "
                            f"but started before it",
                            key,
                            {"first": asdict(a), "second": asdict(b)},
                        )
                    )
    return found


def leaks(history: History) -> list[Violation]:
    """Property 5: no key without a TTL; worker sockets and RSS within their slack."""
    found = [
        Violation(5, "key-without-ttl", f"{key} has no TTL", key, {"key": key})
        for key in history.keys_without_ttl
    ]
    for w in history.workers:
        if not w.same_process:
            continue
        start, end = w.peers_start.get("lease", 0), w.peers_end.get("lease", 0)
        if end > start + SOCKET_SLACK:
            found.append(
                Violation(
                    5,
                    "sockets-grew",
                    f"worker {w.name} ({w.pool}) went from {start} to {end} "
                    f"sockets to the lease store (slack {SOCKET_SLACK})",
                    None,
                    asdict(w),
                )
            )
        if w.rss_end > w.rss_start * RSS_FACTOR + RSS_SLACK:
            found.append(
                Violation(
                    5,
                    "rss-grew",
                    f"worker {w.name} ({w.pool}) went from {w.rss_start >> 20} MiB "
                    f"to {w.rss_end >> 20} MiB RSS",
                    None,
                    asdict(w),
                )
            )
    return found


#: Float seconds a claim may outlive its lifetime (Redis expires keys lazily and by sampling).
CLAIM_SLACK = 1.0


def dedupe(history: History) -> list[Violation]:
    """Property 6: never two running; folds served by later runs; claims end in time."""
    found: list[Violation] = []
    refused = {w.token for w in history.writes if not w.accepted}
    for key, runs in _single(history).items():
        # Ended normally and never told of a loss (no refused write, not refused at release):
        # two such bodies running at one moment is what the lease exists to prevent.
        done = _untold(runs, refused)
        for i, a in enumerate(done):
            for b in done[i + 1 :]:
                if b.grant_upper >= a.body_end:  # type: ignore[operator]
                    break
                found.append(
                    Violation(
                        6,
                        "two-running",
                        f"{key}: {a.token} and {b.token} both ended normally and "
                        f"were both running at {b.grant_upper:.3f}",
                        key,
                        {"first": _execution(a), "second": _execution(b)},
                    )
                )
    found += unserved_folds(history)
    # A claim is written before its message can start and cleared at its grant; one left
    # past its lifetime (or without one) outlived its message by more than its lifetime.
    for claim in history.leftover_claims:
        if claim.get("debounced"):
            continue  # a debounce burst: property 11
        if claim["ttl"] < 0 or claim["age"] > claim["lifetime"] + CLAIM_SLACK:
            found.append(
                Violation(
                    6,
                    "claim-outlived",
                    f"{claim['key']}: the claim of waiting copy "
                    f"{claim['task_id']} is {claim['age']:.1f}s old, past its lifetime of "
                    f"{claim['lifetime']:g}s ({claim['ttl']:.1f}s left)",
                    claim["key"],
                    dict(claim),
                )
            )
    return found


#: How a folded job may end without a run of its copy: the copy was skipped naming a holder,
#: or failed with a lease error (the fold shares its copy's fate).
COPY_ENDED_WITHOUT_RUN = ("skipped", "failed_lease", "coalesced")


def unserved_folds(history: History) -> list[Violation]:
    """Property 6's folds: a publish folded onto a waiting copy is served by a run of that copy
    granted after the fold's decision. A copy whose every run had been granted before is
    ``folded-onto-started``; with the dedupe job's ``lease_min_replicas`` >= 1 (a claim and
    a fold count once a replica has them), so is a copy with no run at all while the fold did
    not end as its copy legitimately did (:data:`COPY_ENDED_WITHOUT_RUN`):
    ``folded-onto-no-run``, a fold read off a primary that a failover demoted, naming a copy
    the new primary never saw (such a job is also property 4's ``job-unresolved``)."""
    found: list[Violation] = []
    by_task: dict[str, list[Execution]] = defaultdict(list)
    for e in history.executions:
        by_task[e.task_id].append(e)
    for job in history.jobs:
        runs = by_task.get(job.folded_onto or "", [])
        if (
            job.folded_onto is None
            or job.decided_lower is None
            or any(e.grant_upper >= job.decided_lower for e in runs)
        ):
            continue
        if runs and job.resolution == "ran":
            rule, why = "folded-onto-started", "every run of that copy had been granted before"
        elif (
            not runs
            and history.dedupe_min_replicas > 0
            and job.resolution not in COPY_ENDED_WITHOUT_RUN
        ):
            rule, why = "folded-onto-no-run", f"that copy never ran ({job.detail})"
        else:
            continue
        found.append(
            Violation(
                6,
                rule,
                f"{job.key}: job {job.job} was folded onto {job.folded_onto} at "
                f"{job.decided_lower:.3f}, but {why}",
                job.key,
                {"job": asdict(job), "runs": [_execution(e) for e in runs]},
            )
        )
    return found


#: Faults that erase what the lease store holds, cooldown records included.
ERASING_FAULTS = ("restart_empty", "delete_key", "failover")


#: Faults after which a key of a job with ``lease_min_replicas`` >= 1 has no grant that counts
#: for longer than a reservation (one TTL): the promoted node has no replica until the old
#: primary rejoins it, a paused primary answers nothing, and past ``down-after`` is replaced.
REPLICA_OUTAGES = ("failover", "pause_store")


def replicated_keys(history: History) -> set[str]:
    """The keys of the jobs whose ``lease_min_replicas`` is 1 or more (dedupe, debounce)."""
    wait = {"dedupe": history.dedupe_min_replicas, "debounce": history.debounce_min_replicas}
    return {job.key for job in history.jobs if wait.get(job.path, 0) > 0}


def _order_excused(
    history: History, a: Parked, ra: Execution, rb: Execution, replicated: bool
) -> bool:
    """Whether waiter ``a`` (first run ``ra``) may start after ``rb``, a run parked after it:

    - a store emptied while ``a`` waited took the line with it: the copies parked again in
      the order their messages came back, which is no promise;
    - on a ``replicated`` key (``lease_min_replicas`` >= 1) a replica outage
      (:data:`REPLICA_OUTAGES`) between ``a``'s park and ``rb``'s grant: ``a``'s turn came
      while no grant counted (each was taken back, ``NotReplicated``), its reservation lapsed
      and the key went to the next run; ``a`` parked again at the back of the line.
    """
    for f in history.faults:
        if empties(f) and f.ended_at >= a.lower and f.started_at <= ra.grant_upper:
            return True
        if (
            replicated
            and f.kind in REPLICA_OUTAGES
            and f.ended_at >= a.upper
            and f.started_at <= rb.grant_upper
        ):
            return True
    return False


def cooldown_windows(history: History) -> list[Violation]:
    """Property 7: no grant within ``history.cooldown`` after an execution that succeeded.

    An execution ``a`` that ended ``ok`` and whose release found its token (``released``)
    turned its lease into a cooldown record at its release, which came after its body's end
    and before any later grant of the key: a later execution ``b`` granted (at the latest)
    before ``a``'s body end plus the cooldown started inside the window. A fault that erases
    the store's keys between the two excuses it.
    """
    found: list[Violation] = []
    if history.cooldown <= 0:
        return found
    erasing = [f for f in history.faults if f.kind in ERASING_FAULTS]
    for key, runs in _by_key(history.executions).items():
        for a in runs:
            if a.outcome != "ok" or a.released is not True or a.body_end is None:
                continue
            for b in runs:
                if b.fence <= a.fence or b.grant_upper >= a.body_end + history.cooldown:
                    continue
                if any(f.started_at <= b.grant_upper and f.ended_at >= a.body_end for f in erasing):
                    continue
                found.append(
                    Violation(
                        8,
                        "started-in-cooldown",
                        f"{key}: {b.token} (token {b.fence}) was granted by {b.grant_upper:.3f}, "
                        f"{b.grant_upper - a.body_end:.3f}s after {a.token} (token {a.fence}) "
                        f"succeeded, within its cooldown of {history.cooldown:.3f}s",
                        key,
                        {"succeeded": _execution(a), "started": _execution(b)},
                    )
                )
    return found


def _spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "max": None}
    return {"median": round(statistics.median(values), 3), "max": round(max(values), 3)}


def summarize(history: History, violations: list[Violation]) -> dict[str, Any]:
    """The counts of a run: jobs, executions, skips, losses, faults, stalls, throughput."""
    from .preempt_check import summary as preempt_summary

    refused = {w.token for w in history.writes if not w.accepted}
    lost = Counter(e.lost_cause or "unknown" for e in history.executions if e.outcome == "lost")
    told_later = sum(
        1
        for e in history.executions
        if e.outcome != "lost" and (e.token in refused or e.released is False)
    )
    accepted_times = sorted(w.done_at for w in history.writes if w.accepted)
    stalls: dict[str, list[float]] = defaultdict(list)
    for fault in history.faults:
        at = bisect.bisect_left(accepted_times, fault.ended_at)
        if at < len(accepted_times):
            stalls[fault.kind].append(accepted_times[at] - fault.ended_at)
    ok_ends = [e.body_end for e in history.executions if e.outcome == "ok" and e.body_end]
    window = max(history.nemesis_end - history.started_at, 1e-9)
    faulted = sum(f.ended_at - f.started_at for f in history.faults)
    during = sum(1 for t in ok_ends if any(f.started_at <= t <= f.ended_at for f in history.faults))
    return {
        "jobs": len(history.jobs),
        "jobs_by_path": dict(Counter(j.path for j in history.jobs)),
        "jobs_by_resolution": dict(Counter(j.resolution for j in history.jobs)),
        "executions": len(history.executions),
        "executions_by_outcome": dict(Counter(str(e.outcome) for e in history.executions)),
        "skips": sum(1 for j in history.jobs if j.resolution == "skipped"),
        "coalesced": sum(1 for j in history.jobs if j.resolution == "coalesced"),
        "parked_by_kind": dict(Counter(p.kind for p in history.parked)),
        "lost_with_an_emptied_store": sum(
            1 for j in history.jobs if j.resolution == "unresolved" and wiped_after(history, j)
        ),
        "losses_by_cause": dict(lost),
        "losses_told_by_refusal_or_release": told_later,
        "writes_accepted": sum(1 for w in history.writes if w.accepted),
        "writes_refused": sum(1 for w in history.writes if not w.accepted),
        "faults": len(history.faults),
        "faults_by_kind": dict(Counter(f.kind for f in history.faults)),
        "faults_lossy": sum(1 for f in history.faults if f.lossy),  # a node not in sync promoted
        "stall_after_fault_s": _spread([t for kind in stalls.values() for t in kind]),
        "stall_after_fault_by_kind_s": {k: _spread(v) for k, v in sorted(stalls.items())},
        "throughput_per_s": round(
            len([t for t in ok_ends if t <= history.nemesis_end]) / window, 3
        ),
        "throughput_during_faults_per_s": round(during / faulted, 3) if faulted else None,
        "worker_restarts": sum(w.restarts for w in history.workers),
        "dedupe_publishes_by_disposition": dict(
            Counter(j.disposition for j in history.jobs if j.disposition is not None)
        ),
        "dedupe_claims_left": len(history.leftover_claims),
        "debounce_runs_past_cap_s": _spread(lateness(history)),
        **preempt_summary(history),
        "violations": len(violations),
        "violations_by_property": dict(Counter(str(v.property) for v in violations)),
    }
