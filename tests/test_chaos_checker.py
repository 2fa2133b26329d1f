"""The fault campaign's checker finds every kind of broken promise in hand-made histories.

A checker that cannot fail proves nothing: each test plants one violation in an otherwise
clean history and asserts that exactly that rule reports it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from example_project.chaos.checker import check, summarize
from example_project.chaos.history import (
    Execution,
    Fault,
    History,
    Job,
    Parked,
    Preemption,
    WorkerSample,
    Write,
)
from example_project.chaos.run import main

T0 = 1_700_000_000.0
FENCE = 1_800_000_000_000_000  # fencing tokens are microseconds: far above 2**53 / 1000


def run(
    token: str, fence: int, start: float, end: float | None, key: str = "k1", **extra: object
) -> Execution:
    """An execution granted in [start - 0.01, start] whose body ended at ``end``."""
    fields = {
        "token": token,
        "key": key,
        "job": f"job-{token}",
        "task_id": f"task-{token}",
        "fence": fence,
        "worker": "w@host",
        "pid": 100,
        "grant_lower": start - 0.01,
        "grant_upper": start,
        "body_end": end,
        "outcome": "ok",
        "released": True,
        "confirmed_lower": None,
    }
    fields.update(extra)
    return Execution(**fields)  # type: ignore[arg-type]


def write(
    id_: int, token: str, fence: int, at: float, accepted: bool = True, key: str = "k1"
) -> Write:
    return Write(id_, key, f"job-{token}", token, fence, "w@host", 100, accepted, at, at + 0.001)


def worker(**extra: object) -> WorkerSample:
    fields = {
        "name": "w0-prefork",
        "pool": "prefork",
        "restarts": 0,
        "answered_ping": True,
        "same_process": True,
        "rss_start": 100 << 20,
        "rss_end": 110 << 20,
        "sockets_start": 12,
        "sockets_end": 14,
        "peers_start": {"lease": 2},
        "peers_end": {"lease": 3},
    }
    fields.update(extra)
    return WorkerSample(**fields)  # type: ignore[arg-type]


def clean() -> History:
    """Two executions of k1 one after the other, a skip, a probe: no violation."""
    a = run("a", FENCE, T0 + 1, T0 + 2, confirmed_lower=T0 + 1.5)
    b = run("b", FENCE + 5, T0 + 3, T0 + 4)
    probe = run("p", FENCE + 9, T0 + 10.2, T0 + 11, job="probe-1")
    return History(
        ttl=3.0,
        started_at=T0,
        nemesis_end=T0 + 9,
        finished_at=T0 + 15,
        writes=[
            write(1, "a", a.fence, T0 + 1.2),
            write(2, "a", a.fence, T0 + 1.6),
            write(3, "b", b.fence, T0 + 3.2),
            write(10, "p", probe.fence, T0 + 10.5),
        ],
        executions=[a, b, probe],
        jobs=[
            Job("job-a", "k1", "delay", "task-a", T0 + 0.9, "ran"),
            Job("job-b", "k1", "send_task", "task-b", T0 + 2.9, "ran"),
            Job("job-c", "k1", "duplicate", "task-c", T0 + 1.1, "skipped", holder="h:1"),
            Job("probe-1", "k1", "probe", "task-p", T0 + 10.0, "ran"),
        ],
        faults=[Fault("pause_store", "lease redis", T0 + 5, T0 + 6)],
        workers=[worker()],
    )


def rules(history: History) -> list[tuple[int, str]]:
    return [(v.property, v.rule) for v in check(history)]


def test_a_clean_history_passes() -> None:
    assert rules(clean()) == []


def test_an_accepted_write_with_a_lower_token_after_a_higher_one_is_found() -> None:
    history = clean()
    history.writes.append(write(5, "a", FENCE, T0 + 3.5))  # a's token after b's was accepted
    assert rules(history) == [(1, "lower-token-accepted")]


def test_a_refused_stale_write_is_no_violation() -> None:
    history = clean()
    history.writes.append(write(5, "a", FENCE, T0 + 3.5, accepted=False))
    assert rules(history) == []


def test_two_executions_writing_with_one_token_are_found() -> None:
    history = clean()
    history.executions.append(run("c", FENCE + 5, T0 + 4.5, T0 + 4.8))
    history.writes.append(write(5, "c", FENCE + 5, T0 + 4.6))
    assert (1, "token-shared") in rules(history)


def test_a_later_grant_with_a_lower_token_is_found() -> None:
    history = clean()
    history.executions.append(run("c", FENCE + 2, T0 + 5, T0 + 5.5))  # after b, below it
    assert (1, "token-not-increasing") in rules(history)


def test_a_renewal_confirmed_after_a_later_grant_is_found() -> None:
    history = clean()
    history.executions[0].confirmed_lower = T0 + 3.4  # b was granted by T0 + 3
    history.executions[0].body_end = None  # (so only the exclusion rule can see it)
    assert rules(history) == [(2, "overlap-on-server")]


def test_a_body_running_after_a_later_grant_and_never_told_is_found() -> None:
    history = clean()
    history.executions[0].body_end = T0 + 3.3  # still running after b's grant at T0 + 3
    # Both ended normally, so the direct form of the promise sees it too.
    assert rules(history) == [(3, "silent-loser"), (6, "two-running")]


def test_a_release_whose_reply_was_read_later_does_not_count_as_told() -> None:
    history = clean()
    a = history.executions[0]
    a.body_end, a.released = T0 + 3.3, None  # lease_released said released=None
    assert rules(history) == [(3, "silent-loser"), (6, "two-running")]


@pytest.mark.parametrize("told", ["lost", "refused", "release"])
def test_a_loser_that_was_told_is_no_violation(told: str) -> None:
    history = clean()
    a = history.executions[0]
    a.body_end = T0 + 3.3
    if told == "lost":
        a.outcome, a.lost_cause = "lost", "refused"
    elif told == "refused":
        history.writes.append(write(5, "a", FENCE, T0 + 3.25, accepted=False))
    else:
        a.released = False
    assert rules(history) == []


def test_an_unresolved_job_and_a_skip_without_holder_are_found() -> None:
    history = clean()
    history.jobs.append(
        Job("job-x", "k2", "retry", "task-x", T0 + 2, "unresolved", "state PENDING")
    )
    history.jobs[2].holder = ""
    assert sorted(rules(history)) == [(4, "job-unresolved"), (4, "skip-without-holder")]


@pytest.mark.parametrize(("resolution", "granted"), [("skipped", None), ("ran", 14.5)])
def test_a_probe_that_did_not_progress_within_ttl_plus_one_is_found(
    resolution: str, granted: float | None
) -> None:
    history = clean()
    history.jobs[3].resolution = resolution
    if granted is None:
        history.executions.pop()
    else:
        history.executions[2].grant_upper = T0 + granted  # 4.5 s > TTL + 1 s after sending
    assert (4, "no-progress") in rules(history)


def test_a_lease_left_held_and_a_stuck_worker_are_found() -> None:
    history = clean()
    history.leftover_leases = [{"key": "chaos-lease:k3", "pttl": 2500, "value": "t:1:{}"}]
    history.workers[0].answered_ping = False
    assert sorted(rules(history)) == [(4, "lease-left-held"), (4, "worker-stuck")]


def test_leaks_are_found_in_a_worker_that_was_not_restarted() -> None:
    history = clean()
    history.keys_without_ttl = ["chaos-lease:k1:fence"]
    history.workers[0].peers_end = {"lease": 30}
    history.workers[0].rss_end = 400 << 20
    assert sorted(rules(history)) == [(5, "key-without-ttl"), (5, "rss-grew"), (5, "sockets-grew")]
    history.workers[0].same_process = False  # two different processes prove nothing
    assert rules(history) == [(5, "key-without-ttl")]


def test_the_summary_counts_faults_stalls_and_losses() -> None:
    history = clean()
    history.executions.append(
        run("l", FENCE + 7, T0 + 5.5, None, key="k2", outcome="lost", lost_cause="deadline")
    )
    counts = summarize(history, check(history))
    assert counts["faults_by_kind"] == {"pause_store": 1}
    assert counts["stall_after_fault_s"] == {"median": 4.501, "max": 4.501}  # next write T0+10.5
    assert counts["losses_by_cause"] == {"deadline": 1}
    assert counts["jobs_by_resolution"] == {"ran": 3, "skipped": 1}
    assert counts["violations"] == 0


def test_a_saved_history_with_a_violation_exits_non_zero_and_lists_it(tmp_path: Path) -> None:
    history = clean()
    history.writes.append(write(5, "a", FENCE, T0 + 3.5))
    saved = tmp_path / "history.json"
    saved.write_text(json.dumps(history.to_dict()))
    out = tmp_path / "report.json"
    assert main(["--check", str(saved), "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    assert [v["rule"] for v in report["violations"]] == ["lower-token-accepted"]
    assert report["counts"]["writes_accepted"] == 5
    saved.write_text(json.dumps(clean().to_dict()))
    assert main(["--check", str(saved)]) == 0


def test_two_executions_of_one_key_that_both_ended_normally_while_overlapping_are_found() -> None:
    history = clean()
    history.executions.append(run("c", FENCE + 6, T0 + 3.5, T0 + 4.5))
    assert (6, "two-running") in rules(history)


def folded(onto: str, decided: float, resolution: str = "ran") -> Job:
    return Job(
        "job-f",
        "k1",
        "dedupe",
        "task-f",
        decided,
        resolution,
        disposition="deduplicated",
        folded_onto=onto,
        decided_lower=decided,
        decided_upper=decided + 0.01,
    )


def test_a_publish_folded_onto_a_copy_that_had_started_is_found() -> None:
    history = clean()
    history.jobs.append(folded("task-b", T0 + 3.5))  # b was granted at T0 + 3
    assert rules(history) == [(6, "folded-onto-started")]


def test_a_publish_folded_onto_a_copy_granted_after_it_or_skipped_is_no_violation() -> None:
    history = clean()
    history.jobs += [folded("task-b", T0 + 2.5), folded("task-b", T0 + 3.5, "skipped")]
    history.jobs[-1].holder = "h:1"
    assert rules(history) == []


def test_with_min_replicas_a_publish_folded_onto_a_copy_that_never_ran_is_found() -> None:
    history = clean()
    history.jobs.append(folded("task-gone", T0 + 3.5, "unresolved"))  # no run of task-gone
    history.jobs[-1].detail = "folded onto task-gone, a copy no job published"
    assert rules(history) == [(4, "job-unresolved")]  # lease_min_replicas=0: property 4 alone
    history.dedupe_min_replicas = 1  # a fold counts once a replica has it: never onto nothing
    assert rules(history) == [(4, "job-unresolved"), (6, "folded-onto-no-run")]
    history.jobs[-1].resolution, history.jobs[-1].holder = "skipped", "h:1"
    assert rules(history) == []  # the copy was skipped naming a holder: so was the fold
    history.faults.append(Fault("failover", "SENTINEL FAILOVER", T0 + 3.4, T0 + 3.6))
    history.jobs.append(folded("task-b", T0 + 3.5))  # onto b, granted at T0 + 3, by a failover
    assert rules(history) == [(6, "folded-onto-started")]


def test_a_claim_left_past_its_lifetime_or_without_one_is_found() -> None:
    history = clean()
    claim = {"key": "lease:{k1}", "task_id": "task-x", "age": 4.0, "lifetime": 10.0, "ttl": 6.0}
    history.leftover_claims = [claim]
    assert rules(history) == []
    history.leftover_claims = [{**claim, "age": 12.0, "ttl": 0.5}, {**claim, "ttl": -1.0}]
    assert rules(history) == [(6, "claim-outlived")] * 2


def handover() -> History:
    """Clean, plus a coalesced trigger covered by a later run and two queued waiters in order."""
    history = clean()
    pending = run("cp", FENCE + 20, T0 + 6, T0 + 6.5, key="c1", task_id="pending-1")
    first = run("q1", FENCE + 30, T0 + 7, T0 + 7.5, key="q1", task_id="task-q1")
    second = run("q2", FENCE + 31, T0 + 8, T0 + 8.5, key="q1", task_id="task-q2")
    history.executions += [pending, first, second]
    history.jobs += [
        Job("job-c", "c1", "coalesce", "task-c", T0 + 5, "coalesced", covered_by="pending-1"),
        Job("job-q1", "q1", "queue", "task-q1", T0 + 5, "ran"),
        Job("job-q2", "q1", "queue", "task-q2", T0 + 5.2, "ran"),
    ]
    history.parked += [
        Parked("task-c", "c1", "coalesce", "pending-1", T0 + 5.1, T0 + 5.2),
        Parked("task-q1", "q1", "queue", "task-q1", T0 + 5.1, T0 + 5.2),
        Parked("task-q2", "q1", "queue", "task-q2", T0 + 5.3, T0 + 5.4),
    ]
    return history


def test_a_clean_hand_over_history_passes() -> None:
    assert rules(handover()) == []


def test_a_coalesced_trigger_whose_covering_run_never_ran_is_a_lost_trigger() -> None:
    history = handover()
    history.executions = [e for e in history.executions if e.task_id != "pending-1"]
    assert rules(history) == [(7, "lost-trigger")]
    history.faults.append(Fault("restart_empty", "lease redis", T0 + 4.8, T0 + 4.95))
    assert rules(history) == [(7, "lost-trigger")]  # emptied before it was submitted
    history.faults.append(Fault("failover", "SENTINEL FAILOVER", T0 + 4.9, T0 + 5.05))
    assert rules(history) == [(7, "lost-trigger")]  # a replica in sync kept the line
    history.faults.append(Fault("failover", "SENTINEL FAILOVER", T0 + 4.9, T0 + 5.05, lossy=True))
    assert rules(history) == []  # a node not in sync was promoted: the line may be lost
    history.faults.append(Fault("restart_empty", "lease redis", T0 + 4.9, T0 + 5.05))
    assert rules(history) == []  # the store may have been emptied after it was parked


def test_a_covering_run_that_started_before_the_trigger_was_parked_is_found() -> None:
    history = handover()
    history.parked[0] = Parked("task-c", "c1", "coalesce", "pending-1", T0 + 6.2, T0 + 6.3)
    assert rules(history) == [(7, "run-before-trigger")]


def test_a_waiter_parked_later_that_started_first_is_out_of_order() -> None:
    history = handover()
    for e in history.executions:
        if e.task_id == "task-q2":  # ran first, with the lower token, and ended before q1
            e.grant_lower, e.grant_upper, e.body_end, e.fence = T0 + 6.7, T0 + 6.8, T0 + 6.9, 0
    assert rules(history) == [(7, "out-of-order")]
    history.faults.append(Fault("restart_empty", "lease redis", T0 + 1.0, T0 + 1.2))
    assert rules(history) == [(7, "out-of-order")]  # emptied before the first was parked
    history.faults.append(Fault("restart_empty", "lease redis", T0 + 5.5, T0 + 5.7))
    assert rules(history) == []  # emptied while it waited: its line was lost with the store


def test_with_min_replicas_a_waiter_whose_turn_came_in_a_failover_may_lose_its_place() -> None:
    history = handover()  # the primary was paused from T0 + 5 to T0 + 6, while q1 waited
    for e in history.executions:
        if e.task_id == "task-q2":
            e.grant_lower, e.grant_upper, e.body_end, e.fence = T0 + 6.7, T0 + 6.8, T0 + 6.9, 0
    assert rules(history) == [(7, "out-of-order")]  # lease_min_replicas=0: grants went on
    history.debounce_min_replicas = 1
    assert rules(history) == [(7, "out-of-order")]  # q1 is no debounce key
    history.jobs += [Job("job-d", "q1", "debounce", "task-d", T0 + 1, "ran")]
    # No grant counted until the primary answered again: q1's reservation lapsed.
    assert rules(history) == []
    history.faults = [Fault("failover", "SIGKILL of the primary", T0 + 6.85, T0 + 7.0)]
    assert rules(history) == [(7, "out-of-order")]  # after q2 started: no excuse
    history.faults = [Fault("failover", "SIGKILL of the primary", T0 + 5.5, T0 + 6.0)]
    assert rules(history) == []  # no replica followed the primary when q1's turn came


def test_a_grant_within_the_cooldown_after_a_success_is_found() -> None:
    history = clean()
    history.cooldown = 1.5  # a ended ok at T0 + 2; b was granted by T0 + 3
    assert rules(history) == [(8, "started-in-cooldown")]


def test_a_grant_after_the_cooldown_or_after_a_failure_or_an_erased_store_is_no_violation() -> None:
    history = clean()
    history.cooldown = 0.9  # b's grant at T0 + 3 is after a's window (T0 + 2 + 0.9)
    assert rules(history) == []
    history.cooldown = 1.5
    history.executions[0].outcome = "lost"  # a failure leaves no cooldown
    history.executions[0].body_end = None
    assert rules(history) == []
    history = clean()
    history.cooldown = 1.5
    history.faults.append(Fault("restart_empty", "lease redis", T0 + 2.2, T0 + 2.4))
    assert rules(history) == []


def debounced() -> History:
    """A burst of three publishes of b1 (decided at T0 + 0.5, + 0.8, + 1.1) run once with the
    last one's arguments at T0 + 1.7, under a cap of 2 s: no violation."""
    history = clean()
    history.debounce_cap = 2.0
    for n, at in enumerate((0.5, 0.8, 1.1)):
        history.jobs.append(
            Job(
                f"job-b{n}",
                "b1",
                "debounce",
                f"task-b{n}",
                T0 + at,
                "ran",
                disposition="debounced",
                folded_onto="task-b0",
                decided_lower=T0 + at,
                decided_upper=T0 + at + 0.01,
            )
        )
    history.executions.append(
        run("d", FENCE, T0 + 1.7, T0 + 2.5, key="b1", job="job-b2", task_id="task-b0")
    )
    history.writes.append(write(20, "d", FENCE, T0 + 2.0, key="b1"))
    return history


def test_a_clean_debounce_history_passes() -> None:
    assert rules(debounced()) == []


def test_a_burst_that_ran_to_its_end_twice_is_found() -> None:
    history = debounced()
    history.executions.append(
        run("d2", FENCE + 1, T0 + 3.0, T0 + 3.5, key="b1", job="job-b2", task_id="task-b0")
    )
    assert rules(history) == [(11, "burst-ran-twice")]
    history.faults.append(Fault("restart_empty", "lease redis", T0 + 0.9, T0 + 1.0))
    assert rules(history) == [(11, "burst-ran-twice")]  # emptied before the first run
    history.faults.append(Fault("failover", "SIGKILL of primary", T0 + 2.7, T0 + 2.8))
    assert rules(history) == [(11, "burst-ran-twice")]  # to a replica in sync: no excuse
    history.faults.append(Fault("failover", "SIGKILL of primary", T0 + 2.7, T0 + 2.8, lossy=True))
    assert rules(history) == []  # to a node not in sync: the tombstone was lost with it
    history.faults = history.faults[:-2]
    history.faults.append(Fault("restart_empty", "lease redis", T0 + 2.7, T0 + 2.8))
    assert rules(history) == []  # its tombstone erased: a timer of it ran as published


def test_a_burst_whose_first_run_the_store_never_confirmed_released_may_run_again() -> None:
    history = debounced()
    history.executions[-1].released = None  # its release timed out: the store may not know
    history.executions.append(
        run("d2", FENCE + 1, T0 + 3.0, T0 + 3.5, key="b1", job="job-b2", task_id="task-b0")
    )
    assert rules(history) == []  # as after a run that died before its release
    history.executions.append(
        run("d3", FENCE + 2, T0 + 4.0, T0 + 4.5, key="b1", job="job-b2", task_id="task-b0")
    )
    assert rules(history) == [(11, "burst-ran-twice")]  # d2's release was confirmed


def test_a_burst_run_with_the_arguments_of_a_publish_before_the_last_is_found() -> None:
    history = debounced()
    history.executions[-1].job = "job-b1"  # job-b2 was decided surely after job-b1
    assert rules(history) == [(11, "not-latest-arguments")]
    history.faults.append(Fault("restart_empty", "lease redis", T0 + 1.2, T0 + 1.3))
    assert rules(history) == []  # the record was lost: the timer ran what it carried


def test_a_burst_run_past_its_cap_is_found_unless_a_fault_or_the_previous_run_delayed_it() -> None:
    history = debounced()
    late = history.executions[-1]
    late.grant_lower, late.grant_upper, late.body_end = T0 + 8.0, T0 + 8.01, T0 + 8.5
    history.writes[-1] = write(20, "d", FENCE, T0 + 8.2, key="b1")
    history.faults = []  # the clean history's pause at T0 + 5 would excuse it
    assert rules(history) == [(11, "ran-past-cap")]
    history.faults.append(Fault("kill_worker", "w0", T0 + 2.0, T0 + 2.1))
    assert rules(history) == []


def test_a_burst_left_waiting_past_its_cap_is_found() -> None:
    history = debounced()
    history.leftover_claims.append(
        {
            "key": "b2",
            "task_id": "task-x",
            "age": 9.0,
            "lifetime": 2.0,
            "ttl": 86_400.0,
            "debounced": 3,
            "due_in": 0.0,
        }
    )
    assert rules(history) == [(11, "burst-left-waiting")]
    history.leftover_claims[-1]["age"] = 1.0  # still within its cap: no promise broken
    assert rules(history) == []


def test_a_waiter_that_ran_and_retried_before_it_parked_is_ordered_by_its_run_after_the_park() -> (
    None
):
    history = handover()
    # q2 ran once before any park (it asked for a retry), then its retry parked after q1's.
    history.executions.append(
        run("q2a", FENCE + 25, T0 + 4.0, T0 + 4.5, key="q1", task_id="task-q2", outcome="retry")
    )
    assert rules(history) == []


def preempted() -> History:
    """k1's holder a taken over by b at T0 + 1.5 (told at once, cause preempted), then b
    writes: no violation."""
    history = clean()
    a = run(
        "a",
        FENCE,
        T0 + 1,
        None,
        outcome="lost",
        lost_cause="preempted",
        lost_at=T0 + 1.52,
        released=False,
    )
    b = run("b", FENCE + 5, T0 + 1.5, T0 + 2.5)
    history.executions[:2] = [a, b]
    history.writes[:3] = [
        write(1, "a", a.fence, T0 + 1.2),
        write(2, "b", b.fence, T0 + 1.9),
        write(3, "b", b.fence, T0 + 2.2),
    ]
    history.jobs[1].submitted_at = T0 + 1.4
    history.preemptions = [Preemption("b", "a", "k1", T0 + 1.5, 1)]
    history.preempt_grace = 0.5
    return history


def test_a_clean_take_over_passes_and_is_counted() -> None:
    history = preempted()
    assert rules(history) == []
    counts = summarize(history, [])
    assert counts["preemptions"] == 1 and counts["preempted_by_outcome"] == {"lost:preempted": 1}


def test_a_preempted_holders_write_accepted_after_the_newcomers_is_found() -> None:
    history = preempted()
    history.writes.append(write(4, "a", FENCE, T0 + 2.3))  # the guard let it through
    assert rules(history) == [(1, "lower-token-accepted"), (9, "preempted-write-accepted")]


def test_a_preempted_holder_acting_past_grace_and_a_renewal_interval_is_found() -> None:
    history = preempted()
    history.executions[0].lost_at = T0 + 1.5 + 0.5 + 1.0 + 1.6  # grace + TTL/3 + slack + 0.1
    assert rules(history) == [(9, "overlap-too-long")]
    history.faults.append(Fault("stop_worker", "w0", T0 + 2.0, T0 + 3.0))  # it was frozen
    assert rules(history) == []


def test_a_preempted_holder_told_with_another_cause_is_found_unless_a_write_told_it() -> None:
    history = preempted()
    history.executions[0].lost_cause = "refused"
    assert rules(history) == [(9, "preempted-not-told-so")]
    history.writes.insert(1, write(5, "a", FENCE, T0 + 1.55, accepted=False))
    assert rules(history) == []


def limited(n: int, overlapping: int) -> History:
    """The clean history, ``overlapping`` untold executions of limited key ``l1`` running at
    once, under ``lease_limit=n``."""
    history = clean()
    history.limit = n
    for i in range(overlapping):
        token = f"l{i}"
        history.executions.append(run(token, FENCE + 20 + i, T0 + 3 + i * 0.1, T0 + 5, key="l1"))
        history.jobs.append(
            Job(f"job-{token}", "l1", "limited", f"task-{token}", T0 + 2.9 + i * 0.1, "ran")
        )
    return history


def test_n_executions_of_a_limited_key_at_once_are_no_violation() -> None:
    assert rules(limited(3, 3)) == []


def test_more_than_n_executions_of_a_limited_key_at_once_are_found() -> None:
    assert rules(limited(3, 4)) == [(10, "more-than-n")]


def test_more_than_n_at_once_told_of_a_loss_or_one_after_another_is_no_violation() -> None:
    told = limited(3, 4)
    told.executions[-1].outcome = "lost"
    assert rules(told) == []
    apart = limited(3, 3)
    apart.executions.append(run("l9", FENCE + 40, T0 + 5.5, T0 + 6, key="l1"))
    apart.jobs.append(Job("job-l9", "l1", "limited", "task-l9", T0 + 5.4, "ran"))
    assert rules(apart) == []
