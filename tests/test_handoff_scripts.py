"""The hand-over scripts (coalesce, queue), each run alone on a real Redis: parking a duplicate,
the release that reserves the key for the next run, the acquire that honours the reservation,
the crash sweep's look, and the sweep's index."""

from __future__ import annotations

import time
from typing import Any

import redis

from celery_lease.base.keys import fence_key, handoff_index_key, line_key, reservation_key
from tests.test_scripts import HOLDER, KEY, TTL, acquire, client, run, token

__all__ = ["client"]  # the fixture, used by name

LINE, RESERVED, INDEX = line_key(KEY), reservation_key(KEY), handoff_index_key("lease")
LIFETIME = 60_000


def take(client: redis.Redis, tok: str, task_id: str, handed_over: bool = False) -> Any:
    return run(
        client,
        "lease/acquire-4.lua",
        [KEY, fence_key(KEY), RESERVED],
        [tok, TTL, HOLDER, TTL + 3_600_000, task_id, "1" if handed_over else "0"],
    )


def park(
    client: redis.Redis,
    mode: str,
    task_id: str,
    message: str,
    most: int = 10,
    handed_over: bool = False,
) -> Any:
    return run(
        client,
        "handoff/park-3.lua",
        [KEY, LINE, RESERVED],
        [mode, task_id, message, most, LIFETIME, "1" if handed_over else "0"],
    )


def release_handoff(
    client: redis.Redis,
    tok: str,
    reserve: int = 5000,
    timeout: int = 0,
    ran: str = "",
    handed_over: str | None = None,
) -> Any:
    argv: list[Any] = [tok, reserve, LIFETIME, timeout, ran]
    if handed_over is not None:
        argv += ["queue", handed_over]
    return run(client, "handoff/release_handoff-4.lua", [KEY, fence_key(KEY), LINE, RESERVED], argv)


def recover(client: redis.Redis, reserve: int = 5000, timeout: int = 0) -> Any:
    return run(
        client,
        "handoff/release_handoff-4.lua",
        [KEY, fence_key(KEY), LINE, RESERVED],
        ["", reserve, LIFETIME, timeout, ""],
    )


def held(client: redis.Redis) -> str:
    t = token()
    assert acquire(client, t)[0] == 1
    return t


def test_park_on_a_free_key_writes_nothing_and_answers_free(client: redis.Redis) -> None:
    assert park(client, "coalesce", "p1", "m1") == [0, 0]
    assert park(client, "queue", "q1", "m1") == [0, 0]
    assert client.exists(LINE) == 0


def test_coalesce_keeps_one_pending_run_whose_message_the_latest_duplicate_replaces(
    client: redis.Redis,
) -> None:
    held(client)
    assert park(client, "coalesce", "p1", "first") == [1, "p1", 1]
    assert park(client, "coalesce", "p2", "latest") == [1, "p1", 1]  # joins p1
    (element,) = client.lrange(LINE, 0, -1)
    pending_id, stamp, message = element.split("\n", 2)
    assert (pending_id, message) == ("p1", "latest")
    assert abs(int(stamp) - time.time() * 1000) < 60_000  # the store's clock, milliseconds
    assert 0 < client.pttl(LINE) <= LIFETIME


def test_queue_appends_in_arrival_order_up_to_its_bound(client: redis.Redis) -> None:
    held(client)
    assert park(client, "queue", "a", "ma", most=2) == [1, "a", 1]
    assert park(client, "queue", "b", "mb", most=2) == [1, "b", 2]
    assert park(client, "queue", "c", "mc", most=2) == [-1, 2]
    assert [e.split("\n")[0] for e in client.lrange(LINE, 0, -1)] == ["a", "b"]


def test_queue_parks_a_task_id_once_so_a_second_copy_of_it_keeps_the_first_ones_place(
    client: redis.Redis,
) -> None:
    held(client)
    assert park(client, "queue", "a", "ma", most=2) == [1, "a", 1]
    assert park(client, "queue", "b", "mb", most=2) == [1, "b", 2]
    assert park(client, "queue", "a", "ma again", most=2) == [1, "a", 1]  # a full line too
    assert client.lrange(LINE, 0, -1)[0].endswith("\nma")
    assert [e.split("\n")[0] for e in client.lrange(LINE, 0, -1)] == ["a", "b"]
    assert park(client, "queue", "ab", "mab", most=3) == [1, "ab", 3]  # a prefix is another id


def test_release_handoff_releases_reserves_the_key_for_the_head_and_answers_it(
    client: redis.Redis,
) -> None:
    t = held(client)
    park(client, "queue", "a", "ma")
    park(client, "queue", "b", "mb")
    reply = release_handoff(client, t, reserve=4000)
    assert reply[0] == 1 and reply[1].startswith("a\n") and reply[1].endswith("\nma")
    assert reply[3:] == []  # nothing expired
    assert client.exists(KEY) == 0 and client.get(fence_key(KEY)).endswith(":" + t)
    assert client.hget(RESERVED, "id") == "a"
    assert 0 < int(client.hget(RESERVED, "due")) - reply[2] <= 4000
    assert [e.split("\n")[0] for e in client.lrange(LINE, 0, -1)] == ["b"]


def test_a_reserved_key_is_held_for_other_task_ids_and_granted_to_the_reserved_one(
    client: redis.Redis,
) -> None:
    t = held(client)
    park(client, "queue", "a", "ma")
    release_handoff(client, t)
    refused = take(client, token(), "intruder")
    assert refused[0] == 0 and refused[1] == "reserved:a" and 0 < refused[2] <= 5000
    assert park(client, "queue", "late", "ml")[0] == 1  # a reserved key parks duplicates
    granted = take(client, token(), "a", handed_over=True)
    assert granted[0] == 1
    assert client.hget(RESERVED, "id") is None


def test_a_second_copy_of_a_handed_over_run_that_released_is_refused_one_that_died_is_not(
    client: redis.Redis,
) -> None:
    t = held(client)
    park(client, "queue", "a", "ma")
    release_handoff(client, t)
    first = token()
    assert take(client, first, "a", handed_over=True)[0] == 1
    client.delete(KEY)  # it died: no release noted it; a redelivered copy runs again
    second = token()
    assert take(client, second, "a", handed_over=True)[0] == 1
    assert release_handoff(client, second, ran="a")[0] == 1  # ran to its release
    assert take(client, token(), "a", handed_over=True) == [0, "ran:a", 0]
    assert take(client, token(), "a")[0] == 1  # a plain call of the same id is not refused


def test_a_copy_of_a_handed_over_run_retried_past_later_runs_is_refused_and_not_parked(
    client: redis.Redis,
) -> None:
    def run_handed_over(task_id: str) -> None:
        holder = token()
        assert take(client, holder, task_id, handed_over=True)[0] == 1
        assert release_handoff(client, holder, ran=task_id)[0] == 1

    run_handed_over("a")
    run_handed_over("b")  # a later run of the key: "a" is still known to have run
    assert client.hget(RESERVED, "ran") == "~b ~a"  # '~': it may have retried
    assert take(client, token(), "a", handed_over=True) == [0, "ran:a", 0]
    holder = held(client)
    assert park(client, "queue", "a", "ma", handed_over=True) == [-2, 0]  # not parked
    assert park(client, "queue", "a", "ma")[0] == 1  # a plain copy (a retry of it) parks
    client.delete(LINE)
    assert release_handoff(client, holder)[0] == 1
    for n in range(25):
        run_handed_over(f"r{n}")
    kept = client.hget(RESERVED, "ran").split()
    assert kept[:2] == ["~r24", "~r23"] and len(kept) == 20  # bounded, newest first


def test_a_run_that_ended_while_its_own_element_waits_takes_it_out_and_hands_the_next_over(
    client: redis.Redis,
) -> None:
    # A copy of waiting run "a" (sent again after a store error, no hand-over header) took
    # the key while a's element waited in the line: a's release must not hand the key to a.
    t = held(client)
    park(client, "queue", "a", "ma")
    park(client, "queue", "b", "mb")
    reply = release_handoff(client, t, ran="a", handed_over="0")
    assert reply[0] == 1 and reply[1].startswith("b\n")
    assert client.llen(LINE) == 0 and client.hget(RESERVED, "ran") == "a"
    assert take(client, token(), "a", handed_over=True) == [0, "ran:a", 0]  # a late copy


def test_a_run_that_ended_with_nothing_waiting_for_its_key_notes_nothing(
    client: redis.Redis,
) -> None:
    t = held(client)
    reply = release_handoff(client, t, ran="a", handed_over="0")
    assert reply[:2] == [1, ""] and reply[3:] == []
    assert client.exists(RESERVED, LINE) == 0  # no state left behind for a key nobody waits for


def test_a_handed_over_grant_taken_back_reserves_the_key_for_its_run_again(
    client: redis.Redis,
) -> None:
    t = held(client)
    park(client, "queue", "a", "ma")
    park(client, "queue", "b", "mb")
    release_handoff(client, t, reserve=4000)
    granted = token()
    assert take(client, granted, "a", handed_over=True)[0] == 1  # ...no replica acknowledged it
    ungrant = [KEY, fence_key(KEY), RESERVED]
    assert run(client, "lease/ungrant-3.lua", ungrant, [granted, "a", "1", 4000]) == 2
    assert client.exists(KEY) == 0 and client.get(fence_key(KEY)).endswith(":" + granted)
    assert take(client, token(), "b")[1] == "reserved:a"  # a keeps its turn
    assert run(client, "lease/ungrant-3.lua", ungrant, [granted, "a", "1", 4000]) == 1  # repeat
    assert take(client, token(), "a", handed_over=True)[0] == 1  # its copy sent again
    plain = token()
    assert take(client, plain, "c")[0] == 0  # held by a's copy
    client.delete(KEY, RESERVED)
    assert take(client, plain, "c")[0] == 1
    assert run(client, "lease/ungrant-3.lua", ungrant, [plain, "c", "0", 4000]) == 1
    assert client.exists(KEY, RESERVED) == 0  # not a handed-over run: nothing reserved


def test_a_handed_over_run_that_retried_refuses_its_stale_copies_until_its_retry_parks(
    client: redis.Redis,
) -> None:
    t = held(client)
    park(client, "queue", "a", "ma")
    release_handoff(client, t)
    first = token()
    assert take(client, first, "a", handed_over=True)[0] == 1
    assert release_handoff(client, first, ran="a", handed_over="2")[0] == 1  # it retried
    assert take(client, token(), "a", handed_over=True) == [0, "ran:a", 0]  # a stale copy
    holder = held(client)
    assert park(client, "queue", "a", "ma", handed_over=True) == [-2, 0]  # a stale copy
    assert client.hget(RESERVED, "ran") == "~a"
    assert park(client, "queue", "a", "retry of a")[0] == 1  # its retry, without the header
    assert client.hget(RESERVED, "ran") is None
    assert release_handoff(client, holder)[1].startswith("a\n")
    client.hdel(RESERVED, "id", "due", "el")  # its reservation lapsed (a long store outage)
    retry = token()
    assert take(client, retry, "a", handed_over=True)[0] == 1  # the retry still runs
    assert release_handoff(client, retry, ran="a", handed_over="1")[0] == 1  # ...to its end
    holder = held(client)
    assert park(client, "queue", "a", "a copy sent again")[0] == -2  # ended: not parked
    assert release_handoff(client, holder)[1] == ""


def test_a_reservation_past_due_no_longer_holds_the_key(client: redis.Redis) -> None:
    t = held(client)
    park(client, "queue", "a", "ma")
    release_handoff(client, t, reserve=1)
    time.sleep(0.01)
    assert take(client, token(), "other")[0] == 1


def test_release_handoff_without_a_line_answers_no_run_and_a_repeat_answers_1(
    client: redis.Redis,
) -> None:
    t = held(client)
    assert release_handoff(client, t)[:2] == [1, ""]
    assert release_handoff(client, t) == 1
    assert release_handoff(client, token()) == 0
    assert client.exists(RESERVED) == 0


def test_release_handoff_takes_out_waiters_past_the_wait_timeout(client: redis.Redis) -> None:
    t = held(client)
    park(client, "queue", "old", "mo")
    time.sleep(0.05)
    park(client, "queue", "new", "mn")
    reply = release_handoff(client, t, timeout=30)
    assert reply[1].startswith("new\n")
    assert [e.split("\n")[0] for e in reply[3:]] == ["old"]
    assert client.llen(LINE) == 0


def test_the_sweeps_look_leaves_a_held_key_to_its_holder_and_answers_its_time_left(
    client: redis.Redis,
) -> None:
    held(client)
    park(client, "coalesce", "p1", "m")
    client.pexpire(LINE, 100)
    code, wait = recover(client)
    assert code == 0 and 0 < wait <= TTL
    assert client.llen(LINE) == 1 and client.pttl(LINE) > 100  # kept alive for the holder


def test_the_sweeps_look_hands_over_once_the_holder_is_gone_and_again_once_past_due(
    client: redis.Redis,
) -> None:
    held(client)
    park(client, "coalesce", "p1", "m")
    client.delete(KEY)  # the holder died and its lease expired
    reply = recover(client, reserve=50)
    assert reply[0] == 1 and reply[1].startswith("p1\n")
    assert recover(client, reserve=50)[0] == 0  # reserved and due: wait
    time.sleep(0.06)
    assert recover(client, reserve=50)[1].startswith("p1\n")  # not taken: published again
    assert take(client, token(), "p1", handed_over=True)[0] == 1
    client.delete(KEY)
    assert recover(client)[:2] == [1, ""]  # nothing waits any more


def test_watch_take_due_and_forget_keep_one_sweep_at_a_time_per_key(client: redis.Redis) -> None:
    run(client, "handoff/watch-1.lua", [INDEX], [KEY, 0, LIFETIME])
    assert 0 < client.pttl(INDEX) <= LIFETIME
    due = run(client, "handoff/sweep_due-1.lua", [INDEX], [10, 5000])
    assert due[0] == KEY
    assert run(client, "handoff/sweep_due-1.lua", [INDEX], [10, 5000]) == []  # scored ahead
    run(client, "handoff/watch-1.lua", [INDEX], [KEY, 10_000, LIFETIME])  # noted again meanwhile
    assert run(client, "handoff/unwatch-1.lua", [INDEX], [KEY, due[1]]) == 0
    score = int(client.zscore(INDEX, KEY))
    assert run(client, "handoff/unwatch-1.lua", [INDEX], [KEY, score]) == 1
    assert client.exists(INDEX) == 0
