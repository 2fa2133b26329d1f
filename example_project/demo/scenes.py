"""The four scenes: duplicates, a crashed holder, a healthy long run, an uncovered pause.

Each scene sends jobs to the workers, injects its fault with a real signal, prints a timeline
(:class:`~example_project.demo.timeline.Stage`) and returns a :class:`SceneResult`: measured
figures and the checks its PASS/FAIL verdict is made of. All durations scale with the lease
TTL ``T`` (a step of the job is ``T/4``), so ``--ttl`` stretches or shrinks the whole demo.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TextIO

import redis
from celery.result import AsyncResult

from celery_lease import is_skipped

from .runtime import Worker
from .timeline import Stage


@dataclass
class SceneResult:
    """What one scene measured and concluded.

    Attributes:
        name: the scene's ``--scene`` name.
        title: one line saying what the scene shows.
        figures: measured values (float seconds unless the name says otherwise).
        checks: ``(description, passed)`` pairs; the scene passes when all pass.
        error: why the scene could not run to the end, if it could not.
    """

    name: str
    title: str
    figures: dict[str, Any] = field(default_factory=dict)
    checks: list[tuple[str, bool]] = field(default_factory=list)
    error: str = ""

    @property
    def passed(self) -> bool:
        """True when every check passed and nothing went wrong."""
        return bool(self.checks) and all(ok for _, ok in self.checks) and not self.error

    def check(self, description: str, ok: bool) -> bool:
        """Record one check; returns ``ok``."""
        self.checks.append((description, bool(ok)))
        return bool(ok)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly form (for ``--json``)."""
        return {
            "name": self.name,
            "title": self.title,
            "passed": self.passed,
            "figures": self.figures,
            "error": self.error,
            "checks": [{"check": c, "passed": ok} for c, ok in self.checks],
        }


class SceneFailed(Exception):
    """A scene cannot go on (a wait timed out); the message says which."""


@dataclass
class Context:
    """What the scenes share: where to print, the store, the workers, the tasks, the TTL.

    Attributes:
        ttl: the lease TTL, float seconds.
        ensure_workers: restarts a crashed or paused worker and waits until both are ready.
    """

    out: TextIO
    client: redis.Redis
    events_key: str
    lease_prefix: str
    workers: dict[str, Worker]
    job: Any
    job_retry: Any
    ttl: float
    ensure_workers: Callable[[], None]
    restart_worker: Callable[[str], None]

    @property
    def step(self) -> float:
        """Duration of one job step, float seconds (a quarter of the TTL)."""
        return self.ttl / 4

    def key(self, job_id: str) -> str:
        """The lease key of job ``job_id``."""
        return f"{self.lease_prefix}:{{demo-job:{job_id}}}"

    def stage(self, job_id: str) -> Stage:
        """A new timeline for job ``job_id``."""
        return Stage(self.out, self.client, self.events_key, self.workers, self.key(job_id))

    def send(self, letter: str, job_id: str, steps: int, retry: bool = False) -> AsyncResult:
        """Request job ``job_id`` of ``steps`` steps on worker ``letter``'s queue."""
        task = self.job_retry if retry else self.job
        result: AsyncResult = task.apply_async(
            (job_id, steps, self.step), queue=self.workers[letter].queue
        )
        return result


def _need(stage: Stage, predicate: Callable[[], bool], timeout: float, what: str) -> None:
    if not stage.wait(predicate, timeout):
        raise SceneFailed(f"timed out after {timeout:.0f}s waiting for {what}")


def _intervals(stage: Stage) -> list[tuple[float, float]]:
    """(acquired, released) wall-clock pairs of every execution that held the key."""
    ends = {e.get("task_id"): float(e["t"]) for e in stage.find("released")}
    spans = []
    for event in stage.find("acquired"):
        start = float(event["t"])
        spans.append((start, ends.get(event.get("task_id"), time.time())))
    return spans


def _max_overlap(spans: list[tuple[float, float]]) -> int:
    points = sorted(
        [(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda p: (p[0], p[1])
    )
    depth = best = 0
    for _, delta in points:
        depth += delta
        best = max(best, depth)
    return best


def _run_id() -> str:
    return f"{time.time_ns() % 10**8:08d}"


# -- scene 1 ----------------------------------------------------------------------------------


def duplicates(ctx: Context) -> SceneResult:
    """The same job requested three times on each worker at once runs once at a time."""
    result = SceneResult(
        "duplicates",
        "the same job requested 6 times on both workers runs "
        "once at a time; the duplicates are skipped",
    )
    job_id = f"report-{_run_id()}"
    stage = ctx.stage(job_id)
    stage.note(f"job {job_id}: 4 steps of {ctx.step:.2f}s; 3 requests to A and 3 to B at once")
    stage.action("A", "3 requests arrive")
    stage.action("B", "3 requests arrive")
    requests = [ctx.send(letter, job_id, 4) for _ in range(3) for letter in "AB"]
    _need(
        stage,
        lambda: all(r.ready() for r in requests),
        8 * ctx.ttl + 20,
        "the 6 requests to finish",
    )
    ran = [r for r in requests if r.successful() and not is_skipped(r.result)]
    skipped = [r for r in requests if r.successful() and is_skipped(r.result)]
    overlap = _max_overlap(_intervals(stage))
    _need(stage, lambda: stage.sample().letter is None, ctx.ttl + 5, "the lease to be released")
    stage.note("the run has ended and released its lease: one more request must run at once")
    released_at = time.time()
    stage.action("B", "1 more request arrives")
    follow_up = ctx.send("B", job_id, 1)
    _need(stage, follow_up.ready, 2 * ctx.ttl + 10, "the follow-up request")
    acquired = stage.find("acquired", where=lambda e: e.get("task_id") == follow_up.id)
    result.figures.update(
        {
            "requests": len(requests),
            "runs": len(ran),
            "skipped": len(skipped),
            "max_concurrent_runs": overlap,
            "follow_up_ran": follow_up.successful() and not is_skipped(follow_up.result),
            "follow_up_start_s": round(float(acquired[0]["t"]) - released_at, 3)
            if acquired
            else None,
        }
    )
    result.check(f"never more than one run at a time (max concurrent: {overlap})", overlap == 1)
    result.check(
        f"every request ran or was skipped ({len(ran)} ran, {len(skipped)} skipped)",
        len(ran) + len(skipped) == len(requests),
    )
    result.check("duplicates that arrived during the run were skipped", len(skipped) >= 1)
    result.check(
        "after the release a new request ran (the lease was released, not left to expire)",
        bool(result.figures["follow_up_ran"]),
    )
    return result


# -- scene 2 ----------------------------------------------------------------------------------


def crashed_holder(ctx: Context) -> SceneResult:
    """A is SIGKILLed mid-run; B runs the job once A's lease runs out, not before."""
    result = SceneResult(
        "crash",
        "A is SIGKILLed mid-run; the job runs again on B after a "
        "stall bounded by the TTL and one sweep pass",
    )
    ttl = ctx.ttl
    job_id = f"import-{_run_id()}"
    stage = ctx.stage(job_id)
    stage.note(
        f"job {job_id}: 40 steps of {ctx.step:.2f}s on A; TTL {ttl:.2f}s, renewed "
        f"every {ttl / 3:.2f}s"
    )
    first = ctx.send("A", job_id, 40)
    _need(stage, lambda: bool(stage.find("write", "A")), 10 + 2 * ttl, "A's first step")
    before = stage.sample()
    killed_at = stage.action(
        "A", "SIGKILL: worker A and its pool die at once; no cleanup code runs", status="dead"
    )
    worker_a = ctx.workers["A"]
    assert worker_a.child is not None
    worker_a.child.kill()
    stage.action("B", "the job is requested again (lease_on_conflict='retry')")
    second = ctx.send("B", job_id, 4, retry=True)
    ctx.restart_worker("A")
    stage.action("A", "a new worker A boots (its supervisor restarts it)", status="booting")
    _need(stage, lambda: bool(stage.first("end", "B")), 4 * ttl + 20, "B to finish the job")
    _need(stage, second.ready, 10, "B's result")
    b_start = stage.first("acquired", "B")
    a_start = stage.first("acquired", "A")
    if b_start is None or a_start is None or before.remaining is None:
        raise SceneFailed("missing events: the timeline above shows what happened")
    stall = float(b_start["t"]) - killed_at
    expiry = before.t + before.remaining  # when the dead holder's key expired on the server
    conflicts = stage.find("conflict", "B")
    result.figures.update(
        {
            "ttl_s": ttl,
            "lease_left_at_kill_s": round(before.remaining, 3),
            "stall_s": round(stall, 3),
            "stall_over_ttl": round(stall / ttl, 3),
            "conflicts_before_run": len(conflicts),
            "b_started_after_expiry_s": round(float(b_start["t"]) - expiry, 3),
            "killed_execution_state": first.state,
        }
    )
    result.check(
        f"B did not run while the dead holder's lease was live (it had "
        f"{before.remaining:.2f}s left)",
        float(b_start["t"]) >= expiry - 0.05,
    )
    # B's copy waits in the key's line ("retry"); once A's lease expired, a worker's
    # hand-over sweep, which looks every renew interval, publishes it.
    result.check(
        f"stall {stall:.2f}s is bounded by the TTL and one sweep pass ({ttl:.2f}s + "
        f"{ttl / 3:.2f}s, +0.5s scheduling slack)",
        stall <= ttl + ttl / 3 + 0.5,
    )
    result.check("B finished the job", second.successful() and not is_skipped(second.result))
    result.check(
        "B's fencing token is higher than A's", int(b_start["fence"]) > int(a_start["fence"])
    )
    stage.note("waiting for the restarted worker A to be ready for the next scene")
    ctx.ensure_workers()
    return result


# -- scene 3 ----------------------------------------------------------------------------------


def long_run(ctx: Context) -> SceneResult:
    """A run three TTLs long keeps its lease by renewal and refuses duplicates throughout."""
    result = SceneResult(
        "long-run", "a run 3 TTLs long keeps its lease by renewal and refuses duplicates"
    )
    ttl = ctx.ttl
    job_id = f"rebuild-{_run_id()}"
    stage = ctx.stage(job_id)
    stage.note(
        f"job {job_id}: 12 steps of {ctx.step:.2f}s = {12 * ctx.step:.1f}s on A, with "
        f"TTL {ttl:.2f}s; a duplicate is sent to B every {ttl / 2:.2f}s"
    )
    run = ctx.send("A", job_id, 12)
    _need(stage, lambda: bool(stage.first("acquired", "A")), 10 + 2 * ttl, "A to start")
    duplicates: list[AsyncResult] = []
    next_dup = time.monotonic() + ttl / 4
    deadline = time.monotonic() + 12 * ctx.step + 4 * ttl + 20

    def finished() -> bool:
        nonlocal next_dup
        if stage.first("end", "A") or stage.first("stopped", "A"):
            return True
        if time.monotonic() >= next_dup:
            next_dup += ttl / 2
            stage.action("B", "duplicate request arrives")
            duplicates.append(ctx.send("B", job_id, 12))
        return False

    _need(stage, finished, deadline - time.monotonic(), "A to finish")
    _need(
        stage, lambda: run.ready() and all(d.ready() for d in duplicates), 10 + ttl, "the results"
    )
    start, end = stage.first("start", "A"), stage.first("end", "A")
    fence = int(start["fence"]) if start else 0
    held = [
        s for s in stage.samples if start and end and float(start["t"]) <= s.t <= float(end["t"])
    ]
    lifetimes = [s.remaining for s in held if s.remaining is not None and s.fence == fence]
    run_s = float(end["t"]) - float(start["t"]) if start and end else 0.0
    skipped = [d for d in duplicates if d.successful() and is_skipped(d.result)]
    lost = stage.find("lost") + stage.find("stopped")
    expected = run_s / (ttl / 3)
    renewals = stage.renewals.get(fence, 0)
    result.figures.update(
        {
            "ttl_s": ttl,
            "run_s": round(run_s, 3),
            "run_over_ttl": round(run_s / ttl, 2),
            "renewals_seen": renewals,
            "renewals_expected": round(expected, 1),
            "min_lease_left_s": round(min(lifetimes), 3) if lifetimes else None,
            "duplicates": len(duplicates),
            "duplicates_skipped": len(skipped),
            "lease_lost": len(lost),
        }
    )
    result.check(
        f"the run lasted {run_s / ttl:.1f} TTLs and finished all 12 steps",
        run_s >= 2.5 * ttl
        and end is not None
        and int(end.get("done", 0)) == 12
        and run.successful(),
    )
    result.check(
        f"the lease was renewed ({renewals} renewals seen, ~{expected:.0f} expected)",
        renewals >= max(2, int(expected) - 3),
    )
    result.check(
        "the key never went missing while the run held it",
        bool(held) and all(s.fence == fence for s in held),
    )
    result.check(
        f"every duplicate was skipped ({len(skipped)}/{len(duplicates)})",
        bool(duplicates) and len(skipped) == len(duplicates),
    )
    result.check("LeaseLost was never raised", not lost)
    return result


# -- scene 4 ----------------------------------------------------------------------------------


class _Frozen(NamedTuple):
    """What the pause scene's fault did: A's run and B's requests of the job, and when A was
    frozen and resumed (wall-clock float seconds, as the timeline's rows)."""

    first: AsyncResult
    second: list[AsyncResult]
    paused_at: float
    resumed_at: float


def _freeze_past_the_lease(ctx: Context, stage: Stage, job_id: str) -> _Frozen:
    """Start the job on A, freeze A (SIGSTOP) once it wrote a step, request the job on B every
    half TTL until B holds the lease and wrote a step, then resume A (SIGCONT); A is resumed
    whatever happens.

    Raises:
        SceneFailed: a step of it did not happen in time.
    """
    ttl = ctx.ttl
    worker_a = ctx.workers["A"]
    assert worker_a.child is not None
    first = ctx.send("A", job_id, 40)
    second: list[AsyncResult] = []
    try:
        _need(stage, lambda: bool(stage.find("write", "A")), 10 + 2 * ttl, "A's first step")
        paused_at = stage.action(
            "A", "SIGSTOP: the whole worker freezes (no renewal leaves it)", status="paused"
        )
        worker_a.child.pause()
        next_request = time.monotonic()

        def b_started() -> bool:
            nonlocal next_request
            if stage.first("acquired", "B"):
                return True
            if time.monotonic() >= next_request:
                next_request += ttl / 2
                stage.action("B", "the job is requested")
                second.append(ctx.send("B", job_id, 8))
            return False

        _need(stage, b_started, 3 * ttl + 15, "B to take the lease over")
        _need(stage, lambda: bool(stage.find("write", "B")), 10 + 2 * ttl, "B's first step")
        resumed_at = stage.action(
            "A", "SIGCONT: A resumes, still believing it holds the lease", status="working"
        )
        worker_a.child.resume()
    finally:
        if worker_a.child.paused:
            worker_a.child.resume()
    return _Frozen(first, second, paused_at, resumed_at)


def pause(ctx: Context) -> SceneResult:
    """A is SIGSTOPped past its lease; B takes over; A resumes, gets LeaseLost, is fenced off."""
    result = SceneResult(
        "pause",
        "A is paused past its lease lifetime, B takes over, A "
        "resumes: LeaseLost, and its late write is refused",
    )
    ttl = ctx.ttl
    job_id = f"export-{_run_id()}"
    stage = ctx.stage(job_id)
    stage.note(
        f"job {job_id}: A runs 40 steps of {ctx.step:.2f}s; TTL {ttl:.2f}s. A is "
        f"frozen with SIGSTOP; the job is requested on B every {ttl / 2:.2f}s"
    )
    first, second, paused_at, resumed_at = _freeze_past_the_lease(ctx, stage, job_id)
    _need(stage, lambda: bool(stage.first("stopped", "A")), 5 + 2 * ttl, "A to stop")
    _need(stage, lambda: bool(stage.first("end", "B")), 8 * ctx.step + 2 * ttl + 10, "B to finish")
    _need(stage, lambda: first.ready() and all(r.ready() for r in second), 10 + ttl, "the results")
    a_start, b_start = stage.first("acquired", "A"), stage.first("acquired", "B")
    if a_start is None or b_start is None:
        raise SceneFailed("missing events: the timeline above shows what happened")
    a_fence, b_fence = int(a_start["fence"]), int(b_start["fence"])
    expired = next((s for s in stage.samples if s.t >= paused_at and s.letter is None), None)
    b_first_write = min(float(e["t"]) for e in stage.find("write", "B"))
    a_late = [e for e in stage.find("write", "A") if float(e["t"]) >= resumed_at]
    stopped = stage.first("stopped", "A")
    assert stopped is not None
    refused = [e for e in a_late if not e.get("accepted")]
    refused_total = len(refused) + (0 if stopped.get("checkpoint_accepted") else 1)
    accepted_late = [
        e for e in stage.find("write", "A") if e.get("accepted") and float(e["t"]) >= b_first_write
    ]
    noticed = [float(e["t"]) for e in [*stage.find("lost", "A"), stopped]]
    b_writes = stage.find("write", "B")
    b_end = stage.first("end", "B")
    a_release = stage.first("released", "A")
    result.figures.update(
        {
            "ttl_s": ttl,
            "pause_s": round(resumed_at - paused_at, 3),
            "pause_over_ttl": round((resumed_at - paused_at) / ttl, 2),
            "lease_expired_after_pause_s": round(expired.t - paused_at, 3) if expired else None,
            "b_claimed_after_expiry_s": (
                round(float(b_start["t"]) - expired.t, 3) if expired else None
            ),
            "a_fence": a_fence,
            "b_fence": b_fence,
            "a_lost_cause": stopped.get("cause"),
            "a_noticed_after_resume_s": round(min(noticed) - resumed_at, 3),
            "a_late_writes_refused": refused_total,
            "a_writes_accepted_after_b": len(accepted_late),
            "a_release_deleted_b_key": bool(a_release and a_release.get("released")),
            "b_steps_written": sum(1 for e in b_writes if e.get("accepted")),
            "b_lease_lost": len(stage.find("lost", "B") + stage.find("stopped", "B")),
        }
    )
    result.check(
        f"A was paused longer than the TTL ({resumed_at - paused_at:.2f}s > {ttl:.2f}s)",
        resumed_at - paused_at > ttl,
    )
    result.check(
        "B took the lease only after A's had expired on the server",
        expired is not None and float(b_start["t"]) >= expired.t - 0.06 and b_fence > a_fence,
    )
    result.check(
        f"A got LeaseLost ({stopped.get('cause')}) and stopped; its execution failed",
        first.failed() and type(first.result).__name__ == "LeaseLost",
    )
    result.check(
        f"A's late write was refused by the fencing guard ({refused_total} refused, "
        f"{len(accepted_late)} accepted after B started)",
        refused_total >= 1 and not accepted_late,
    )
    result.check(
        "A's release left B's lease alone", a_release is not None and not a_release.get("released")
    )
    result.check(
        f"B finished undisturbed ({result.figures['b_steps_written']}/8 steps "
        f"written, no LeaseLost)",
        b_end is not None
        and int(b_end.get("done", 0)) == 8
        and result.figures["b_steps_written"] == 8
        and not result.figures["b_lease_lost"],
    )
    return result


#: Scene name -> function, in the order the demo runs them.
SCENES: dict[str, Callable[[Context], SceneResult]] = {
    "duplicates": duplicates,
    "crash": crashed_holder,
    "long-run": long_run,
    "pause": pause,
}
