"""The lease protocol against a real Redis: acquire, renew, release, fencing, OOM, Cluster."""

from __future__ import annotations

import uuid

import pytest
import redis
from redis.exceptions import ResponseError

from celery_lease import store
from celery_lease.base.keys import fence_key
from celery_lease.store import connection, topology
from tests.support.fixtures import RedisFactory

HOLDER = store.holder_json("t.job", "task-1", "host", 42)


def token() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return store.client_for(redis_url, 1.0)


def test_acquire_sets_value_and_lifetime_in_one_write(client: redis.Redis) -> None:
    t = token()
    got = store.acquire(client, "lease:{a}", t, 1900, HOLDER)
    assert got.granted and got.holder.token == t
    assert 1800 < client.pttl("lease:{a}") <= 1900
    stored = store.parse_value(client.get("lease:{a}") or b"")
    assert stored.task_id == "task-1" and stored.where == "host:42"
    assert stored.fencing_token == got.holder.fencing_token > 0


def test_a_fresh_grant_is_the_result_and_holder_the_dataclasses_build(client: redis.Redis) -> None:
    t = token()
    got = store.acquire(client, "lease:{a}", t, 1900, HOLDER)
    fence = got.holder.fencing_token
    built = store.AcquireResult(True, store.Holder(t, fence), 1.9)
    assert got == built and hash(got.holder) == hash(built.holder)
    assert vars(got) == vars(built) and vars(got.holder) == vars(built.holder)
    assert repr(got) == repr(built)
    with pytest.raises(AttributeError):  # still frozen
        got.holder.token = "x"  # type: ignore[misc]


def test_conflict_returns_holder_and_remaining_lifetime(client: redis.Redis) -> None:
    first = store.acquire(client, "lease:{a}", token(), 5000, HOLDER)
    second = store.acquire(client, "lease:{a}", token(), 5000, store.holder_json("t", "x", "h", 1))
    assert not second.granted
    assert second.holder.token == first.holder.token
    assert second.holder.task_id == "task-1"
    assert 4.0 < second.remaining <= 5.0


def test_repeated_acquire_with_the_same_token_is_ours_not_a_phantom(client: redis.Redis) -> None:
    t = token()
    first = store.acquire(client, "lease:{a}", t, 5000, HOLDER)
    again = store.acquire(client, "lease:{a}", t, 5000, HOLDER)  # reply lost, asked again
    assert again.granted and again.holder.fencing_token == first.holder.fencing_token


def test_fencing_tokens_strictly_increase_across_grants(client: redis.Redis) -> None:
    seen = []
    for _ in range(5):
        t = token()
        seen.append(store.acquire(client, "lease:{f}", t, 5000, HOLDER).holder.fencing_token)
        assert store.release(client, "lease:{f}", t)
    client.delete(fence_key("lease:{f}"))  # counter evicted or lost
    seen.append(store.acquire(client, "lease:{f}", token(), 5000, HOLDER).holder.fencing_token)
    assert seen == sorted(seen) and len(set(seen)) == len(seen)


def test_fencing_counter_has_a_lifetime(client: redis.Redis) -> None:
    store.acquire(client, "lease:{f}", token(), 5000, HOLDER)
    assert client.pttl(fence_key("lease:{f}")) > 3600 * 1000


def test_renewal_sets_never_adds(client: redis.Redis) -> None:
    t = token()
    store.acquire(client, "lease:{r}", t, 1000, HOLDER)
    for _ in range(30):
        assert store.renew_many(client, [("lease:{r}", t, 1000)]) == [1]
    assert 0 < client.pttl("lease:{r}") <= 1000


def test_no_blind_renewal_of_a_successor(client: redis.Redis) -> None:
    a, b = token(), token()
    store.acquire(client, "lease:{s}", a, 1000, HOLDER)
    client.delete("lease:{s}")  # A's lease lapsed
    store.acquire(client, "lease:{s}", b, 800, HOLDER)
    assert store.renew_many(client, [("lease:{s}", a, 60_000)]) == [-1]
    assert client.pttl("lease:{s}") <= 800
    assert store.renew_many(client, [("lease:{gone}", a, 1000)]) == [0]


def test_release_of_the_old_holder_leaves_the_successor(client: redis.Redis) -> None:
    a, b = token(), token()
    store.acquire(client, "lease:{s}", a, 1000, HOLDER)
    client.delete("lease:{s}")
    store.acquire(client, "lease:{s}", b, 5000, HOLDER)
    assert store.release(client, "lease:{s}", a) is False
    assert store.parse_value(client.get("lease:{s}") or b"").token == b
    assert not store.acquire(client, "lease:{s}", token(), 5000, HOLDER).granted
    assert store.release(client, "lease:{s}", b) is True
    assert store.release(client, "lease:{s}", a) is False


def test_release_notes_who_ended_last_and_the_next_grant_clears_it(client: redis.Redis) -> None:
    a, b = token(), token()
    store.acquire(client, "lease:{d}", a, 5000, HOLDER)
    assert not store.released_last(client, "lease:{d}", a)
    fence = store.acquire(client, "lease:{d}", a, 5000, HOLDER).holder.fencing_token
    assert store.release(client, "lease:{d}", a)
    assert store.released_last(client, "lease:{d}", a)
    assert client.pttl(fence_key("lease:{d}")) > 3600 * 1000  # the note kept the lifetime
    after = store.acquire(client, "lease:{d}", b, 5000, HOLDER).holder.fencing_token
    assert after > fence and not store.released_last(client, "lease:{d}", a)


def test_a_repeated_release_answers_true_until_a_later_holder_released(client: redis.Redis) -> None:
    # A release sent again after a broken connection (its first reply may be lost after the
    # script ran) must not report a loss that did not happen, even when a waiter woken by that
    # release was granted the key before the repeat arrived.
    a, b = token(), token()
    store.acquire(client, "lease:{r}", a, 5000, HOLDER)
    assert store.release(client, "lease:{r}", a) is True
    assert store.release(client, "lease:{r}", a) is True
    assert store.release(client, "lease:{r}", b) is False  # never held: not released by it
    store.acquire(client, "lease:{r}", b, 5000, HOLDER)
    assert store.release(client, "lease:{r}", a) is True  # a released it, then b was granted
    assert not store.released_last(client, "lease:{r}", a)  # but a is no longer the last
    assert store.release(client, "lease:{r}", b) is True
    assert store.release(client, "lease:{r}", a) is False  # b ended since: too old to tell
    c = token()
    store.acquire(client, "lease:{r}", c, 5000, HOLDER)
    assert store.release(client, "lease:{r}", a) is False


def test_a_repeated_release_of_a_lost_lease_stays_false(client: redis.Redis) -> None:
    # a's key expired (lost), b was granted: a never released, whatever b does.
    a, b = token(), token()
    store.acquire(client, "lease:{x}", a, 5000, HOLDER)
    client.delete("lease:{x}")  # as an expiry
    store.acquire(client, "lease:{x}", b, 5000, HOLDER)
    assert store.release(client, "lease:{x}", a) is False
    assert store.release(client, "lease:{x}", b) is True
    assert store.release(client, "lease:{x}", a) is False


def test_a_release_after_the_fence_counter_lapsed_still_notes_who_ended(
    client: redis.Redis,
) -> None:
    # A lease renewed for longer than TTL + 1 h outlives its counter: its release must still
    # be noted (a redelivery would run again, a repeated release would report a loss).
    a, b = token(), token()
    granted = store.acquire(client, "lease:{f}", a, 5000, HOLDER)
    client.delete("lease:{f}:fence")
    assert store.release(client, "lease:{f}", a) is True
    assert store.released_last(client, "lease:{f}", a)
    assert store.release(client, "lease:{f}", a) is True
    assert 0 < client.pttl("lease:{f}:fence") <= store.FENCE_COUNTER_EXTRA_MS
    later = store.acquire(client, "lease:{f}", b, 5000, HOLDER)  # fenced by the clock
    assert later.holder.fencing_token > granted.holder.fencing_token


def test_an_operators_revoke_is_not_the_holders_end(client: redis.Redis) -> None:
    a, b = token(), token()
    store.acquire(client, "lease:{o}", a, 5000, HOLDER)
    assert store.revoke(client, "lease:{o}", b) is False  # not the holder shown: kept
    assert store.revoke(client, "lease:{o}", a) is True
    assert client.exists("lease:{o}") == 0
    # The holder's own release then learns that its lease was taken away, and a redelivered
    # message of the holder is not taken for a finished one.
    assert store.release(client, "lease:{o}", a) is False
    assert not store.released_last(client, "lease:{o}", a)


def test_renew_many_is_one_round_trip_for_many_leases(client: redis.Redis) -> None:
    leases = [(f"lease:{{m{i}}}", token(), 5000) for i in range(200)]
    for key, t, ttl in leases:
        store.acquire(client, key, t, ttl, HOLDER)
    before = int(client.info("stats")["total_connections_received"])
    calls_before = _calls(client, "evalsha")
    assert store.renew_many(client, leases) == [1] * 200
    # One script call renews up to RENEW_BATCH leases (one reply to parse, not 200).
    assert _calls(client, "evalsha") - calls_before == 1
    assert int(client.info("stats")["total_connections_received"]) == before


def test_renew_many_batches_by_ttl_and_size_and_answers_each_lease(client: redis.Redis) -> None:
    count = store.RENEW_BATCH + 5  # two leases with another TTL: 1 003 + 2 leases
    leases = [(f"lease:{{b{i}}}", token(), 7000 if i in (1, 2) else 5000) for i in range(count)]
    for key, t, _ in leases:
        store.acquire(client, key, t, 1000, HOLDER)
    client.delete(leases[3][0])  # gone
    client.set(leases[4][0], f"{token()}:1:{{}}", px=60_000)  # another holder's
    calls_before = _calls(client, "evalsha")
    replies = store.renew_many(client, leases)
    assert replies[3] == 0 and replies[4] == -1
    assert replies[:3] + replies[5:] == [1] * (count - 2)
    assert _calls(client, "evalsha") - calls_before == 3  # 1 000 + 3 at 5 s, 2 at 7 s
    assert 6000 < client.pttl(leases[1][0]) <= 7000
    assert 4000 < client.pttl(leases[count - 1][0]) <= 5000
    assert client.pttl(leases[4][0]) > 50_000  # the other holder's lease was left alone
    assert client.exists(leases[3][0]) == 0  # a renewal never creates a key


def _calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0))


def test_scripts_reload_after_a_restart(throwaway_redis: RedisFactory) -> None:
    server = throwaway_redis()
    client = store.client_for(server.url(), 1.0)
    t = token()
    store.acquire(client, "lease:{x}", t, 5000, HOLDER)
    server.restart()  # empty, script cache flushed
    client.connection_pool.disconnect()
    assert store.renew_many(client, [("lease:{x}", t, 5000)]) == [0]  # refused: key is gone
    assert store.acquire(client, "lease:{x}", token(), 5000, HOLDER).granted


def test_oom_refuses_acquire_without_leaving_a_key_and_renewal_still_works(
    throwaway_redis: RedisFactory,
) -> None:
    server = throwaway_redis({"maxmemory-policy": "noeviction"})
    client = store.client_for(server.url(), 1.0)
    held = token()
    store.acquire(client, "lease:{held}", held, 60_000, HOLDER)
    admin = server.client()
    admin.set("fill", "x" * 4_000_000)
    admin.config_set("maxmemory", "1mb")  # now well over the ceiling
    with pytest.raises(ResponseError, match=r"OOM|maxmemory"):  # Redis 6 and 7 wordings
        store.acquire(client, "lease:{new}", token(), 5000, HOLDER)
    assert client.exists("lease:{new}", fence_key("lease:{new}")) == 0
    assert store.renew_many(client, [("lease:{held}", held, 60_000)]) == [1]
    assert store.release(client, "lease:{held}", held)
    # No key a lease script wrote is left without a lifetime.
    for key in client.scan_iter("lease:*"):
        assert client.pttl(key) > 0


def test_store_check_reports_the_eviction_policy(throwaway_redis: RedisFactory) -> None:
    safe = topology.check_store(store.client_for(throwaway_redis().url(), 1.0))
    assert safe.safe and safe.eviction_policy == "noeviction"
    lru = throwaway_redis({"maxmemory-policy": "allkeys-lru"})
    check = topology.check_store(store.client_for(lru.url(), 1.0))
    assert not check.safe and check.eviction_policy == "allkeys-lru"


def test_every_key_of_a_lease_shares_one_cluster_slot(throwaway_redis: RedisFactory) -> None:
    from redis.cluster import RedisCluster

    server = throwaway_redis(
        {"cluster-enabled": "yes", "cluster-config-file": "nodes.conf"},
        port=_port_with_free_cluster_bus(),
    )
    server.client().execute_command("CLUSTER", "ADDSLOTS", *range(16384))
    from harness.waiting import wait_for

    wait_for(
        lambda: b"cluster_state:ok" in server.client().execute_command("CLUSTER", "INFO"),
        10,
        message="cluster did not come up",
    )
    cluster = RedisCluster(host="127.0.0.1", port=server.port, socket_timeout=2)
    key = "lease:{proj.tasks.sync:0123abcd}"
    t = token()
    got = store.acquire(cluster, key, t, 5000, HOLDER)  # type: ignore[arg-type]
    assert got.granted
    assert store.renew_many(cluster, [(key, t, 5000)]) == [1]  # type: ignore[arg-type]
    assert store.release(cluster, key, t)  # type: ignore[arg-type]
    with pytest.raises(ResponseError, match=r"CROSSSLOT|same slot"):  # the server does check
        server.client().eval("return 1", 2, "{a}x", "{b}y")


def _port_with_free_cluster_bus() -> int:
    """A free port whose cluster bus port (port + 10000) is free and below 65536 too."""
    import socket

    for port in range(20000 + uuid.uuid4().int % 20000, 45000):
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port
    raise AssertionError("no free port pair")


def test_lease_client_has_explicit_timeouts_and_no_hidden_retries(redis_url: str) -> None:
    client = store.client_for(redis_url, 0.25)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 0.25 and kwargs["socket_connect_timeout"] == 0.25
    retry = client.get_retry() or kwargs["retry"]
    assert connection.retries_of(retry) == 0  # redis-py 5.0 Retry has no get_retries


def test_a_paused_store_times_out_once_not_after_retries(
    throwaway_redis: RedisFactory,
) -> None:
    import time

    server = throwaway_redis()
    client = store.client_for(server.url(), 0.3)
    store.acquire(client, "lease:{p}", token(), 5000, HOLDER)
    server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            store.renew_many(client, [("lease:{p}", token(), 5000)])
        assert time.monotonic() - started < 0.6  # redis-py 8 alone would retry for seconds
    finally:
        server.resume()


@pytest.mark.parametrize("text", ["t.job", 'tâche "quoted" \\ back\nslash\x01', "\u2028\ud800", ""])
def test_holder_json_is_the_compact_ascii_json_of_the_holder(text: str) -> None:
    import json

    expected = json.dumps(
        {"v": 1, "task": text, "id": text[::-1], "host": "hôst", "pid": 42}, separators=(",", ":")
    )
    assert store.holder_json(text, text[::-1], "hôst", 42) == expected
    assert store.parse_value(f"{'a' * 32}:7:{expected}").task_name == text
