"""The recorded history of one campaign: plain data the checker reads.

Times are float seconds since the epoch (``time.time()``), taken on one machine, so the
records of the workers, the producer and the nemesis share one clock. Each record says which
moment a time brackets, because the checker only concludes what the brackets prove.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Execution", "Fault", "History", "Job", "Parked", "Preemption", "WorkerSample", "Write"]


@dataclass
class Write:
    """One fenced write attempt, as the database recorded it in the same statement.

    ``id`` orders the attempts on one key in the order the guard saw them (the row lock of the
    conditional upsert serialises them); ``accepted`` is the guard's answer.
    """

    id: int
    key: str
    job: str
    token: str
    fence: int
    worker: str
    pid: int
    accepted: bool
    started_at: float
    done_at: float


@dataclass
class Execution:
    """One execution of a job's body, identified by its lease token.

    ``grant_lower``/``grant_upper`` bracket the moment the store granted the lease (noted
    before the acquire was sent, and by the body's first act). ``body_end`` is recorded by
    the body as its last act while still running (``None`` when it never got there: killed,
    or it lost the lease). ``outcome`` is ``ok``, ``lost`` (the body caught ``LeaseLost``),
    ``retry`` (it asked for a retry) or ``None`` (never recorded: the process died).
    ``confirmed_lower`` is a time at or before the send of the last renewal (or grant) the
    store confirmed to this holder, so the store still had the lease at some moment after it.
    ``released`` is the library's word at release (False: the store no longer had the token,
    or could not be reached), ``None`` when no release was recorded.
    """

    token: str
    key: str
    job: str
    task_id: str
    fence: int
    worker: str
    pid: int
    grant_lower: float
    grant_upper: float
    body_end: float | None = None
    outcome: str | None = None
    lost_cause: str | None = None
    lost_at: float | None = None
    confirmed_lower: float | None = None
    released: bool | None = None


@dataclass
class Job:
    """One submitted job and how it ended.

    ``path`` is how it was submitted: ``delay``, ``send_task``, ``retry``, ``requeue`` (the
    job requeues itself), ``requeued`` (the job it sent), ``duplicate``, ``after_erase`` (sent
    by the nemesis after it erased the lease), ``beat`` (sent by beat's leader, recorded by
    the beat process before it published the message), ``probe``, ``dedupe`` (the job with
    ``lease_dedupe``, sent by ``apply_async``, often several at once); ``coalesce`` and
    ``queue`` (sent to the jobs whose ``lease_on_conflict`` is that);
    ``resolution`` is ``ran``, ``skipped``, ``coalesced`` (its marker names the run covering
    it: ``covered_by``, the end of the markers' chain), ``failed_lease`` (a lease error is its
    result) or ``unresolved``; ``detail`` says more (the result state, the error); ``holder``
    names the holder a skip reported. A ``dedupe`` job also has its publish's ``disposition``
    (``published``, ``deduplicated``, ``unguarded``), ``folded_onto`` (the waiting copy's task
    id when deduplicated: the job then resolves as that copy does) and ``decided_lower`` /
    ``decided_upper``, which bracket the publish's decision in the store.
    """

    job: str
    key: str
    path: str
    task_id: str
    submitted_at: float
    resolution: str = "unresolved"
    detail: str = ""
    holder: str | None = None
    disposition: str | None = None
    folded_onto: str | None = None
    decided_lower: float | None = None
    decided_upper: float | None = None
    covered_by: str | None = None


@dataclass
class Parked:
    """A duplicate a worker parked in its key's line (``coalesce`` or ``queue``).

    ``lower`` is noted before the execution asked for the lease (so before the park),
    ``upper`` once the park was done (the ``lease_coalesced``/``lease_queued`` signal): the
    park happened between them. ``into`` is the task id of the run that covers it (its own
    for ``queue``).
    """

    task_id: str
    key: str
    kind: str
    into: str
    lower: float
    upper: float


@dataclass
class Preemption:
    """A take-over (``lease_on_conflict="preempt"``), recorded by the newcomer's process when
    the ``lease_preempted`` signal arrived: the script had run by ``at``, and after the
    newcomer's own ``grant_lower``. ``token`` is the newcomer's, ``preempted`` the replaced
    holder's; ``notified`` how many processes got the notice (0: the old holder learns it at
    its renewal, or its release)."""

    token: str
    preempted: str
    key: str
    at: float
    notified: int


@dataclass
class Fault:
    """One injected fault: its kind, what it hit, and when it started and was healed.

    ``lossy`` marks a fault of ``--sentinel`` that let the sentinels promote a node not in
    sync with the primary (a replica still syncing, or an old primary not demoted yet): the
    writes the primary had answered since are lost, as in a restart with an empty dataset.
    """

    kind: str
    target: str
    started_at: float
    ended_at: float
    lossy: bool = False


@dataclass
class WorkerSample:
    """One worker slot: its process at the end, compared with that process' first sample.

    ``same_process`` is True when the process at the end was sampled earlier, after a warm-up
    (``*_start``); False when it was too young (restarted by the supervisor just before the
    end): its figures then prove nothing about leaks. ``age`` is how long that process had
    been sampled (float seconds). RSS in bytes; sockets counted in
    ``/proc/<pid>/fd`` over the worker and its pool children; ``peers_*`` splits them by
    the server at the other end (``broker``, ``lease``, ``postgres``, ``other``, ``local``).
    """

    name: str
    pool: str
    restarts: int
    answered_ping: bool
    same_process: bool
    rss_start: int
    rss_end: int
    sockets_start: int
    sockets_end: int
    peers_start: dict[str, int] = field(default_factory=dict)
    peers_end: dict[str, int] = field(default_factory=dict)
    age: float = 0.0


@dataclass
class History:
    """Everything one campaign recorded (see the classes above).

    ``ttl`` is the lease TTL (float seconds); ``nemesis_end`` the time the last fault was
    healed; ``leftover_leases`` the lease keys still present one TTL after the end
    (``{"key", "pttl", "value"}``); ``keys_without_ttl`` the library's keys that had no expiry;
    ``leftover_claims`` the waiting copies' claims (``lease_dedupe``) still present at the end
    (``{"key", "task_id", "age", "lifetime", "ttl"}``, float seconds);
    ``cooldown`` the job's ``lease_cooldown`` (float seconds; 0.0: none);
    ``preemptions`` the take-overs of the preempt job, whose ``lease_preempt_grace`` is
    ``preempt_grace`` (float seconds); ``limit`` the limited job's ``lease_limit`` (int; 0:
    no limited job);
    ``debounce_cap`` the debounce job's ``lease_debounce_max`` (float seconds; 0.0: no
    debounce jobs): a leftover claim with ``debounced`` above 0 is a burst that never ran;
    ``dedupe_min_replicas`` and ``debounce_min_replicas`` the ``lease_min_replicas`` of the
    dedupe and the debounce job (int; 0: no ``WAIT``).
    """

    ttl: float
    started_at: float
    nemesis_end: float
    finished_at: float
    writes: list[Write] = field(default_factory=list)
    executions: list[Execution] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    parked: list[Parked] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    workers: list[WorkerSample] = field(default_factory=list)
    leftover_leases: list[dict[str, Any]] = field(default_factory=list)
    keys_without_ttl: list[str] = field(default_factory=list)
    leftover_claims: list[dict[str, Any]] = field(default_factory=list)
    cooldown: float = 0.0
    debounce_cap: float = 0.0
    preemptions: list[Preemption] = field(default_factory=list)
    preempt_grace: float = 0.0
    limit: int = 0
    dedupe_min_replicas: int = 0
    debounce_min_replicas: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (see :meth:`from_dict`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> History:
        """Rebuild a history saved with :meth:`to_dict`."""
        lists = {
            "writes": Write,
            "executions": Execution,
            "jobs": Job,
            "faults": Fault,
            "workers": WorkerSample,
            "parked": Parked,
            "preemptions": Preemption,
        }
        fields = {k: v for k, v in data.items() if k not in lists}
        built = {name: [kind(**row) for row in data.get(name, [])] for name, kind in lists.items()}
        return cls(**fields, **built)  # type: ignore[arg-type]
