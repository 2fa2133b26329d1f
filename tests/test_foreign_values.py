"""What celery-lease reads back from Redis, when another tool (or a hand) wrote it: every
parser answers, never raises (fuzzed with seeded random bytes and near-misses of the real
formats), and a foreign value or a key of another type at a lease key is a conflict held by an
unknown holder, for the store functions, a real worker's task, ``celery lease ls``,
``release`` and ``doctor``."""

from __future__ import annotations

import json
import random
import time
import uuid
from typing import Any

import pytest
import redis

from celery_lease import store
from celery_lease.base.keys import fence_key, hold_key, wake_key
from celery_lease.store import records
from celery_lease.store.value import MAX_FENCE, OtherType
from tests.support.fixtures import WorkerFactory
from tests.test_cli import APP, _app, _env, celery_lease
from tests.test_foreign_scripts import OTHER_TYPES, near_misses

HOLDER = store.holder_json("t.job", "task-1", "host", 42)
# The value of the field report: a holder JSON whose pid is not an int.
REPORTED = b'sometoken:123:{"pid": "not-a-pid"}'


def token() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return store.client_for(redis_url, 1.0)


def structured(rng: random.Random) -> list[Any]:
    """Lease values one change away from a real one, in every part, plus random ones."""
    good = token()
    fields: list[dict[str, Any]] = [
        {"pid": "not-a-pid"},
        {"pid": 1.5},
        {"pid": True},
        {"pid": -1},
        {"pid": 2**70},
        {"pid": None},
        {"task": 7},
        {"id": ["x"]},
        {"host": {"a": 1}},
        {"v": 0},
        {"v": "1"},
        {"v": True},
        {"v": 1.0},
    ]
    values: list[Any] = [REPORTED, b"", b":", b"::", "\u0663:1:{}", b"\xff\xfe:1:{}"]
    values += [
        f"{good}:12:".encode() + json.dumps({**json.loads(HOLDER), **f}).encode() for f in fields
    ]
    values += [
        f"{good}:{fence}:{HOLDER}".encode()
        for fence in ("", "-1", "1.0", "\u0663", "1" * 17, str(MAX_FENCE + 1), "1e3")
    ]
    values += [
        f"{good}:12:{tail}".encode()
        for tail in (
            "[" * 100_000,
            "[" * 2000 + "]" * 2000,
            '{"a":' * 3000 + "1" + "}" * 3000,
            '{"pid": 1' + "0" * 5000 + "}",
            '{"pid": 1' + "0" * 4000 + "}",
            '{"pid": 1e999}',
            '{"pid": NaN}',
            "null",
            "[]",
            '"text"',
            "{" + "x" * 70_000,
        )
    ]
    values += [bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 120))) for _ in range(2000)]
    values += [OtherType(kind) for kind in OTHER_TYPES]
    values += [None, 42, 1.5, ["a"]]
    return values


def test_parse_value_answers_every_random_or_near_miss_value_with_an_unknown_holder() -> None:
    rng = random.Random(20261201)
    for value in [*structured(rng), *near_misses(rng)]:
        holder = store.parse_value(value)
        assert holder.foreign, value
        assert (holder.token, holder.fencing_token, holder.task_id, holder.pid) == ("", 0, "", 0)
        assert holder.where == "unknown holder"


def test_parse_value_reads_what_celery_lease_writes_with_or_without_its_version() -> None:
    t = token()
    for stored in (
        f"{t}:12:{HOLDER}",
        f'{t}:12:{{"task":"t.job","id":"task-1","host":"host","pid":42}}',
        f'{t}:12:{{"v":1,"task":"t.job","id":"task-1","host":"host","pid":42}}',
    ):
        holder = store.parse_value(stored.encode())
        assert (
            holder.token,
            holder.fencing_token,
            holder.task_id,
            holder.where,
            holder.version,
            holder.foreign,
        ) == (t, 12, "task-1", "host:42", 1, "")
    long_name = "tâche\u2028" * 1000  # 6 000 characters, 11 000 once escaped
    written = f"{t}:12:{store.holder_json(long_name, 'id', 'host', 1)}"
    assert store.parse_value(written).task_name == long_name


def test_a_value_of_a_later_format_version_is_held_by_a_known_holder_with_the_shared_fields() -> (
    None
):
    t = token()
    later = f'{t}:12:{{"v":2,"task":"t.job","id":"task-1","host":"host","pid":42,"new":[1]}}'
    holder = store.parse_value(later)
    assert (holder.version, holder.foreign, holder.token, holder.task_id) == (2, "", t, "task-1")


def test_parse_counter_answers_every_random_value_and_reads_only_leading_digits() -> None:
    rng = random.Random(3)
    for _ in range(3000):
        value = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 30)))
        if rng.random() < 0.5:
            value = str(rng.randrange(10 ** rng.randrange(1, 20))).encode() + value
        digits = value[: len(value) - len(value.lstrip(b"0123456789"))]
        expected = int(digits) if digits and int(digits) < MAX_FENCE else None
        assert store.parse_counter(value) == expected, value
    for other in (None, OtherType("hash"), 12, "\u0663"):
        assert store.parse_counter(other) is None


@pytest.mark.parametrize("value", [REPORTED, b"\xff" * 40, f"{'a' * 32}:1:[[[".encode()])
def test_acquire_on_a_foreign_value_is_a_conflict_held_by_an_unknown_holder_for_a_ttl(
    client: redis.Redis, value: bytes
) -> None:
    client.set("lease:{a}", value)  # no lifetime: held, as far as anyone knows, for a TTL more
    t = token()
    got = store.acquire(client, "lease:{a}", t, 1500, HOLDER)
    assert not got.granted and got.holder.foreign and got.remaining == 1.5
    assert not store.release(client, "lease:{a}", t)
    assert store.renew_many(client, [("lease:{a}", t, 1500)]) == [-1]
    assert client.get("lease:{a}") == value and client.ttl("lease:{a}") == -1


@pytest.mark.parametrize("kind", sorted(OTHER_TYPES))
def test_acquire_on_a_key_of_another_type_is_a_conflict_and_reads_show_its_type(
    client: redis.Redis, kind: str
) -> None:
    OTHER_TYPES[kind](client, "lease:{a}")
    client.pexpire("lease:{a}", 4000)
    got = store.acquire(client, "lease:{a}", token(), 1500, HOLDER)
    assert not got.granted and got.holder.foreign and 3.0 < got.remaining <= 4.0
    value, pttl = records.read(client, "lease:{a}")
    assert value == OtherType(kind) and 3000 < pttl <= 4000
    assert records.read_many(client, ["lease:{a}", "lease:{b}"])[0][0] == OtherType(kind)
    assert store.parse_value(value).foreign == f"a Redis {kind}, not a lease value"


def test_acquire_on_a_damaged_counter_is_a_conflict_and_leaves_the_counter(
    client: redis.Redis,
) -> None:
    client.hset(fence_key("lease:{a}"), "n", "1")
    got = store.acquire(client, "lease:{a}", token(), 1500, HOLDER)
    assert not got.granted and got.holder.foreign
    assert client.exists("lease:{a}") == 0 and client.type(fence_key("lease:{a}")) == b"hash"


@pytest.mark.parametrize("counter", [b"\xff\xfe", b"12:\xff", "hash"])
def test_released_last_answers_false_for_a_counter_it_did_not_write(
    client: redis.Redis, counter: bytes | str
) -> None:
    if counter == "hash":
        client.hset(fence_key("lease:{a}"), "n", "1")
    else:
        client.set(fence_key("lease:{a}"), counter)
    assert store.released_last(client, "lease:{a}", token()) is False


def test_a_waiting_hold_on_a_wake_key_of_another_type_waits_its_time_and_is_not_woken(
    client: redis.Redis,
) -> None:
    key = hold_key("lease", "invoice")
    client.set(wake_key(key), "theirs")
    started = time.monotonic()
    assert store.wait_for_release(client, key, 0.2) is False
    assert time.monotonic() - started >= 0.2
    assert client.get(wake_key(key)) == b"theirs"


def test_last_runs_leaves_out_what_beat_did_not_write(client: redis.Redis) -> None:
    seconds, _ = client.time()
    client.hset(
        "lease:{b}:last-run",
        mapping={
            "ok": repr(seconds - 12.5),
            "nan": "nan",
            "inf": "inf",
            "text": "soon",
            b"\xff": "1.0",
        },
    )
    ages = records.last_run_ages(client, "lease:{b}:last-run")
    assert list(ages) == ["ok"] and 12.5 <= ages["ok"] < 14.5
    client.delete("lease:{b}:last-run")
    client.set("lease:{b}:last-run", "theirs")
    assert records.last_run_ages(client, "lease:{b}:last-run") == {}


def test_a_task_finding_foreign_values_at_its_key_skips_and_the_cli_shows_an_unknown_holder(
    redis_url: str, worker_factory: WorkerFactory
) -> None:
    from tests.apps import ops_app

    env = _env(redis_url, worker_factory.queue)
    worker_factory(APP, pool="threads", concurrency=2, env=env)
    app = _app(redis_url, worker_factory.queue)
    client = redis.Redis.from_url(redis_url)
    keys = [ops_app.slow.lease_key_for((), {"seconds": 0.1, "tag": tag}) for tag in "ab"]
    client.set(keys[0], REPORTED, px=60_000)
    client.hset(keys[1], "owner", "another tool")
    client.pexpire(keys[1], 60_000)
    for tag in "ab":
        result = app.send_task("ops.slow", (0.1,), {"tag": tag}).get(timeout=20)
        assert result["lease_skipped"] is True and result["holder"] == "unknown holder"
    assert client.get(keys[0]) == REPORTED and client.type(keys[1]) == b"hash"

    listed = celery_lease(env, "ls", "--wide")  # at 80 columns the key keeps its width
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("(unknown holder)") == 2
    assert f"unknown holder at {keys[1]}: a Redis hash, not a lease value" in listed.stdout
    as_json = json.loads(celery_lease(env, "ls", "--json").stdout)
    assert sorted(item["key"] for item in as_json if item["foreign"]) == sorted(keys)

    refused = celery_lease(env, "release", keys[0], "--yes")
    assert refused.returncode == 1 and "celery-lease did not write" in refused.stderr
    assert client.get(keys[0]) == REPORTED

    client.set(fence_key(keys[0]) + "x", "not under a suffix")  # a lease key, foreign value
    client.set(fence_key("lease:{c}"), "not a counter")
    doctor = celery_lease(env, "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "WARN store" in doctor.stdout and "4 key(s) under lease:*" in doctor.stdout
    assert f"{fence_key('lease:{c}')}: not a fencing counter" in doctor.stdout
    assert "lease_key_prefix" in doctor.stdout


def test_the_hand_over_keys_are_celery_leases_own_and_another_shape_there_is_not(
    client: redis.Redis,
) -> None:
    from celery_lease.base.keys import handoff_index_key, line_key, reservation_key
    from celery_lease.ops.inspection import scan_foreign

    key = "lease:{t.job:abc}"
    client.rpush(line_key(key), "{}")
    client.hset(reservation_key(key), "ran", "task-1")
    client.zadd(handoff_index_key("lease"), {key: 1.0})
    assert list(scan_foreign(client, "lease")) == []
    client.delete(line_key(key))
    client.set(line_key(key), "not a line")
    assert [k for k, _ in scan_foreign(client, "lease")] == [line_key(key)]
