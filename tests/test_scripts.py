"""Every Lua script held to its header: the header names exactly the KEYS and ARGV it uses,
and each script, run alone on a real Redis, answers and writes what its header says. The
shared library (``scripts/lib/``) is held to its headers too: a file of functions names each
one it defines and reads no KEYS or ARGV of its own."""

from __future__ import annotations

import itertools
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_lease import store
from celery_lease.base.keys import (
    beat_leader_key,
    claim_key,
    fence_key,
    hold_key,
    last_run_key,
    reservation_key,
    wake_key,
)
from celery_lease.store import FENCE_COUNTER_EXTRA_MS, holder_json, lua

SCRIPTS = lua.names()
_FOLDER = resources.files(lua.__package__).joinpath("scripts")
LIB = sorted(f"lib/{p.name}" for p in _FOLDER.joinpath("lib").iterdir() if p.name.endswith(".lua"))
#: The scripts pages: the conventions and the plain lease's, then the shaping policies' and beat's.
DOCS = [
    Path(__file__).parent.parent / "docs" / "reference" / name
    for name in ("scripts.md", "scripts-shaping.md")
]

_ENTRY = re.compile(r"^(KEYS|ARGV)\[([^\]]+)\]\s+\S", re.M)
_RANGE = re.compile(r"^\d+\.\.n(\+\d+)?$")  # "1..n", "2..n+1": any number of entries
_INCLUDE = re.compile(r"^ *--@include (\S+)$", re.M)
_FUNCTION = re.compile(r"^local function (\w+)\(", re.M)


# --- the header check ---------------------------------------------------------------------


def _code(body: str) -> str:
    """``body`` without its Lua comments (a comment naming ``KEYS[3]`` is not a use)."""
    return re.sub(r"--[^\n]*", "", re.sub(r"--\[\[.*?\]\]", "", body, flags=re.S))


def _used(code: str, kind: str) -> set[int]:
    return {int(n) for n in re.findall(rf"\b{kind}\[\s*(\d+)\s*\]", code)}


def _by_variable(code: str, kind: str) -> bool:
    """True when ``code`` indexes ``kind`` by a variable (``KEYS[i]``, ``ipairs(KEYS)``)."""
    return (
        re.search(rf"\b{kind}\[\s*[A-Za-z_]|\bi?pairs\(\s*{kind}\s*\)|#{kind}\b(?!\s*\[)", code)
        is not None
    )


def _named(header_text: str, kind: str) -> tuple[set[int], list[str]]:
    """The numeric indexes and the ranges (``"1..n"``) the header's ``kind`` lines name."""
    entries = [i for k, i in _ENTRY.findall(header_text) if k == kind]
    return {int(i) for i in entries if i.isdigit()}, [i for i in entries if _RANGE.match(i)]


def header_problems(header_text: str | None, body: str) -> list[str]:
    """What is wrong with a header (``None``: the file has none) for the Lua ``body`` it heads:
    no description line, or KEYS/ARGV it names that the body does not use, or the other way
    round. Empty when the header is right."""
    if header_text is None or not header_text.strip():
        return ["no header: the file must open with a --[[ ... ]] block"]
    problems = []
    first = header_text.splitlines()[0]
    if not first.strip() or _ENTRY.match(first):
        problems.append("no description line: the header must open with what the script does")
    code = _code(body)
    for kind in ("KEYS", "ARGV"):
        named, ranges = _named(header_text, kind)
        used = _used(code, kind)
        problems += [
            f"the header names {kind}[{n}], which the body does not use"
            for n in sorted(named - used)
        ]
        problems += [
            f"the body uses {kind}[{n}], which the header does not name"
            for n in sorted(used - named)
        ]
        if ranges and not _by_variable(code, kind):
            problems.append(
                f"the header names {kind}[{ranges[0]}], but the body never indexes "
                f"{kind} by a variable"
            )
        if not ranges and _by_variable(code, kind):
            problems.append(
                f"the body indexes {kind} by a variable, but the header names no "
                f"range like {kind}[1..n]"
            )
    return problems


def _header(path: str) -> str:
    return lua.parts(path)[0]  # raises when there is none


def _keys(header_text: str) -> list[str]:
    """The indexes the header's KEYS lines name (``"1"``, or ``"1..n"`` for any number)."""
    return [i for k, i in _ENTRY.findall(header_text) if k == "KEYS"]


def _key_count(name: str) -> int | None:
    """The number of keys in the file name (``lease/release-2.lua``: 2), None when it has none."""
    found = re.search(r"-(\d+)\.lua$", name)
    return int(found.group(1)) if found else None


def _body(path: str) -> str:
    """What the header of ``path`` describes: a script's assembled source, a library file's
    own body."""
    return lua.source(path) if path in SCRIPTS else lua.parts(path)[1]


def _includes_of(path: str) -> list[str]:
    """Every include ``path`` pulls in, its includes' includes as well."""
    found = []
    for name in _INCLUDE.findall(lua.parts(path)[1]):
        found += [f"lib/{name}", *_includes_of(f"lib/{name}")]
    return list(dict.fromkeys(found))


def test_the_header_check_reports_a_missing_header_an_unused_key_and_an_unnamed_argument() -> None:
    header = "Get a key.\n\nKEYS[1]  the key\nKEYS[2]  another key\n\nARGV[1]  a token\n"
    assert header_problems(header, "return KEYS[1] .. KEYS[2] .. ARGV[1]  -- ARGV[3]") == []
    assert header_problems(None, "return KEYS[1]") == [
        "no header: the file must open with a --[[ ... ]] block"
    ]
    assert header_problems(header, "return KEYS[1] .. ARGV[1]") == [
        "the header names KEYS[2], which the body does not use"
    ]
    assert header_problems(header, "return KEYS[1] .. KEYS[2] .. ARGV[1] .. ARGV[3]") == [
        "the body uses ARGV[3], which the header does not name"
    ]


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_opens_with_a_header_saying_what_it_does_its_keys_and_its_reply(
    name: str,
) -> None:
    header = _header(name)
    assert header.splitlines()[0].strip()
    assert _keys(header)
    returns = header[header.index("Returns") :] if "Returns" in header else ""
    assert returns.removeprefix("Returns").strip(" :\n")


@pytest.mark.parametrize("path", LIB)
def test_a_library_file_defines_functions_it_names_or_is_code_whose_keys_it_names(
    path: str,
) -> None:
    header, body = lua.parts(path)
    assert header.splitlines()[0].strip()
    functions = _FUNCTION.findall(body)
    if functions:  # a library of functions: the keys are their arguments
        defines = header[header.index("Defines:") :] if "Defines:" in header else ""
        assert [f for f in functions if not re.search(rf"^  {f}\(", defines, re.M)] == []
        assert _named(header, "KEYS")[0] == _used(_code(body), "KEYS") == set()
        assert _named(header, "ARGV")[0] == _used(_code(body), "ARGV") == set()
    else:  # a fragment of its script's own code
        assert _keys(header)
        assert "Defines:" in header or "Returns" in header


def test_every_script_lives_in_a_folder_the_scripts_page_has_a_section_for() -> None:
    folders = {p.name for p in _FOLDER.iterdir() if p.is_dir()}
    assert {name.split("/")[0] for name in SCRIPTS} == folders - {"lib"}
    assert not [p.name for p in _FOLDER.iterdir() if p.name.endswith(".lua")]
    sections = [s for page in DOCS for s in re.findall(r"^## `(\w+)/`", page.read_text(), re.M)]
    assert sorted(sections) == sorted(folders)


@pytest.mark.parametrize("path", SCRIPTS + LIB)
def test_the_header_names_exactly_the_keys_and_arguments_the_body_uses(path: str) -> None:
    assert header_problems(_header(path), _body(path)) == []


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_key_count_in_the_file_name_is_the_number_of_keys_in_the_header(name: str) -> None:
    keys, key_count = _keys(_header(name)), _key_count(name)
    if any(not i.isdigit() for i in keys):  # KEYS[1..n]: any number of keys
        assert key_count is None
    else:
        assert key_count is not None
        assert sorted(keys, key=int) == [str(i) for i in range(1, key_count + 1)]


@pytest.mark.parametrize(
    ("name", "include"), [(name, inc) for name in SCRIPTS for inc in _includes_of(name)]
)
def test_an_include_uses_only_keys_and_arguments_its_script_names(name: str, include: str) -> None:
    code, header = _code(_body(include)), _header(name)
    for kind in ("KEYS", "ARGV"):
        assert _used(code, kind) <= _named(header, kind)[0]
        assert not _by_variable(code, kind)


# --- each script against a real Redis -----------------------------------------------------

KEY = "lease:{t}"
FENCE = fence_key(KEY)
HOLD = hold_key("lease", "invoice")
WAKE = wake_key(HOLD)
TTL = 5000
COUNTER_TTL = TTL + FENCE_COUNTER_EXTRA_MS
# note_ended.lua writes this lifetime for a counter that had lapsed: the protocol's constant.
LAPSED_COUNTER_TTL = FENCE_COUNTER_EXTRA_MS
HOLDER = holder_json("t.job", "task-1", "host", 42)


def token() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def run(client: redis.Redis, name: str, keys: Sequence[str], argv: Sequence[Any]) -> Any:
    return lua.load(name)(client, keys, argv)


def acquire(client: redis.Redis, tok: str, key: str = KEY, ttl: int = TTL) -> Any:
    return run(
        client,
        "lease/acquire-4.lua",
        [key, fence_key(key), reservation_key(key)],
        [tok, ttl, HOLDER, ttl + FENCE_COUNTER_EXTRA_MS, "task-1", "0"],
    )


def release(client: redis.Redis, tok: str, key: str = KEY) -> Any:
    return run(client, "lease/release-2.lua", [key, fence_key(key)], [tok])


def release_wake(client: redis.Redis, tok: str, lifetime: int = 2000) -> Any:
    return run(client, "lease/release_wake-3.lua", [HOLD, fence_key(HOLD), WAKE], [tok, lifetime])


def micros(client: redis.Redis) -> int:
    seconds, us = client.time()
    return seconds * 1_000_000 + us


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_sent_by_sha_is_the_assembled_source_without_header_or_includes(
    client: redis.Redis, name: str
) -> None:
    script = lua.load(name)
    assert script.source == lua.source(name)
    assert not script.source.startswith("--[[") and "--@include" not in script.source
    assert client.script_load(script.source) == script.sha


def test_acquire_grants_a_free_key_with_its_lifetime_and_a_fencing_token_from_the_clock(
    client: redis.Redis,
) -> None:
    t = token()
    before = micros(client)
    granted, fence, ttl = acquire(client, t)
    after = micros(client)
    assert (granted, ttl) == (1, TTL)
    assert fence.isdigit() and before <= int(fence) <= after
    assert client.get(KEY) == f"{t}:{fence}:{HOLDER}"
    assert TTL - 1000 < client.pttl(KEY) <= TTL
    assert client.get(FENCE) == fence
    assert COUNTER_TTL - 1000 < client.pttl(FENCE) <= COUNTER_TTL


def test_acquire_takes_the_fencing_token_one_past_a_counter_ahead_of_the_clock(
    client: redis.Redis,
) -> None:
    ahead = micros(client) + 10**12
    client.set(FENCE, str(ahead))
    assert acquire(client, token())[1] == str(ahead + 1)
    assert client.get(FENCE) == str(ahead + 1)


def test_acquire_with_the_same_token_again_answers_the_whole_value_and_its_lifetime_left(
    client: redis.Redis,
) -> None:
    t = token()
    fence = acquire(client, t)[1]
    granted, value, pttl = acquire(client, t)
    assert (granted, value) == (1, f"{t}:{fence}:{HOLDER}")
    assert TTL - 1000 < pttl <= TTL
    assert client.get(FENCE) == fence  # no second fencing token issued


def test_acquire_answers_the_holder_value_and_its_lifetime_left_to_another_token(
    client: redis.Redis,
) -> None:
    t = token()
    fence = acquire(client, t, ttl=60_000)[1]
    granted, value, pttl = acquire(client, token())
    assert (granted, value) == (0, f"{t}:{fence}:{HOLDER}")
    assert 59_000 < pttl <= 60_000
    assert client.get(KEY) == value and client.get(FENCE) == fence


def test_acquire_answers_minus_1_as_the_lifetime_of_a_holder_key_without_one(
    client: redis.Redis,
) -> None:
    value = f"{token()}:7:{HOLDER}"
    client.set(KEY, value)
    assert acquire(client, token()) == [0, value, -1]


def test_fencing_tokens_strictly_increase_across_grants_even_after_the_counter_is_deleted(
    client: redis.Redis,
) -> None:
    seen = []
    for _ in range(4):
        t = token()
        seen.append(int(acquire(client, t)[1]))
        assert release(client, t) == 1
    client.delete(FENCE)  # evicted, or the server restarted empty
    seen.append(int(acquire(client, token())[1]))
    assert all(a < b for a, b in itertools.pairwise(seen))


def test_renew_sets_the_holders_lifetime_back_to_the_ttl_and_answers_1(client: redis.Redis) -> None:
    t = token()
    acquire(client, t, ttl=60_000)
    assert run(client, "lease/renew-1.lua", [KEY], [t, 2000]) == 1
    assert 1000 < client.pttl(KEY) <= 2000  # set, not added to the minute left
    assert run(client, "lease/renew-1.lua", [KEY], [t, 30_000]) == 1
    assert 29_000 < client.pttl(KEY) <= 30_000


def test_renew_answers_0_for_an_absent_key_and_does_not_create_it(client: redis.Redis) -> None:
    assert run(client, "lease/renew-1.lua", [KEY], [token(), TTL]) == 0
    assert client.exists(KEY) == 0


def test_renew_answers_minus_1_for_a_key_held_by_another_token_and_leaves_its_lifetime(
    client: redis.Redis,
) -> None:
    acquire(client, token(), ttl=2000)
    value = client.get(KEY)
    assert run(client, "lease/renew-1.lua", [KEY], [token(), 60_000]) == -1
    assert client.pttl(KEY) <= 2000 and client.get(KEY) == value


def test_renew_many_answers_one_character_per_key_in_the_order_of_keys(client: redis.Redis) -> None:
    mine, theirs = token(), token()
    acquire(client, mine, key="lease:{a}", ttl=2000)
    acquire(client, theirs, key="lease:{c}", ttl=2000)
    keys = ["lease:{a}", "lease:{b}", "lease:{c}"]
    assert (
        run(client, "lease/renew_many.lua", keys, [60_000, f"{mine}:", f"{mine}:", f"{mine}:"])
        == "102"
    )
    assert 59_000 < client.pttl("lease:{a}") <= 60_000
    assert client.exists("lease:{b}") == 0
    assert client.pttl("lease:{c}") <= 2000
    reordered = ["lease:{b}", "lease:{c}", "lease:{a}"]
    assert (
        run(client, "lease/renew_many.lua", reordered, [60_000, f"{mine}:", f"{mine}:", f"{mine}:"])
        == "021"
    )


def test_renew_many_of_no_keys_answers_an_empty_string(client: redis.Redis) -> None:
    assert run(client, "lease/renew_many.lua", [], [TTL]) == ""


def test_release_deletes_the_key_and_notes_the_token_beside_the_counter_keeping_its_lifetime(
    client: redis.Redis,
) -> None:
    t = token()
    fence = acquire(client, t)[1]
    assert release(client, t) == 1
    assert client.exists(KEY) == 0
    assert client.get(FENCE) == f"{fence}:{t}"
    assert COUNTER_TTL - 1000 < client.pttl(FENCE) <= COUNTER_TTL


def test_a_repeated_release_answers_1_and_changes_nothing(client: redis.Redis) -> None:
    t = token()
    acquire(client, t)
    assert release(client, t) == 1
    counter = client.get(FENCE)
    assert release(client, t) == 1
    assert client.get(FENCE) == counter and client.exists(KEY) == 0


def test_release_by_a_token_that_never_held_answers_0_and_leaves_the_holder(
    client: redis.Redis,
) -> None:
    t = token()
    fence = acquire(client, t)[1]
    value = client.get(KEY)
    assert release(client, token()) == 0
    assert client.get(KEY) == value and client.get(FENCE) == fence
    assert release(client, t) == 1
    assert release(client, token()) == 0  # the key is free, the note is another token's


def test_release_after_the_lease_expired_answers_0(client: redis.Redis) -> None:
    t = token()
    fence = acquire(client, t)[1]
    client.delete(KEY)  # as its expiry would
    assert release(client, t) == 0
    assert client.get(FENCE) == fence


def test_a_repeated_release_after_the_next_grant_still_answers_1_for_the_first_token(
    client: redis.Redis,
) -> None:
    first, second = token(), token()
    fence = acquire(client, first)[1]
    assert release(client, first) == 1
    next_fence = acquire(client, second)[1]
    assert int(next_fence) > int(fence)
    assert client.get(FENCE) == f"{next_fence};{first}"
    assert release(client, first) == 1
    assert client.get(KEY) == f"{second}:{next_fence}:{HOLDER}"  # the new holder stays
    assert release(client, second) == 1
    assert client.get(FENCE) == f"{next_fence}:{second}"
    assert release(client, first) == 0  # another release ended since: no longer known


def test_release_of_a_lease_whose_counter_lapsed_notes_the_token_with_an_hours_lifetime(
    client: redis.Redis,
) -> None:
    t = token()
    acquire(client, t)
    client.delete(FENCE)  # lapsed: the lease was renewed for longer than the TTL plus an hour
    assert release(client, t) == 1
    assert client.get(FENCE) == f"0:{t}"
    assert LAPSED_COUNTER_TTL - 1000 < client.pttl(FENCE) <= LAPSED_COUNTER_TTL
    before = micros(client)
    fence = acquire(client, token())[1]
    assert int(fence) >= before  # from the clock, not from the 0
    assert client.get(FENCE) == f"{fence};{t}"


def test_release_wake_releases_and_leaves_exactly_one_wake_element_with_its_lifetime(
    client: redis.Redis,
) -> None:
    t = token()
    fence = acquire(client, t, key=HOLD)[1]
    client.rpush(WAKE, "1", "1", "1")  # stale elements no waiter took
    assert release_wake(client, t, lifetime=1500) == 1
    assert client.exists(HOLD) == 0
    assert client.get(fence_key(HOLD)) == f"{fence}:{t}"
    assert client.lrange(WAKE, 0, -1) == ["1"]
    assert 0 < client.pttl(WAKE) <= 1500


def test_a_repeated_release_wake_answers_1_and_wakes_no_one_again(client: redis.Redis) -> None:
    t, waiter = token(), token()
    acquire(client, t, key=HOLD)
    assert release_wake(client, t) == 1
    assert client.lpop(WAKE) == "1"  # the waiter woke
    granted, fence, _ = acquire(client, waiter, key=HOLD)
    assert granted == 1
    assert release_wake(client, t) == 1
    assert client.exists(WAKE) == 0
    assert client.get(HOLD) == f"{waiter}:{fence}:{HOLDER}"


def test_release_wake_by_another_token_answers_0_and_wakes_no_one(client: redis.Redis) -> None:
    acquire(client, token(), key=HOLD)
    value = client.get(HOLD)
    assert release_wake(client, token()) == 0
    assert client.get(HOLD) == value and client.exists(WAKE) == 0


def test_revoke_deletes_the_lease_and_does_not_note_the_token_beside_the_counter(
    client: redis.Redis,
) -> None:
    t = token()
    fence = acquire(client, t)[1]
    assert run(client, "lease/revoke-1.lua", [KEY], [t]) == 1
    assert client.exists(KEY) == 0
    assert client.get(FENCE) == fence
    assert release(client, t) == 0  # the holder's own release reports the loss


def test_revoke_with_a_token_that_no_longer_holds_answers_0_and_leaves_the_key(
    client: redis.Redis,
) -> None:
    acquire(client, token())
    value = client.get(KEY)
    assert run(client, "lease/revoke-1.lua", [KEY], [token()]) == 0
    assert client.get(KEY) == value
    client.delete(KEY)
    assert run(client, "lease/revoke-1.lua", [KEY], [token()]) == 0


CLAIM = claim_key(KEY)


def claimer(task_id: str) -> str:
    return holder_json("t.job", task_id, "web1", 7)


def claim(
    client: redis.Redis, task_id: str, lifetime: int = 60_000, take_over: bool = False
) -> Any:
    return run(
        client,
        "dedupe/claim-2.lua",
        [CLAIM, KEY],
        [task_id, lifetime, claimer(task_id), "1" if take_over else "0"],
    )


def acquire_claimed(client: redis.Redis, tok: str, task_id: str) -> Any:
    return run(
        client,
        "lease/acquire-4.lua",
        [KEY, FENCE, reservation_key(KEY), CLAIM],
        [
            tok,
            TTL,
            holder_json("t.job", task_id, "host", 42),
            TTL + FENCE_COUNTER_EXTRA_MS,
            task_id,
            "0",
        ],
    )


def test_claim_of_a_free_slot_stamps_the_servers_clock_the_lifetime_and_the_claimer(
    client: redis.Redis,
) -> None:
    before = micros(client)
    assert claim(client, "w1") == [1, "", 0]
    after = micros(client)
    at, lifetime, meta = client.get(CLAIM).split(":", 2)
    assert before <= int(at) <= after and (lifetime, meta) == ("60000", claimer("w1"))
    assert 59_000 < client.pttl(CLAIM) <= 60_000


def test_claim_while_a_copy_waits_answers_its_task_id_and_age_and_writes_nothing(
    client: redis.Redis,
) -> None:
    claim(client, "w1")
    value, pttl = client.get(CLAIM), client.pttl(CLAIM)
    claimed, task_id, age = claim(client, "w2", lifetime=999_000)
    assert (claimed, task_id) == (0, "w1") and 0 <= age < 5000
    assert client.get(CLAIM) == value and client.pttl(CLAIM) <= pttl


def test_claim_by_the_waiting_copys_own_task_id_claims_again_with_the_new_lifetime(
    client: redis.Redis,
) -> None:
    claim(client, "w1", lifetime=1000)
    assert claim(client, "w1", lifetime=90_000) == [1, "", 0]
    assert 89_000 < client.pttl(CLAIM) <= 90_000


def test_claim_taken_over_names_the_new_task_id(client: redis.Redis) -> None:
    claim(client, "w1")
    assert claim(client, "s1", take_over=True) == [1, "", 0]
    assert client.get(CLAIM).endswith(claimer("s1"))


def test_a_claim_naming_the_leases_holder_is_stale_and_claimed_over(client: redis.Redis) -> None:
    claim(client, "w1")
    acquire(client, token())  # HOLDER's task id is task-1, not w1: the claim stands
    assert claim(client, "w2")[:2] == [0, "w1"]
    client.delete(KEY, CLAIM)
    claim(client, "task-1")
    acquire(client, token())  # granted to task-1 by a worker that did not clear its claim
    assert claim(client, "w2") == [1, "", 0]
    assert client.get(CLAIM).endswith(claimer("w2"))


@pytest.mark.parametrize("foreign", ["list", "garbage", "12:34:not json"])
def test_claim_over_a_key_celery_lease_did_not_write_answers_2_and_leaves_it(
    client: redis.Redis, foreign: str
) -> None:
    if foreign == "list":
        client.rpush(CLAIM, "x")
    else:
        client.set(CLAIM, foreign)
    claimed, what, _ = claim(client, "w1")
    assert claimed == 2 and what
    assert client.type(CLAIM) == ("list" if foreign == "list" else "string")
    assert foreign == "list" or client.get(CLAIM) == foreign


def test_unclaim_removes_only_a_claim_naming_the_task_id(client: redis.Redis) -> None:
    claim(client, "w1")
    assert run(client, "dedupe/unclaim-1.lua", [CLAIM], ["w2"]) == 0
    assert client.exists(CLAIM) == 1
    assert run(client, "dedupe/unclaim-1.lua", [CLAIM], ["w1"]) == 1
    assert client.exists(CLAIM) == 0
    assert run(client, "dedupe/unclaim-1.lua", [CLAIM], ["w1"]) == 0


def test_confirm_gives_only_a_claim_naming_the_task_id_its_full_lifetime_and_never_writes_one(
    client: redis.Redis,
) -> None:
    claim(client, "w1", lifetime=5_000)  # provisional
    stamp = client.get(CLAIM).split(":", 2)
    assert run(client, "dedupe/confirm-1.lua", [CLAIM], ["w2", 300_000]) == 0
    assert client.pttl(CLAIM) <= 5_000
    assert run(client, "dedupe/confirm-1.lua", [CLAIM], ["w1", 300_000]) == 1
    assert 295_000 < client.pttl(CLAIM) <= 300_000
    assert client.get(CLAIM).split(":", 2) == [stamp[0], "300000", stamp[2]]  # same claim time
    client.delete(CLAIM)  # cleared by its grant: a late confirmation writes nothing
    assert run(client, "dedupe/confirm-1.lua", [CLAIM], ["w1", 300_000]) == 0
    assert client.exists(CLAIM) == 0


def test_acquire_3_grants_as_acquire_2_and_clears_the_claim_naming_its_task_id(
    client: redis.Redis,
) -> None:
    claim(client, "w1")
    t = token()
    granted, fence, ttl = acquire_claimed(client, t, "w1")
    assert (granted, ttl) == (1, TTL) and client.get(KEY).startswith(f"{t}:{fence}:")
    assert client.get(FENCE) == fence and client.exists(CLAIM) == 0


def test_acquire_3_leaves_a_claim_of_another_task_id_and_a_refused_grant_keeps_its_own(
    client: redis.Redis,
) -> None:
    claim(client, "w2")
    assert acquire_claimed(client, token(), "w1")[0] == 1  # w1 runs, w2 still waits
    assert client.get(CLAIM).endswith(claimer("w2"))
    assert acquire_claimed(client, token(), "w2")[0] == 0  # w1 holds: w2 goes on waiting
    assert client.get(CLAIM).endswith(claimer("w2"))


LAST_RUN = last_run_key(beat_leader_key("lease", "proj"))


def test_record_run_stamps_the_entry_with_the_servers_clock_and_gives_the_record_its_lifetime(
    client: redis.Redis,
) -> None:
    before = micros(client)
    stamp = run(client, "beat/record_run-1.lua", [LAST_RUN], ["report", 60_000])
    after = micros(client)
    seconds, _, fraction = stamp.partition(".")
    assert len(fraction) == 6 and before <= int(seconds + fraction) <= after
    assert client.hgetall(LAST_RUN) == {"report": stamp}
    assert 59_000 < client.pttl(LAST_RUN) <= 60_000


def test_record_run_raises_the_records_lifetime_and_never_lowers_it(client: redis.Redis) -> None:
    run(client, "beat/record_run-1.lua", [LAST_RUN], ["daily", 600_000])
    run(client, "beat/record_run-1.lua", [LAST_RUN], ["often", 5_000])  # a shorter period
    assert 599_000 < client.pttl(LAST_RUN) <= 600_000
    client.pexpire(LAST_RUN, 1_000)
    run(client, "beat/record_run-1.lua", [LAST_RUN], ["often", 5_000])
    assert 4_000 < client.pttl(LAST_RUN) <= 5_000
    assert set(client.hgetall(LAST_RUN)) == {"daily", "often"}


def test_last_runs_answers_the_servers_clock_and_the_record_as_a_flat_list(
    client: redis.Redis,
) -> None:
    stamp = run(client, "beat/record_run-1.lua", [LAST_RUN], ["report", 60_000])
    seconds, us, fields = run(client, "beat/last_runs-1.lua", [LAST_RUN], [])
    now = int(seconds) * 1_000_000 + int(us)
    assert fields == ["report", stamp]
    assert int(stamp.replace(".", "")) <= now <= micros(client)


def test_last_runs_of_an_absent_record_answers_the_clock_and_no_fields(client: redis.Redis) -> None:
    seconds, us, fields = run(client, "beat/last_runs-1.lua", [LAST_RUN], [])
    assert fields == [] and int(seconds) > 0 and 0 <= int(us) < 1_000_000


@pytest.mark.parametrize(
    "line", ["\t--@include held.lua", "--@include held.lua  ", "--@include  held.lua"]
)
def test_an_include_line_the_loader_cannot_read_is_refused_not_dropped(line: str) -> None:
    with pytest.raises(ValueError, match="not an include line"):
        lua._expand(f"local x = 1\n{line}\nreturn x\n", ())


def test_acl_check_answers_the_commands_the_user_may_not_run_and_runs_none(
    client: redis.Redis, redis_url: str
) -> None:
    if int(client.info("server")["redis_version"].split(".")[0]) < 7:
        pytest.skip("redis.acl_check_cmd is Redis 7.0's; the fallback: test_redis_version.py")
    specs = ["GET %k", "SET %k 1", "WAIT 0 0", "GET jobs:{t}", "PING", "BLPOP %k 1"]
    assert run(client, "acl/acl_check-1.lua", [KEY], specs) == []  # the default user: all
    assert client.exists(KEY) == 0  # asked about, not run
    name = f"acl-check-{token()[:8]}"
    client.execute_command(
        "ACL",
        "SETUSER",
        name,
        "reset",
        "on",
        ">pw",
        "~lease:*",
        "-@all",
        "+evalsha",
        "+eval",
        "+get",
        "+blpop",
    )
    try:
        with redis.Redis.from_url(redis_url, username=name, password="pw") as limited:
            assert run(limited, "acl/acl_check-1.lua", [KEY], specs) == [2, 3, 4, 5]
    finally:
        client.execute_command("ACL", "DELUSER", name)


def test_release_wake_answers_the_refusal_of_its_wake_and_still_releases(
    client: redis.Redis, redis_url: str
) -> None:
    name = f"no-rpush-{token()[:8]}"
    client.execute_command(
        "ACL",
        "SETUSER",
        name,
        "reset",
        "on",
        ">pw",
        "~lease:*",
        "-@all",
        "+evalsha",
        "+eval",
        "+get",
        "+set",
        "+del",
        "+pexpire",
    )
    t = token()
    fence = acquire(client, t, key=HOLD)[1]
    try:
        with redis.Redis.from_url(
            redis_url, username=name, password="pw", decode_responses=True
        ) as limited:
            answer = release_wake(limited, t)
    finally:
        client.execute_command("ACL", "DELUSER", name)
    assert "can't run this command" in answer  # the server's own words, not a silent 1
    assert client.exists(HOLD, WAKE) == 0
    assert client.get(fence_key(HOLD)) == f"{fence}:{t}"


def pass_turn(client: redis.Redis, lifetime: int = 2000) -> Any:
    return run(client, "lease/pass_turn-2.lua", [HOLD, WAKE], [lifetime])


def test_pass_turn_on_a_free_key_leaves_exactly_one_wake_element_with_its_lifetime(
    client: redis.Redis,
) -> None:
    client.rpush(WAKE, "1", "1")  # stale elements no waiter took
    assert pass_turn(client, lifetime=1500) == 1
    assert client.lrange(WAKE, 0, -1) == ["1"]
    assert 0 < client.pttl(WAKE) <= 1500


def test_pass_turn_on_a_held_key_answers_0_and_wakes_no_one(client: redis.Redis) -> None:
    acquire(client, token(), key=HOLD)
    value = client.get(HOLD)
    assert pass_turn(client) == 0
    assert client.get(HOLD) == value and client.exists(WAKE) == 0


def test_pass_turn_answers_the_refusal_of_its_wake_and_leaves_no_list(
    client: redis.Redis, redis_url: str
) -> None:
    name = f"no-rpush-{token()[:8]}"
    client.execute_command(
        "ACL",
        "SETUSER",
        name,
        "reset",
        "on",
        ">pw",
        "~lease:*",
        "-@all",
        "+evalsha",
        "+eval",
        "+exists",
        "+del",
        "+pexpire",
    )
    try:
        with redis.Redis.from_url(
            redis_url, username=name, password="pw", decode_responses=True
        ) as limited:
            answer = pass_turn(limited)
    finally:
        client.execute_command("ACL", "DELUSER", name)
    assert "can't run this command" in answer  # the server's own words, not a silent 1
    assert client.exists(WAKE) == 0


def release_cooldown(
    client: redis.Redis,
    tok: str,
    cooldown: int = 60_000,
    key: str = KEY,
    counter_extra: int = FENCE_COUNTER_EXTRA_MS,
) -> Any:
    return run(
        client,
        "cooldown/release_cooldown-2.lua",
        [key, fence_key(key)],
        [tok, cooldown, counter_extra],
    )


def test_release_cooldown_turns_the_lease_into_a_record_living_the_cooldown_on_the_stores_clock(
    client: redis.Redis,
) -> None:
    t = token()
    fence = acquire(client, t)[1]
    before_ms = micros(client) // 1000
    assert release_cooldown(client, t, cooldown=60_000) == 1
    after_ms = micros(client) // 1000
    head, _, meta = client.get(KEY).partition("{")
    assert head == f"{t}:{fence}:"
    until = int(meta.split(",")[0].split(":")[1])
    assert before_ms + 60_000 <= until <= after_ms + 60_000
    assert "{" + meta.partition(",")[2] == HOLDER  # the holder JSON, the until first
    assert 59_000 < client.pttl(KEY) <= 60_000
    assert client.get(FENCE) == f"{fence}:{t}"  # noted as ended: a redelivery is not run


def test_acquire_during_a_cooldown_is_refused_and_the_next_grant_counts_past_it(
    client: redis.Redis,
) -> None:
    t = token()
    fence = int(acquire(client, t)[1])
    client.set(FENCE, str(fence + 10**9), keepttl=True)  # a counter ahead of the clock
    assert release_cooldown(client, t, cooldown=300) == 1
    granted, value, pttl = acquire(client, token())
    assert granted == 0 and value.startswith(f"{t}:") and 0 < pttl <= 300
    deadline = time.monotonic() + 10
    while client.exists(KEY) and time.monotonic() < deadline:
        time.sleep(0.05)
    granted, next_fence, _ = acquire(client, token())
    assert granted == 1 and int(next_fence) == fence + 10**9 + 1


def test_a_repeated_release_cooldown_answers_1_and_does_not_start_the_cooldown_again(
    client: redis.Redis,
) -> None:
    t = token()
    acquire(client, t)
    assert release_cooldown(client, t) == 1
    record = client.get(KEY)
    time.sleep(0.05)
    assert release_cooldown(client, t) == 1
    assert client.get(KEY) == record and client.pttl(KEY) < 60_000 - 40


def test_release_cooldown_by_a_token_that_does_not_hold_answers_0_and_writes_nothing(
    client: redis.Redis,
) -> None:
    holder = token()
    acquire(client, holder)
    value, counter = client.get(KEY), client.get(FENCE)
    assert release_cooldown(client, token()) == 0
    assert client.get(KEY) == value and client.get(FENCE) == counter


def test_release_cooldown_keeps_the_fencing_counter_alive_past_a_long_cooldown(
    client: redis.Redis,
) -> None:
    t = token()
    acquire(client, t)
    assert release_cooldown(client, t, cooldown=2 * COUNTER_TTL) == 1
    assert 2 * COUNTER_TTL < client.pttl(FENCE) <= 2 * COUNTER_TTL + FENCE_COUNTER_EXTRA_MS


def test_release_cooldown_refused_under_maxmemory_releases_without_a_cooldown(
    client: redis.Redis,
) -> None:
    t = token()
    fence = acquire(client, t)[1]
    old = client.config_get("maxmemory")["maxmemory"]
    client.config_set("maxmemory", 1)  # every denyoom command (SET) is refused
    try:
        answer = release_cooldown(client, t)
    finally:
        client.config_set("maxmemory", old)
    assert "OOM" in answer
    assert client.exists(KEY) == 0  # no key left that nothing would end
    assert client.get(FENCE) == f"{fence}:{t}"


def take_over(
    client: redis.Redis,
    tok: str,
    old: str,
    key: str = KEY,
    task_id: str = "task-2",
    claimed: bool = False,
) -> Any:
    keys = [key, fence_key(key), reservation_key(key), *([claim_key(key)] if claimed else [])]
    return run(
        client, "preempt/preempt-4.lua", keys, [tok, TTL, HOLDER, COUNTER_TTL, task_id, "0", old]
    )


def preempted(holder: str, old: str) -> str:
    """The holder JSON a take-over from ``old`` writes: ``holder`` naming the token replaced."""
    return holder[:-1] + f',"preempted":"{old}"}}'


def test_preempt_replaces_the_holders_token_and_issues_a_higher_fencing_token(
    client: redis.Redis,
) -> None:
    old, new = token(), token()
    fence = int(acquire(client, old)[1])
    granted, new_fence, pttl = take_over(client, new, old)
    assert granted == 1 and int(new_fence) > fence and pttl == TTL
    assert client.get(KEY) == f"{new}:{new_fence}:{preempted(HOLDER, old)}"
    assert store.parse_value(client.get(KEY)).task_id == "task-1"  # still a holder of ours
    assert store.was_preempted(client, KEY, old) and not store.was_preempted(client, KEY, new)
    assert TTL - 1000 < client.pttl(KEY) <= TTL
    assert release(client, old) == 0  # the old holder's token no longer holds it
    assert take_over(client, new, old)[:2] == [1, client.get(KEY)]  # a repeat: same grant


def test_preempt_refuses_a_holder_it_did_not_see_and_a_cooldown_record(client: redis.Redis) -> None:
    seen, third = token(), token()
    acquire(client, third)  # the key changed hands since `seen` was read
    value = client.get(KEY)
    refused = take_over(client, token(), seen)
    # The script's PTTL and the later one round to the millisecond each: 1 ms of slack.
    assert refused[:2] == [0, value] and client.pttl(KEY) <= refused[2] + 1 <= TTL + 1
    release_cooldown(client, third)
    record = client.get(KEY)
    assert take_over(client, token(), third)[:2] == [0, record]
    assert client.get(KEY) == record


def test_preempt_of_a_free_key_grants_it_as_acquire_does(client: redis.Redis) -> None:
    new, gone = token(), token()
    granted, fence, _ = take_over(client, new, gone)
    assert granted == 1 and client.get(KEY) == f"{new}:{fence}:{HOLDER}"
    assert not store.was_preempted(client, KEY, gone)  # nothing was taken from it


def test_preempt_clears_the_claim_naming_the_newcomer_in_the_same_script(
    client: redis.Redis,
) -> None:
    old = token()
    acquire(client, old)
    claim(client, "task-2")  # the newcomer's publish claimed the waiting slot
    assert take_over(client, token(), old, task_id="task-2", claimed=True)[0] == 1
    assert client.exists(CLAIM) == 0  # the next publish is queued again
    claim(client, "task-4")  # a copy published after the newcomer: its claim stays
    assert (
        take_over(client, token(), client.get(KEY).split(":")[0], task_id="task-3", claimed=True)[0]
        == 1
    )
    assert client.get(CLAIM).endswith(claimer("task-4"))


def test_preempt_refused_keeps_the_claim_and_a_reserved_free_key(client: redis.Redis) -> None:
    third = token()
    acquire(client, third)
    claim(client, "task-2")
    assert take_over(client, token(), token(), task_id="task-2", claimed=True)[0] == 0
    assert client.get(CLAIM).endswith(claimer("task-2"))  # still waiting: not taken over
    release(client, third)
    client.hset(
        reservation_key(KEY),
        mapping={"id": "queued-1", "due": str(micros(client) // 1000 + 60_000)},
    )
    granted, answer, _ = take_over(client, token(), third, task_id="task-2")
    assert (granted, answer) == (0, "reserved:queued-1") and client.exists(KEY) == 0


def test_preempt_refused_under_maxmemory_leaves_the_holder_and_the_claim(
    client: redis.Redis,
) -> None:
    old = token()
    acquire(client, old)
    claim(client, "task-2")
    value, claimed = client.get(KEY), client.get(CLAIM)
    limit = client.config_get("maxmemory")["maxmemory"]
    client.config_set("maxmemory", 1)  # every denyoom command (SET) is refused
    try:
        with pytest.raises(redis.exceptions.ResponseError, match="maxmemory"):
            take_over(client, token(), old, task_id="task-2", claimed=True)
    finally:
        client.config_set("maxmemory", limit)
    assert (client.get(KEY), client.get(CLAIM)) == (value, claimed)  # nothing half-done


def test_wake_preempter_leaves_exactly_the_preempted_token_with_its_lifetime(
    client: redis.Redis,
) -> None:
    wake = wake_key(KEY)
    client.rpush(wake, "stale")
    t = token()
    assert run(client, "preempt/wake_preempter-1.lua", [wake], [t, 1500]) == 1
    assert client.lrange(wake, 0, -1) == [t]
    assert 0 < client.pttl(wake) <= 1500


# --- the slots of a limited key (lease_limit=N) ---------------------------------------------


def take_slot(
    client: redis.Redis,
    tok: str,
    limit: int = 3,
    ttl: int = TTL,
    task_id: str = "",
    claimed: bool = False,
) -> Any:
    same = f',"id":"{task_id}",' if task_id else ""
    return run(
        client,
        "slots/acquire_slot-3.lua",
        [KEY, FENCE, *([CLAIM] if claimed else [])],
        [tok, ttl, HOLDER, ttl + FENCE_COUNTER_EXTRA_MS, limit, same, task_id],
    )


def release_slot(client: redis.Redis, tok: str, wake: bool = False) -> Any:
    if wake:
        return run(client, "slots/release_slot-3.lua", [KEY, FENCE, wake_key(KEY)], [tok, 1500])
    return run(client, "slots/release_slot-3.lua", [KEY, FENCE], [tok])


def slot_deadline(client: redis.Redis, tok: str) -> int:
    return int(client.hget(KEY, tok).split(":", 1)[0])


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def test_acquire_slot_grants_n_slots_each_with_its_own_deadline_and_refuses_the_next(
    client: redis.Redis,
) -> None:
    toks = [token() for _ in range(4)]
    before = server_ms(client)
    fences = [take_slot(client, t) for t in toks[:3]]
    assert [f[0] for f in fences] == [1, 1, 1] and [f[2] for f in fences] == [TTL] * 3
    assert [int(f[1]) for f in fences] == sorted({int(f[1]) for f in fences})  # increasing
    for t, (_, fence, _) in zip(toks, fences, strict=False):
        due, rest = client.hget(KEY, t).split(":", 1)
        assert before + TTL <= int(due) <= server_ms(client) + TTL
        assert rest == f"{fence}:{HOLDER}"
    assert client.hget(KEY, "n") == "3" and 0 < client.pttl(KEY) <= TTL
    granted, value, pttl = take_slot(client, toks[3])
    first = value.split(":", 1)[0]  # the holder whose slot ends first
    assert granted == 0 and first in toks[:3] and 0 < pttl <= TTL
    assert slot_deadline(client, first) == min(slot_deadline(client, t) for t in toks[:3])
    assert value == f"{first}:{fences[toks.index(first)][1]}:{HOLDER}"
    assert client.hlen(KEY) == 4  # the refusal wrote nothing


def pass_slot_turn(client: redis.Redis, limit: int = 3) -> Any:
    return run(client, "slots/pass_turn_slot-2.lua", [KEY, wake_key(KEY)], [1500, limit])


def test_pass_slot_turn_wakes_one_waiter_while_a_slot_is_free_and_none_when_all_are_held(
    client: redis.Redis,
) -> None:
    toks = [token() for _ in range(3)]
    for t in toks:
        take_slot(client, t)
    assert pass_slot_turn(client) == 0 and client.exists(wake_key(KEY)) == 0  # all 3 held
    client.hset(KEY, toks[0], f"{server_ms(client) - 1}:1:{HOLDER}")  # past its deadline
    assert pass_slot_turn(client) == 1
    assert client.lrange(wake_key(KEY), 0, -1) == ["1"] and 0 < client.pttl(wake_key(KEY)) <= 1500
    assert client.hexists(KEY, toks[0]) == 0 and client.hlen(KEY) == 3  # n and 2 live slots
    client.delete(KEY)
    assert pass_slot_turn(client) == 1  # a free key has room too
    assert client.llen(wake_key(KEY)) == 1  # one element, however many passes


def test_a_repeated_acquire_slot_is_granted_again_with_the_same_fencing_token(
    client: redis.Redis,
) -> None:
    t = token()
    _, fence, _ = take_slot(client, t)
    granted, value, pttl = take_slot(client, t)
    assert granted == 1 and value == f"{t}:{fence}:{HOLDER}" and 0 < pttl <= TTL
    assert client.hlen(KEY) == 2


def test_an_expired_slot_frees_at_its_own_deadline_and_is_deleted_by_the_next_acquire(
    client: redis.Redis,
) -> None:
    short, long_ = token(), token()
    take_slot(client, short, limit=2, ttl=300)
    take_slot(client, long_, limit=2)
    assert take_slot(client, token(), limit=2)[0] == 0
    time.sleep(0.35)
    late = token()
    assert take_slot(client, late, limit=2)[0] == 1
    assert client.hexists(KEY, short) is False and client.hexists(KEY, long_)
    assert client.hlen(KEY) == 3


def test_a_lower_limit_evicts_no_holder_and_refuses_until_enough_have_ended(
    client: redis.Redis,
) -> None:
    toks = [token() for _ in range(3)]
    for t in toks:
        take_slot(client, t, limit=3)
    assert take_slot(client, token(), limit=2)[0] == 0
    assert all(client.hexists(KEY, t) for t in toks)
    release_slot(client, toks[0])
    assert take_slot(client, token(), limit=2)[0] == 0
    release_slot(client, toks[1])
    assert take_slot(client, token(), limit=2)[0] == 1 and client.hget(KEY, "n") == "2"


def test_acquire_slot_refuses_a_task_id_that_holds_a_live_slot_already(client: redis.Redis) -> None:
    first = token()
    take_slot(client, first, task_id="task-1")
    granted, value, _ = take_slot(client, token(), task_id="task-1")
    assert granted == 0 and value.startswith(f"{first}:")
    assert take_slot(client, token(), task_id="task-2")[0] == 1


def test_acquire_slot_issues_fencing_tokens_above_the_plain_leases_and_the_plain_lease_waits(
    client: redis.Redis,
) -> None:
    plain = token()
    _, plain_fence, _ = acquire(client, plain)
    granted, value, pttl = take_slot(client, token())
    assert granted == 0 and value == client.get(KEY) and 0 < pttl <= TTL
    release(client, plain)
    _, fence, _ = take_slot(client, token())
    assert int(fence) > int(plain_fence)
    granted, value, _ = acquire(client, token())
    assert granted == 0 and value == ""  # a hash of slots holds the key for the plain lease


def test_slot_renewal_moves_only_its_own_deadline_and_refuses_an_ended_slot(
    client: redis.Redis,
) -> None:
    mine, other = token(), token()
    take_slot(client, mine, ttl=1000)
    take_slot(client, other, ttl=1000)
    others = client.hget(KEY, other)
    assert run(client, "slots/renew_slots.lua", [KEY, KEY], [60_000, mine, token()]) == "12"
    assert slot_deadline(client, mine) >= server_ms(client) + 59_000
    assert client.hget(KEY, other) == others and client.pttl(KEY) > 59_000
    assert run(client, "slots/renew_slot-1.lua", [KEY], [other, 60_000]) == 1
    release_slot(client, other)
    assert run(client, "slots/renew_slot-1.lua", [KEY], [other, 60_000]) == -1
    client.set("lease:{t}:plain", f"{token()}:1:{HOLDER}", px=TTL)
    assert (
        run(
            client,
            "slots/renew_slots.lua",
            [KEY, "lease:{t}:plain", "lease:{t}:gone"],
            [TTL, mine, mine, mine],
        )
        == "120"
    )
    assert run(client, "slots/renew_slot-1.lua", ["lease:{t}:gone"], [mine, TTL]) == 0
    # The plain renewal does not renew a slot: a hash is another type for it.
    assert run(client, "lease/renew_many.lua", [KEY], [TTL, f"{mine}:"]) == "2"


def test_renewal_of_a_slot_past_its_deadline_is_refused(client: redis.Redis) -> None:
    mine = token()
    take_slot(client, mine, ttl=300)
    take_slot(client, token(), ttl=5000)  # keeps the hash alive past the first deadline
    time.sleep(0.35)
    assert run(client, "slots/renew_slots.lua", [KEY], [TTL, mine]) == "2"
    assert run(client, "slots/renew_slot-1.lua", [KEY], [mine, TTL]) == -1


def test_release_slot_deletes_only_its_own_slot_and_the_last_one_deletes_the_key(
    client: redis.Redis,
) -> None:
    a, b = token(), token()
    take_slot(client, a)
    take_slot(client, b)
    assert release_slot(client, a) == 1 and client.hexists(KEY, b)
    assert client.get(FENCE).endswith(f":{a}")
    assert release_slot(client, a) == 1  # a repeat whose reply was lost
    assert release_slot(client, token()) == 0
    assert release_slot(client, b, wake=True) == 1
    assert client.exists(KEY) == 0
    assert client.lrange(wake_key(KEY), 0, -1) == ["1"] and 0 < client.pttl(wake_key(KEY)) <= 1500


def test_release_slot_of_a_plain_lease_answers_0_and_leaves_it(client: redis.Redis) -> None:
    t = token()
    acquire(client, t)
    value = client.get(KEY)
    assert release_slot(client, t) == 0 and client.get(KEY) == value


def test_slot_renewals_set_the_deadline_never_add_to_it(client: redis.Redis) -> None:
    mine = token()
    take_slot(client, mine, ttl=TTL)
    for _ in range(5):
        assert run(client, "slots/renew_slots.lua", [KEY], [TTL, mine]) == "1"
        assert run(client, "slots/renew_slot-1.lua", [KEY], [mine, TTL]) == 1
    assert slot_deadline(client, mine) - server_ms(client) <= TTL
    assert client.pttl(KEY) <= TTL


def test_revoke_slot_deletes_only_that_slot_and_notes_no_end(client: redis.Redis) -> None:
    a, b = token(), token()
    take_slot(client, a)
    take_slot(client, b)
    counter = client.get(FENCE)
    assert run(client, "slots/revoke_slot-1.lua", [KEY], [a]) == 1
    assert client.hexists(KEY, a) is False and client.hexists(KEY, b)
    assert client.get(FENCE) == counter  # not noted as ended: a redelivery runs again
    assert run(client, "slots/revoke_slot-1.lua", [KEY], [a]) == 0
    assert run(client, "slots/revoke_slot-1.lua", [KEY], [b]) == 1 and client.exists(KEY) == 0


def test_a_slot_granted_to_a_claimed_message_clears_its_claim_and_a_refusal_keeps_it(
    client: redis.Redis,
) -> None:
    claim(client, "w1")
    take_slot(client, token(), limit=1 + 1, task_id="w0")
    assert take_slot(client, token(), limit=2, task_id="w2", claimed=True)[0] == 1
    assert client.exists(CLAIM) == 1  # it names w1, not w2
    assert take_slot(client, token(), limit=2, task_id="w1", claimed=True)[0] == 0
    assert client.exists(CLAIM) == 1  # refused: the copy goes on waiting
    client.delete(KEY)
    assert take_slot(client, token(), limit=2, task_id="w1", claimed=True)[0] == 1
    assert client.exists(CLAIM) == 0


# --- waiting in a limited key's line (lease_limit=N with queue, retry, coalesce) ------------

LINE_OF_KEY, RESERVED_OF_KEY = f"{KEY}:line", reservation_key(KEY)


def park_slot(
    client: redis.Redis, mode: str, task_id: str, message: str, limit: int = 2, most: int = 10
) -> Any:
    return run(
        client,
        "handoff/park_slot-2.lua",
        [KEY, LINE_OF_KEY],
        [mode, task_id, message, most, 60_000, limit],
    )


def release_slot_handoff(
    client: redis.Redis,
    tok: str,
    limit: int = 2,
    reserve: int = 5000,
    timeout: int = 0,
    ran: str = "",
) -> Any:
    return run(
        client,
        "handoff/release_slot_handoff-4.lua",
        [KEY, FENCE, LINE_OF_KEY, RESERVED_OF_KEY],
        [tok, reserve, 60_000, timeout, ran, limit],
    )


def test_park_slot_parks_only_while_all_n_slots_are_held_and_writes_nothing_otherwise(
    client: redis.Redis,
) -> None:
    first = token()
    take_slot(client, first, limit=2)
    assert park_slot(client, "queue", "q1", "m1") == [0, 0]  # one slot free: take it
    assert client.exists(LINE_OF_KEY) == 0
    take_slot(client, token(), limit=2)
    assert park_slot(client, "queue", "q1", "m1") == [1, "q1", 1]
    assert park_slot(client, "queue", "q2", "m2") == [1, "q2", 2]
    assert park_slot(client, "queue", "q3", "m3", most=2) == [-1, 2]  # lease_queue_max
    assert 0 < client.pttl(LINE_OF_KEY) <= 60_000
    assert park_slot(client, "coalesce", "p1", "x", limit=3) == [0, 0]  # a higher N: free


def test_a_slots_release_reserves_the_freed_slot_for_the_lines_head_which_only_it_takes(
    client: redis.Redis,
) -> None:
    a, b = token(), token()
    take_slot(client, a, limit=2)
    take_slot(client, b, limit=2)
    park_slot(client, "queue", "q1", "m1")
    park_slot(client, "queue", "q2", "m2")
    reply = release_slot_handoff(client, a)
    assert reply[0] == 1 and reply[2] == 1 and reply[3].startswith("q1\n")
    again = release_slot_handoff(client, a)  # its reply was lost: nothing was published
    assert again[2] == 1 and again[3] == reply[3]  # the untaken reservation, answered again
    assert client.hget(KEY, a) is None and client.lrange(LINE_OF_KEY, 0, -1)[0].startswith("q2")
    until, _, due, _ = client.hget(KEY, "r:q1").split(":", 3)
    assert 0 < int(due) - server_ms(client) <= 5000 and int(until) >= int(due) + 50_000
    assert client.pttl(KEY) >= 50_000  # the reservation's lifetime (the line's)
    assert take_slot(client, token(), limit=2, task_id="other")[0] == 0  # reserved: held
    granted = take_slot(client, token(), limit=2, task_id="q1")
    assert granted[0] == 1 and client.hget(KEY, "r:q1") is None  # taken by its grant
    assert release_slot_handoff(client, a) == 1  # a repeat hands nothing over again
    assert client.lrange(LINE_OF_KEY, 0, -1)[0].startswith("q2")


def two_held_and_one_waiting(client: redis.Redis, mode: str, task_id: str) -> str:
    """Both slots of a 2-slot key held, one run parked; the token of the first slot."""
    a = token()
    take_slot(client, a, limit=2)
    take_slot(client, token(), limit=2)
    park_slot(client, mode, task_id, "m1")
    return a


def sweep_look(client: redis.Redis, reserve: int = 5000) -> Any:
    return run(
        client,
        "handoff/release_handoff-4.lua",
        [KEY, FENCE, LINE_OF_KEY, RESERVED_OF_KEY],
        ["", reserve, 60_000, 0, ""],
    )


def test_a_slot_reservation_past_due_stays_reserved_and_the_sweeps_look_publishes_it_again(
    client: redis.Redis,
) -> None:
    a = two_held_and_one_waiting(client, "coalesce", "p1")
    assert release_slot_handoff(client, a, reserve=100)[3].startswith("p1\n")
    wait = sweep_look(client)
    assert wait[0] == 0 and 0 < wait[1] <= 100  # not due yet: look again then
    time.sleep(0.15)  # its publish was lost: the reservation passes its due time
    assert take_slot(client, token(), limit=2, task_id="other")[0] == 0  # still reserved
    again = sweep_look(client, reserve=3000)
    assert again[0] == 2 and 2900 < again[1] <= 3000 and again[2].startswith("p1\n")
    assert sweep_look(client)[0] == 0  # due again one reserve ahead: not published twice
    assert release_slot_handoff(client, a) == 1  # the releaser's repeat: the sweep has it
    granted = take_slot(client, token(), limit=2, task_id="p1")
    assert granted[0] == 1 and sweep_look(client)[0] == 0  # taken: nothing to publish


def test_a_copy_of_a_run_the_sweep_published_again_is_refused_once_one_took_its_slot(
    client: redis.Redis,
) -> None:
    a = two_held_and_one_waiting(client, "queue", "q1")
    release_slot_handoff(client, a, reserve=50)
    time.sleep(0.1)  # past due
    assert sweep_look(client)[0] == 2  # published again: two copies may be on their way
    first = token()
    assert take_slot(client, first, limit=2, task_id="q1")[0] == 1
    assert client.hget(KEY, "r:q1").endswith(":ran")  # a tombstone, counted as no slot
    assert take_slot(client, token(), limit=2, task_id="q1") == [0, "ran:q1", 0]
    release_slot(client, first)
    assert take_slot(client, token(), limit=2, task_id="q1") == [0, "ran:q1", 0]  # ended too
    assert take_slot(client, token(), limit=2, task_id="other")[0] == 1  # b and other: 2
    assert park_slot(client, "queue", "q2", "m2") == [1, "q2", 1]  # all 2 held: it waits


def test_the_sweeps_look_finds_a_slot_hash_free_once_only_tombstones_are_left(
    client: redis.Redis,
) -> None:
    # Every holder died without a release: the tombstone keeps the hash, and holds nothing.
    client.hset(KEY, mapping={"n": "2", "r:q1": f"{server_ms(client) + 60_000}:ran"})
    client.pexpire(KEY, 60_000)
    client.rpush(LINE_OF_KEY, f"q2\n{server_ms(client)}\nm2")  # parked while they held it
    reply = sweep_look(client)
    assert reply[0] == 1 and reply[1].startswith("q2\n")  # the line's head is handed over
    assert take_slot(client, token(), limit=2, task_id="q2")[0] == 1
    assert take_slot(client, token(), limit=2, task_id="q1") == [0, "ran:q1", 0]


def test_a_slot_reservation_never_taken_frees_its_slot_once_its_lifetime_ends(
    client: redis.Redis,
) -> None:
    a = two_held_and_one_waiting(client, "coalesce", "p1")
    run(
        client,
        "handoff/release_slot_handoff-4.lua",
        [KEY, FENCE, LINE_OF_KEY, RESERVED_OF_KEY],
        [a, 50, 150, 0, "", 2],
    )  # due in 50 ms, a lifetime of 150 ms
    time.sleep(0.1)  # past due, within its lifetime
    assert take_slot(client, token(), limit=2, task_id="other")[0] == 0
    time.sleep(0.1)  # past its lifetime: the reservation is no slot any more
    assert sweep_look(client)[0] == 0
    assert take_slot(client, token(), limit=2, task_id="other")[0] == 1


def test_a_slots_release_hands_over_every_free_slot_fails_expired_waiters_and_clears_the_key(
    client: redis.Redis,
) -> None:
    short, a = token(), token()
    take_slot(client, short, limit=3, ttl=100)
    take_slot(client, a, limit=3)
    take_slot(client, token(), limit=3)
    for n in range(4):
        park_slot(client, "queue", f"q{n}", "m", limit=3)
    time.sleep(0.15)  # the short slot's holder died: its slot lapsed without a release
    reply = release_slot_handoff(client, a, limit=3)
    assert reply[2] == 2 and [e.split("\n")[0] for e in reply[3:5]] == ["q0", "q1"]
    client.delete(KEY)
    take_slot(client, a, limit=3)
    reply = release_slot_handoff(client, a, limit=3, timeout=100)  # q2, q3 waited 150 ms
    assert reply[2] == 0 and [e.split("\n")[0] for e in reply[3:]] == ["q2", "q3"]
    assert client.exists(KEY) == 0  # no slot, no reservation left: the hash is gone
    assert release_slot_handoff(client, token(), limit=3) == 0  # no slot of that token


def test_a_handed_over_runs_slot_release_clears_the_sweeps_reservation_of_it(
    client: redis.Redis,
) -> None:
    a = token()
    client.hset(RESERVED_OF_KEY, mapping={"id": "q9", "due": "1", "el": "q9\n1\nm"})
    take_slot(client, a, limit=2, task_id="q9")
    release_slot_handoff(client, a, ran="q9")
    assert client.hget(RESERVED_OF_KEY, "id") is None


# --- debounce (lease_debounce) --------------------------------------------------------------

BURST = KEY + ":burst"
DAY = 86_400_000


def trigger(
    client: redis.Redis,
    task_id: str,
    arguments: str,
    delay: int = 1000,
    cap: int = 5000,
    late: int = 60_000,
) -> Any:
    return run(
        client,
        "debounce/debounce-1.lua",
        [BURST],
        [task_id, delay, cap, arguments, HOLDER, DAY, late],
    )


def test_debounce_starts_a_burst_stamped_with_the_stores_clock_and_a_lifetime_past_its_cap(
    client: redis.Redis,
) -> None:
    before = micros(client) // 1000
    assert trigger(client, "b-1", '{"n": 1}') == [1, "b-1", 1000, 1]
    record = client.hgetall(BURST)
    assert record["id"] == "b-1" and record["msg"] == '{"n": 1}' and record["n"] == "1"
    first = int(record["first"])
    assert before <= first <= micros(client) // 1000
    assert int(record["due"]) == first + 1000 and int(record["until"]) == first + 5000
    assert 5000 + DAY - 1000 < client.pttl(BURST) <= 5000 + DAY


def test_debounce_joining_keeps_the_first_id_and_the_latest_arguments_and_moves_the_due_time(
    client: redis.Redis,
) -> None:
    trigger(client, "b-1", '{"n": 1}')
    first_due = int(client.hget(BURST, "due"))
    time.sleep(0.05)
    started, task_id, due_in, count = trigger(client, "b-2", '{"n": 2}')
    assert (started, task_id, count) == (0, "b-1", 2)
    assert 900 < due_in <= 1000
    assert client.hget(BURST, "msg") == '{"n": 2}'
    assert int(client.hget(BURST, "due")) >= first_due + 40


def test_debounce_never_moves_the_due_time_past_the_first_publish_plus_the_cap(
    client: redis.Redis,
) -> None:
    trigger(client, "b-1", "{}", delay=200, cap=300)
    deadline = int(client.hget(BURST, "until"))
    for _ in range(4):
        time.sleep(0.1)
        trigger(client, "x", "{}", delay=200, cap=300)
        assert int(client.hget(BURST, "due")) <= deadline
    assert int(client.hget(BURST, "due")) == deadline
    assert client.pttl(BURST) <= DAY  # the lifetime counts from the deadline, not the publish


@pytest.mark.parametrize("foreign", ["list", "hash", "string"])
def test_debounce_over_a_key_celery_lease_did_not_write_answers_2_and_leaves_it(
    client: redis.Redis, foreign: str
) -> None:
    {
        "list": lambda: client.rpush(BURST, "x"),
        "hash": lambda: client.hset(BURST, "a", "b"),
        "string": lambda: client.set(BURST, "x"),
    }[foreign]()
    assert trigger(client, "b-1", "{}")[0] == 2
    assert client.type(BURST) == foreign
    assert fire(client, "b-1") == [0, "", 0, 0]
    assert run(client, "debounce/debounce_look-1.lua", [BURST], [1000]) == [0, "", "", 0]


def test_debounce_fire_tells_an_early_timer_the_time_left_and_a_stale_one_nothing(
    client: redis.Redis,
) -> None:
    trigger(client, "b-1", '{"n": 1}', delay=1000)
    code, _, left, _ = fire(client, "b-1")
    assert code == 1 and 900 < left <= 1000
    assert client.hget(BURST, "id") == "b-1"


def test_debounce_a_timer_of_a_burst_the_record_has_no_trace_of_runs_as_published_once(
    client: redis.Redis,
) -> None:
    # Its start was lost with a failover; another burst started on the new primary since.
    trigger(client, "b-1", '{"n": 1}', delay=1000)
    assert fire(client, "lost", timer="t-1") == [3, "", 0, 0]
    assert fire(client, "lost", timer="copy") == [0, "", 0, 0]  # noted: a copy does nothing
    assert fire(client, "lost", again="1", timer="copy") == [0, "", 0, 0]
    assert fire(client, "lost", again="1", timer="t-1") == [3, "", 0, 0]  # itself, reply lost
    assert client.hget(BURST, "id") == "b-1" and client.hget(BURST, "ran") == "lost/t-1"
    # The bursts that ran are remembered past later bursts: a late copy of one does nothing.
    client.hset(BURST, "due", 0)  # b-1 is due
    assert fire(client, "b-1")[0] == 2
    assert trigger(client, "b-2", "{}")[:2] == [1, "b-2"]
    assert client.hget(BURST, "ran") == "b-1/ lost/t-1"  # b-1 was fired by timer ""
    assert fire(client, "b-1", timer="late") == [0, "", 0, 0]
    assert fire(client, "lost") == [0, "", 0, 0]
    # A tombstone a message published at once left (it found no record, its reply lost),
    # replaced by a newer burst and that one by another: the message again still runs.
    client.delete(BURST)
    assert fire(client, "now-1", now="1", timer="t-n") == [3, "", 0, 0]
    trigger(client, "b-5", "{}")
    client.hset(BURST, "due", 0)
    assert fire(client, "b-5")[0] == 2
    trigger(client, "b-6", "{}")
    assert client.hget(BURST, "ran") == "b-5/ now-1/t-n"
    assert fire(client, "now-1", now="1", again="1", timer="t-n") == [3, "", 0, 0]
    assert fire(client, "now-1", now="1", timer="t-n") == [0, "", 0, 0]  # not again


def fire(
    client: redis.Redis,
    task_id: str,
    now: str = "0",
    tombstone: int = 5000,
    again: str = "0",
    timer: str = "",
) -> Any:
    return run(
        client, "debounce/debounce_fire-1.lua", [BURST], [task_id, now, tombstone, again, timer]
    )


def test_debounce_fire_at_the_due_time_leaves_a_tombstone_so_a_second_timer_does_nothing(
    client: redis.Redis,
) -> None:
    trigger(client, "b-1", '{"n": 1}', delay=50)
    trigger(client, "b-2", '{"n": 2}', delay=50)
    time.sleep(0.08)
    code, arguments, count, waited = fire(client, "b-1")
    assert (code, arguments, count) == (2, '{"n": 2}', 2) and waited >= 50
    assert client.hget(BURST, "fired") == "1"
    assert 4000 < client.pttl(BURST) <= 5000
    assert fire(client, "b-1") == [0, "", 0, 0]
    assert run(client, "debounce/debounce_look-1.lua", [BURST], [0]) == [0, "", "", 0]
    # The same timer again (redelivered, or retried after a lost reply): the same run.
    assert fire(client, "b-1", again="1")[:3] == [2, '{"n": 2}', 2]
    assert trigger(client, "b-3", "{}")[:2] == [1, "b-3"]  # the next publish: a new burst
    assert "fired" not in client.hgetall(BURST)


def test_debounce_fire_of_a_timer_whose_record_the_store_lost_runs_it_as_published(
    client: redis.Redis,
) -> None:
    assert fire(client, "b-1", timer="t-1") == [3, "", 0, 0]
    assert client.hgetall(BURST) == {"id": "b-1", "fired": "1", "timer": "t-1"}
    assert fire(client, "b-1", timer="t-2") == [0, "", 0, 0]  # a second copy: nothing
    assert fire(client, "b-1", again="1", timer="t-2") == [0, "", 0, 0]
    # The timer itself again (its reply lost, so it never ran): as published, once more.
    assert fire(client, "b-1", again="1", timer="t-1") == [3, "", 0, 0]


def test_debounce_look_answers_a_burst_late_past_its_grace_and_writes_nothing(
    client: redis.Redis,
) -> None:
    assert run(client, "debounce/debounce_look-1.lua", [BURST], [100]) == [0, "", "", 0]
    trigger(client, "b-1", '{"n": 1}', delay=50)
    code, _, _, again = run(client, "debounce/debounce_look-1.lua", [BURST], [100])
    assert code == 1 and 100 < again <= 150
    time.sleep(0.17)
    assert run(client, "debounce/debounce_look-1.lua", [BURST], [100]) == [
        2,
        "b-1",
        '{"n": 1}',
        100,
    ]
    assert client.hget(BURST, "id") == "b-1"


def test_watch_keeping_an_earlier_note_never_puts_the_look_off(client: redis.Redis) -> None:
    index = "lease:{celery-lease:handoff}:index"
    soon = run(client, "handoff/watch-1.lua", [index], [KEY, 1000, DAY])
    assert run(client, "handoff/watch-1.lua", [index], [KEY, 60_000, DAY, "1"]) == soon
    assert int(client.zscore(index, KEY)) == soon
    later = run(client, "handoff/watch-1.lua", [index], [KEY, 60_000, DAY])
    assert run(client, "handoff/watch-1.lua", [index], [KEY, 500, DAY, "1"]) < later


def test_debounce_joining_a_burst_whose_timer_is_late_says_so_to_publish_it_again(
    client: redis.Redis,
) -> None:
    trigger(client, "b-1", '{"n": 1}', delay=20)
    time.sleep(0.08)
    assert trigger(client, "b-2", '{"n": 2}', delay=20, late=50) == [3, "b-1", 0, 2]
    assert client.hget(BURST, "msg") == '{"n": 2}'  # joined all the same


def test_debounce_fire_now_fires_its_own_burst_before_its_due_time(client: redis.Redis) -> None:
    trigger(client, "b-1", '{"n": 1}', delay=60_000)
    trigger(client, "b-2", '{"n": 2}', delay=60_000)
    assert fire(client, "b-1", now="1")[:3] == [2, '{"n": 2}', 2]
    assert client.hget(BURST, "fired") == "1"
    assert fire(client, "other", now="1") == [3, "", 0, 0]  # its trigger joined another


def test_debounce_fire_now_without_its_trigger_leaves_a_tombstone_its_late_trigger_respects(
    client: redis.Redis,
) -> None:
    assert fire(client, "b-1", now="1") == [3, "", 0, 0]
    assert client.hgetall(BURST) == {"id": "b-1", "fired": "1", "timer": ""}
    assert 4000 < client.pttl(BURST) <= 5000
    assert trigger(client, "b-1", "{}") == [2, "fired", 0, 0]  # its trigger, landing late
    assert client.hgetall(BURST) == {"id": "b-1", "fired": "1", "timer": ""}
    assert run(client, "debounce/debounce_look-1.lua", [BURST], [0]) == [0, "", "", 0]
    assert trigger(client, "b-2", '{"n": 2}')[:2] == [1, "b-2"]  # another publish: a burst
    assert "fired" not in client.hgetall(BURST)
    assert fire(client, "b-3", now="1") == [3, "", 0, 0]  # run as published
    assert client.hget(BURST, "id") == "b-2"  # another burst's record is left alone


def test_debounce_a_burst_over_a_fired_one_keeps_it_for_its_timer_whose_fire_reply_was_lost(
    client: redis.Redis,
) -> None:
    trigger(client, "b-1", '{"n": 1}', delay=10)
    time.sleep(0.03)
    assert fire(client, "b-1")[0] == 2  # its reply lost: the timer is retried, "again"
    assert trigger(client, "b-2", '{"n": 2}')[:2] == [1, "b-2"]
    assert fire(client, "b-1", again="1")[:3] == [2, '{"n": 1}', 1]
    assert fire(client, "b-1") == [0, "", 0, 0]  # not again: a second timer, nothing
    assert client.hget(BURST, "id") == "b-2"


def test_debounce_fire_again_from_the_tombstone_is_only_for_the_timer_that_fired_not_its_copy(
    client: redis.Redis,
) -> None:
    trigger(client, "b-1", '{"n": 1}', delay=10)
    time.sleep(0.03)
    # The sweep published the late timer again (timer t-2): the copy fires first, and runs.
    assert fire(client, "b-1", timer="t-2")[:3] == [2, '{"n": 1}', 1]
    assert client.hget(BURST, "timer") == "t-2"
    # The original (t-1), retried after a store error or redelivered: a second timer.
    assert fire(client, "b-1", again="1", timer="t-1") == [0, "", 0, 0]
    assert fire(client, "b-1", again="1", timer="t-2")[:3] == [2, '{"n": 1}', 1]  # itself
    assert trigger(client, "b-2", '{"n": 2}')[:2] == [1, "b-2"]  # a burst over the fired one
    assert client.hget(BURST, "prev_timer") == "t-2"
    assert fire(client, "b-1", again="1", timer="t-1") == [0, "", 0, 0]
    assert fire(client, "b-1", again="1", timer="t-2")[:3] == [2, '{"n": 1}', 1]
    assert client.hget(BURST, "id") == "b-2"


def test_debounce_a_message_published_at_once_whose_burst_ran_and_was_replaced_does_nothing(
    client: redis.Redis,
) -> None:
    # Its trigger landed (the reply lost), a timer the joins published again fired the burst,
    # and a newer burst replaced the tombstone: the message itself, retried, must not run too.
    trigger(client, "b-1", '{"n": 1}', delay=10)
    trigger(client, "b-2", '{"n": 2}', delay=10)
    time.sleep(0.03)
    assert fire(client, "b-1", timer="t-copy")[:3] == [2, '{"n": 2}', 2]
    assert trigger(client, "b-3", '{"n": 3}')[:2] == [1, "b-3"]
    assert fire(client, "b-1", now="1", timer="t-now") == [0, "", 0, 0]
    assert fire(client, "b-1", now="1", again="1", timer="t-now") == [0, "", 0, 0]
    assert fire(client, "b-4", now="1", timer="t-4") == [3, "", 0, 0]  # no trigger of its own
    assert client.hget(BURST, "id") == "b-3"


def test_debounce_a_message_run_as_published_then_replaced_runs_again_only_as_itself(
    client: redis.Redis,
) -> None:
    assert fire(client, "b-1", now="1", timer="t-1") == [3, "", 0, 0]  # its reply lost
    assert trigger(client, "b-2", '{"n": 2}')[:2] == [1, "b-2"]
    assert client.hget(BURST, "prev_id") == "b-1" and client.hget(BURST, "prev_msg") is None
    assert fire(client, "b-1", now="1", again="1", timer="t-1") == [3, "", 0, 0]
    assert fire(client, "b-1", now="1", again="1", timer="t-9") == [0, "", 0, 0]
    assert fire(client, "b-1", now="1", timer="t-9") == [0, "", 0, 0]


# --- a coalesce duplicate joins the run handed the key, until that run starts ----------------


def _hand_over(client: redis.Redis, policy: str, message: str) -> str:
    """Hold KEY, park one duplicate (``policy``), release handing the key to it; its id."""
    line, reserved = f"{KEY}:line", reservation_key(KEY)
    holder = token()
    assert acquire(client, holder)[0] == 1
    assert run(
        client, "handoff/park-3.lua", [KEY, line, reserved], [policy, "run-b", message, 10, 60_000]
    )[:2] == [1, "run-b"]
    handed = run(
        client,
        "handoff/release_handoff-4.lua",
        [KEY, FENCE, line, reserved],
        [holder, 5000, 60_000, 0, "", policy],
    )
    assert handed[0] == 1 and handed[1].startswith("run-b\n")
    assert client.hget(reserved, "kind") == policy
    return "run-b"


def _take(client: redis.Redis, task_id: str) -> Any:
    return run(
        client,
        "lease/acquire-4.lua",
        [KEY, FENCE, reservation_key(KEY)],
        [token(), TTL, HOLDER, COUNTER_TTL, task_id, "1"],
    )


def test_a_coalesce_duplicate_joins_the_reserved_run_and_its_grant_answers_the_latest_message(
    client: redis.Redis,
) -> None:
    line, reserved = f"{KEY}:line", reservation_key(KEY)
    pending = _hand_over(client, "coalesce", '{"args": [1]}')
    for n in (2, 3):  # after the hand-over, before the run starts: each joins it
        assert run(
            client,
            "handoff/park-3.lua",
            [KEY, line, reserved],
            ["coalesce", f"fresh-{n}", f'{{"args": [{n}]}}', 10, 60_000],
        ) == [1, pending, 1]
    assert client.exists(line) == 0  # no second pending run
    assert client.hget(reserved, "el").endswith('\n{"args": [3]}')
    assert 0 < client.pttl(reserved) <= 60_000
    assert _take(client, "intruder")[1] == f"reserved:{pending}"  # still reserved
    granted = _take(client, pending)
    assert granted[0] == 1 and granted[2] == TTL and granted[3] == '{"args": [3]}'
    assert client.hmget(reserved, "id", "el", "kind", "new") == [None] * 4
    client.delete(KEY)  # once it started, a duplicate opens a new pending run, as before
    assert acquire(client, token())[0] == 1
    assert run(
        client, "handoff/park-3.lua", [KEY, line, reserved], ["coalesce", "run-c", "mc", 10, 60_000]
    ) == [1, "run-c", 1]


def test_a_reserved_run_nobody_joined_is_granted_with_no_message_as_an_ordinary_grant(
    client: redis.Redis,
) -> None:
    pending = _hand_over(client, "coalesce", "mb")
    assert len(_take(client, pending)) == 3


def test_a_queue_reservation_is_never_joined_by_a_coalesce_duplicate(client: redis.Redis) -> None:
    line, reserved = f"{KEY}:line", reservation_key(KEY)
    _hand_over(client, "queue", "mb")
    assert run(
        client, "handoff/park-3.lua", [KEY, line, reserved], ["coalesce", "run-c", "mc", 10, 60_000]
    ) == [1, "run-c", 1]
    assert client.hget(reserved, "el").endswith("\nmb") and client.hget(reserved, "new") == "0"
    assert len(_take(client, "run-b")) == 3


def test_a_joined_reservation_handed_over_again_keeps_the_latest_message_and_a_new_one_is_fresh(
    client: redis.Redis,
) -> None:
    line, reserved = f"{KEY}:line", reservation_key(KEY)
    _hand_over(client, "coalesce", "mb")
    run(
        client, "handoff/park-3.lua", [KEY, line, reserved], ["coalesce", "x", "latest", 10, 60_000]
    )
    client.hset(reserved, "due", "1")  # its publish was lost: the sweep hands it over again
    again = run(
        client,
        "handoff/release_handoff-4.lua",
        [KEY, FENCE, line, reserved],
        ["", 5000, 60_000, 0, "", "coalesce"],
    )
    assert again[0] == 1 and again[1].startswith("run-b\n") and again[1].endswith("\nlatest")
    client.hdel(reserved, "id")  # (it started: its grant ended the reservation)
    holder = token()
    assert acquire(client, holder)[0] == 1
    run(
        client, "handoff/park-3.lua", [KEY, line, reserved], ["coalesce", "run-d", "md", 10, 60_000]
    )
    run(
        client,
        "handoff/release_handoff-4.lua",
        [KEY, FENCE, line, reserved],
        [holder, 5000, 60_000, 0, "", "coalesce"],
    )
    assert client.hget(reserved, "new") == "0"  # a fresh hand-over: nobody joined it yet
    assert len(_take(client, "run-d")) == 3


@pytest.mark.parametrize("taker", ["acquire", "take over"])
def test_the_reserved_run_taking_the_key_ends_its_reservation_and_keeps_the_runs_that_ran(
    client: redis.Redis, taker: str
) -> None:
    # lib/reservation.lua's take_reservation, for the acquire and the take-over alike: the
    # fields a hand-over writes for one run go, the ran list of runs that released stays.
    reserved = reservation_key(KEY)
    pending = _hand_over(client, "coalesce", "mb")
    run(
        client,
        "handoff/park-3.lua",
        [KEY, f"{KEY}:line", reserved],
        ["coalesce", "x", "m2", 10, 60_000],
    )
    client.hset(reserved, "ran", "run-a")
    assert client.hget(reserved, "new") == "1"
    if taker == "acquire":
        assert _take(client, pending)[0] == 1
    else:
        assert take_over(client, token(), token(), task_id=pending)[0] == 1
    assert client.hgetall(reserved) == {"ran": "run-a"}
