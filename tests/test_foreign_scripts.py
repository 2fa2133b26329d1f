"""The scripts on keys celery-lease did not write, on a real Redis: a value of another shape, a
key of another type (``WRONGTYPE``) at a lease key, a fencing counter or a wake list. Each is
held by an unknown holder: no script errors on it, overwrites it, deletes it or gives it a
lifetime. Fuzzed with seeded random bytes and near-misses of the real formats."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest
import redis

from tests.test_scripts import (
    FENCE,
    HOLD,
    KEY,
    TTL,
    WAKE,
    acquire,
    release,
    release_wake,
    run,
    token,
)

# One writer per Redis type, each leaving a key of that type at ``key``.
OTHER_TYPES: dict[str, Callable[[redis.Redis, str], object]] = {
    "hash": lambda c, k: c.hset(k, "task", "theirs"),
    "list": lambda c, k: c.rpush(k, "theirs"),
    "set": lambda c, k: c.sadd(k, "theirs"),
    "zset": lambda c, k: c.zadd(k, {"theirs": 1.0}),
    "stream": lambda c, k: c.xadd(k, {"theirs": "1"}),
}


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)  # bytes: random values stay as written
    yield client
    client.close()


def dump(client: redis.Redis, key: str) -> tuple[bytes | None, int]:
    """What ``key`` holds (its serialised form, of any type) and its lifetime."""
    return client.dump(key), client.pttl(key)


@pytest.mark.parametrize("kind", sorted(OTHER_TYPES))
def test_a_key_of_another_type_at_the_lease_key_is_held_and_no_script_touches_it(
    client: redis.Redis, kind: str
) -> None:
    OTHER_TYPES[kind](client, KEY)
    before = dump(client, KEY)
    t = token()
    assert acquire(client, t) == [0, b"", -1]
    assert run(client, "lease/renew-1.lua", [KEY], [t, TTL]) == -1
    assert run(client, "lease/renew_many.lua", [KEY], [TTL, f"{t}:"]) == b"2"
    assert release(client, t) == 0
    assert run(client, "lease/revoke-1.lua", [KEY], [""]) == 0
    assert dump(client, KEY) == before
    assert client.exists(FENCE) == 0  # nothing was issued for it


@pytest.mark.parametrize(
    "counter",
    [b"abc", b"", b"-5", b":1", b"9007199254740991", b"99999999999999999999999", "\u0663".encode()],
)
def test_acquire_refuses_a_counter_that_is_not_ours_and_leaves_it_as_it_is(
    client: redis.Redis, counter: bytes
) -> None:
    client.set(FENCE, counter, px=50_000)
    granted, value, pttl = acquire(client, token())
    assert (granted, value) == (0, b"") and 49_000 < pttl <= 50_000
    assert client.get(FENCE) == counter and client.exists(KEY) == 0


@pytest.mark.parametrize("kind", sorted(OTHER_TYPES))
def test_acquire_refuses_a_counter_of_another_type(client: redis.Redis, kind: str) -> None:
    OTHER_TYPES[kind](client, FENCE)
    before = dump(client, FENCE)
    assert acquire(client, token()) == [0, b"", -1]
    assert dump(client, FENCE) == before and client.exists(KEY) == 0


@pytest.mark.parametrize(
    "counter",
    [b"1", b"9007199254740989", b"12:" + b"a" * 32, b"12;" + b"a" * 32, b"12#later-format"],
)
def test_acquire_counts_on_from_a_counter_in_any_shape_that_starts_with_its_digits(
    client: redis.Redis, counter: bytes
) -> None:
    client.set(FENCE, counter)
    granted, fence, _ = acquire(client, token())
    digits = int(counter.split(b":")[0].split(b";")[0].split(b"#")[0])
    assert granted == 1 and int(fence) > digits


@pytest.mark.parametrize("kind", sorted(OTHER_TYPES))
def test_a_release_whose_counter_became_another_type_releases_and_leaves_the_counter(
    client: redis.Redis, kind: str
) -> None:
    t = token()
    acquire(client, t)
    client.delete(FENCE)
    OTHER_TYPES[kind](client, FENCE)
    before = dump(client, FENCE)
    assert release(client, t) == 1
    assert client.exists(KEY) == 0 and dump(client, FENCE) == before
    assert release(client, t) == 0  # nothing noted it: a repeat cannot tell, and says lost


def test_a_release_whose_counter_became_a_foreign_string_leaves_it(client: redis.Redis) -> None:
    t = token()
    acquire(client, t)
    client.set(FENCE, b"theirs", px=50_000)
    assert release(client, t) == 1
    assert client.get(FENCE) == b"theirs"


@pytest.mark.parametrize("kind", ["string", *sorted(set(OTHER_TYPES) - {"list"})])
def test_release_wake_leaves_a_wake_key_of_another_type_alone(
    client: redis.Redis, kind: str
) -> None:
    t = token()
    acquire(client, t, key=HOLD)
    if kind == "string":
        client.set(WAKE, b"theirs")
    else:
        OTHER_TYPES[kind](client, WAKE)
    before = dump(client, WAKE)
    reply = release_wake(client, t)  # released; the wake refused, and said so
    assert isinstance(reply, bytes) and reply.startswith(b"WRONGTYPE"), reply
    assert client.exists(HOLD) == 0 and dump(client, WAKE) == before


def near_misses(rng: random.Random) -> Iterator[bytes]:
    """Values close to a lease value: each part of ``<token>:<fence>:<holder JSON>`` broken."""
    good = token()
    holder = b'{"task":"t","id":"i","host":"h","pid":1}'
    yield f"{good}:12:".encode() + holder[:-1]
    yield f"{good.upper()}:12:".encode() + holder
    yield f"{good[:-1]}:12:".encode() + holder
    yield f"{good}:1e3:".encode() + holder
    yield f"{good}:12".encode()
    yield f"{good}::".encode()
    yield b"sometoken:123:" + b'{"pid": "not-a-pid"}'
    yield f"{good}:12:".encode() + b"[" * 5000 + b"]" * 5000
    yield f"{good}:12:".encode() + b'{"pid": 1' + b"0" * 5000 + b"}"
    yield f"{good}:12:".encode() + b'{"pid": 1e999}'
    for _ in range(40):
        yield bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 80)))


def test_no_script_errors_on_or_changes_a_random_or_near_miss_value_at_the_lease_key(
    client: redis.Redis,
) -> None:
    rng = random.Random(20261201)
    for value in near_misses(rng):
        client.set(KEY, value, px=60_000)
        t = token()
        granted, found, _ = acquire(client, t)
        assert (granted, found) == (0, value)
        assert run(client, "lease/renew-1.lua", [KEY], [t, TTL]) == -1
        assert release(client, t) == 0
        assert run(client, "lease/revoke-1.lua", [KEY], [t]) == 0
        assert client.get(KEY) == value, value


def test_acquire_on_a_random_counter_grants_above_its_digits_or_refuses_and_leaves_it(
    client: redis.Redis,
) -> None:
    rng = random.Random(7)
    for _ in range(300):
        counter = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 24)))
        if rng.random() < 0.5:
            counter = str(rng.randrange(10 ** rng.randrange(1, 20))).encode() + counter
        client.delete(KEY)
        client.set(FENCE, counter)
        granted, answer, _ = acquire(client, token())
        digits = counter[: len(counter) - len(counter.lstrip(b"0123456789"))]
        if digits and int(digits) < 2**53 - 1:
            assert granted == 1 and int(answer) > int(digits), counter
        else:
            assert (granted, answer) == (0, b""), counter
            assert client.get(FENCE) == counter and client.exists(KEY) == 0
