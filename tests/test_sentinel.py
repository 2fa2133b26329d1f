"""Leases on Redis behind Sentinel, through failovers: real primary, replica and sentinels.

A holder either keeps a lease that the new primary really holds, or gets ``LeaseLost``; a
successor's fencing token is always above the lost holder's; with ``lease_min_replicas`` a
grant no replica acknowledged never runs a body, and a dedupe decision at publish no replica
acknowledged folds nothing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_lease import LeaseStoreUnavailable, store
from celery_lease.base.keys import claim_key, wake_key
from celery_lease.beat.leader import BeatLeader
from celery_lease.settings.config import beat_settings
from harness.topologies import MASTER_NAME, SentinelSetup
from tests.support.fixtures import WorkerFactory
from tests.support.holders import Holders
from tests.support.redis_server import RedisServer
from tests.support.rig import MODE, POOLS, Rig
from tests.support.waiting import wait_for

TTL = 8.0  # outlives a failover (~1 s to call the primary down, ~1 s to elect and promote)
INTERVAL = 0.5


@pytest.fixture
def sentinel() -> Iterator[SentinelSetup]:
    """Primary, replica (replicating through a proxy the test can blackhole) and 3 sentinels."""
    with SentinelSetup(replication_proxy=True) as setup:
        yield setup.start()


def holders(setup: SentinelSetup, **conf: Any) -> Holders:
    """Holders on the set-up's sentinels; another ``lease_store_timeout`` gives them a client
    (connections, discovery) of their own, as another worker would have."""
    return Holders(
        **{
            "lease_backend": setup.sentinel_url,
            "lease_backend_options": {"master_name": MASTER_NAME},
            "lease_ttl": TTL,
            "lease_renew_interval": INTERVAL,
            "lease_store_timeout": 0.4,
            **conf,
        }
    )


def held_on(setup: SentinelSetup, port: int, key: str) -> store.Holder | None:
    with setup.node_on(port).client() as client:
        value = client.get(key)
    return store.parse_value(value) if value else None


@pytest.mark.parametrize("how", ["sigkill", "sentinel_failover"])
def test_a_replicated_lease_is_kept_on_the_new_primary(sentinel: SentinelSetup, how: str) -> None:
    with holders(sentinel) as h:
        outcome = h.start(1)
        assert outcome.error is None, outcome.error
        run = h.running(1)
        assert run is not None
        old = sentinel.primary_port()
        replica = next(node.port for node in sentinel.data if node.port != old)
        wait_for(
            lambda: held_on(sentinel, replica, run.key) is not None,
            5,
            message="the grant never reached the replica",
        )
        moved_at = time.monotonic()
        if how == "sigkill":
            sentinel.node_on(old).kill()
        else:
            with sentinel.sentinels[0].client() as client:
                client.execute_command("SENTINEL FAILOVER", MASTER_NAME)
        new = sentinel.wait_failover(old)
        promoted_at = time.monotonic()
        # The heartbeat finds the new primary and renews there, the lease never lapsed.
        wait_for(
            lambda: h.renewals_of(run.key, promoted_at) >= 2,
            10,
            message=lambda: f"no renewal on the new primary; errors: {h.errors[-3:]}",
        )
        holder = held_on(sentinel, new, run.key)
        assert holder is not None and holder.token == run.token
        assert holder.fencing_token == run.fencing_token
        assert run.ended is None and run.lost is None
        assert h.renewals_of(run.key, moved_at) >= 1
        if h.errors:  # renewals that failed during the failover say where they went
            assert all(f"sentinel service {MASTER_NAME!r}" in e for e in h.errors), h.errors
        h.stop()
        assert outcome.error is None, outcome.error
    # A successor's token is above the one granted before the failover.
    with holders(sentinel) as h2:
        assert h2.start(1).error is None
        successor = h2.running(1)
        assert successor is not None and successor.fencing_token > run.fencing_token


def test_an_unreplicated_grant_is_lost_at_the_next_renewal(sentinel: SentinelSetup) -> None:
    proxy = sentinel.replication_proxy
    assert proxy is not None
    with holders(sentinel) as h:
        proxy.blackhole()  # the replica hears nothing from now on
        outcome = h.start(1)
        run = h.running(1)
        assert outcome.error is None and run is not None
        old = sentinel.primary_port()
        sentinel.node_on(old).kill()
        proxy.cut()  # what the replica had not read yet is gone with the primary
        new = sentinel.wait_failover(old)
        assert held_on(sentinel, new, run.key) is None  # the grant never reached the replica
        # A successor (another worker) takes the key on the new primary...
        with holders(sentinel) as successor:
            assert successor.start(1).error is None
            second = successor.running(1)
            assert second is not None
            granted_at = second.started
            # ...and the first holder learns it at its next renewal: refused, not a deadline.
            wait_for(lambda: run.ended is not None, 10, message="holder never lost its lease")
            assert run.lost is not None and run.lost.cause == "refused"
            assert run.ended is not None and run.ended - granted_at < INTERVAL + 0.4 + 0.5
            # Fencing tokens only rise, although the new primary never saw the first counter.
            assert second.fencing_token > run.fencing_token
            assert second.ended is None  # the successor holds on
            now_held = held_on(sentinel, new, second.key)
            assert now_held is not None and now_held.token == second.token


def test_min_replicas_runs_no_body_on_a_grant_no_replica_acknowledged(
    sentinel: SentinelSetup,
) -> None:
    proxy = sentinel.replication_proxy
    assert proxy is not None
    with holders(sentinel, lease_min_replicas=1) as h:
        proxy.blackhole()
        outcome = h.start(1)
        assert outcome.done.wait(5)
        assert isinstance(outcome.error, LeaseStoreUnavailable), outcome.error
        assert "NotReplicated" in str(outcome.error)
        primary = sentinel.primary().address
        assert f"sentinel service {MASTER_NAME!r}, primary {primary}" in str(outcome.error)
        assert h.runs == []  # the body never ran
        # The unacknowledged grant was released: once replication heals, anyone may take it.
        assert held_on(sentinel, sentinel.primary_port(), h.key_of(1)) is None
        proxy.heal()
        outcome = h.start(1)
        assert outcome.error is None and h.running(1) is not None


@pytest.mark.parametrize("pool", POOLS)
def test_a_worker_whose_unreplicated_grant_vanished_gets_lease_lost(
    sentinel: SentinelSetup,
    broker: RedisServer,
    tmp_path: Path,
    pool: str,
) -> None:
    proxy = sentinel.replication_proxy
    assert proxy is not None
    rig = Rig(broker, pool, tmp_path, ttl=TTL)
    tag = f"failover-{pool}"  # the journal is the shared broker's: one tag per run
    try:
        rig.worker(
            LEASE_BACKEND=sentinel.sentinel_url,
            LEASE_BACKEND_OPTIONS=json.dumps({"master_name": MASTER_NAME}),
        )
        proxy.blackhole()
        rig.send("hold", tag, 60.0, MODE.get(pool, "sleep"))
        first = rig.wait_event(tag, "start")[0]
        old = sentinel.primary_port()
        sentinel.node_on(old).kill()
        proxy.cut()
        sentinel.wait_failover(old)
        lost = rig.wait_event(tag, "lost", timeout=20)[0]
        assert lost["cause"] == "refused"  # the new primary never had the grant
        if pool != "threads":  # a blocking sleep was interrupted: no step after it
            assert rig.journal(tag, "step") == []
        rig.send("hold", tag, 0.1, "sleep")
        second = rig.wait_event(tag, "start", count=2)[1]
        assert second["fence"] > first["fence"]
        rig.wait_event(tag, "end")
    finally:
        rig.close()


def _believes(run: Any) -> bool:
    return run.lost is None and run.ended is None


@pytest.mark.parametrize("min_replicas", [0, 1])
def test_a_holder_never_believes_in_a_lease_the_new_primary_lets_lapse(
    sentinel: SentinelSetup,
    min_replicas: int,
) -> None:
    # SENTINEL FAILOVER promotes the replica at once but leaves the old primary writable for
    # about ten seconds: renewals sent there over a pooled connection succeed and count for
    # nothing. A TTL below that lapses on the new primary unless the holder moves there.
    ttl = 6.0
    with holders(
        sentinel, lease_ttl=ttl, lease_renew_interval=ttl / 3, lease_min_replicas=min_replicas
    ) as h:
        assert h.start(1).error is None
        run = h.running(1)
        assert run is not None
        old = sentinel.primary_port()
        time.sleep(1.5)
        with sentinel.sentinels[0].client() as client:
            client.execute_command("SENTINEL FAILOVER", MASTER_NAME)
        new = sentinel.wait_failover(old)
        # The hazard is real: the old primary still takes writes as a primary.
        assert sentinel.node_on(old).info("replication").get("role") == "master"
        watched_until = time.monotonic() + 2 * ttl
        while time.monotonic() < watched_until:
            believed = _believes(run)
            held = held_on(sentinel, new, run.key)
            if believed and _believes(run):
                # Whenever the holder believes, the new primary holds its token: nobody else
                # can be granted the key there.
                assert held is not None and held.token == run.token, (
                    f"holder believes in {run.key} but the new primary has {held}; "
                    f"renewal errors: {h.errors[-3:]}"
                )
            time.sleep(0.05)
        if min_replicas == 0:
            # It moved to the new primary and kept the lease (no replica needed there).
            assert _believes(run), run.lost
            assert h.renewals_of(run.key, watched_until - 2 * ttl) >= 2
        # A rival with its own connections (another worker) cannot run beside a believer.
        with holders(sentinel, lease_ttl=ttl, lease_store_timeout=0.45) as rival:
            rival.start(1)
            if _believes(run):
                assert rival.running(1) is None
            rival.stop()
        h.stop()


def test_a_grant_on_an_old_primary_that_stays_writable_never_runs_a_body(
    sentinel: SentinelSetup,
) -> None:
    with holders(sentinel) as stale:
        assert stale.start(1).error is None  # its pool now has a connection to the primary
        stale.stop()
        old = sentinel.primary_port()
        with sentinel.sentinels[0].client() as client:
            client.execute_command("SENTINEL FAILOVER", MASTER_NAME)
        new = sentinel.wait_failover(old)
        assert sentinel.node_on(old).info("replication").get("role") == "master"
        with holders(sentinel, lease_store_timeout=0.45) as fresh:  # another worker
            assert fresh.start(2).error is None
            holder = fresh.running(2)
            assert holder is not None
            assert held_on(sentinel, new, holder.key) is not None
            stale._stop.clear()
            outcome = stale.start(2)
            assert outcome.done.wait(5)
            # The grant on the old primary was not confirmed by the sentinels: no body ran.
            assert stale.running(2) is None
            assert isinstance(outcome.error, LeaseStoreUnavailable), outcome.error
            assert "PrimaryUnconfirmed" in str(outcome.error), outcome.error
            assert f"127.0.0.1:{new}" in str(outcome.error)
            # The client looked for the primary again: the next try meets the real holder.
            again = stale.start(2)
            assert again.done.wait(5) and stale.running(2) is None
            assert again.error is None  # a duplicate of a running execution: skipped
            assert fresh.running(2) is holder
            fresh.stop()


def test_with_min_replicas_a_renewal_no_replica_acknowledged_does_not_count(
    sentinel: SentinelSetup,
) -> None:
    proxy = sentinel.replication_proxy
    assert proxy is not None
    with holders(sentinel, lease_min_replicas=1) as h:
        assert h.start(1).error is None
        run = h.running(1)
        assert run is not None
        cut_at = time.monotonic()
        proxy.blackhole()  # the primary accepts renewals that no replica will ever have
        wait_for(lambda: run.ended is not None, TTL + 3, message="the lease was never lost")
        assert run.lost is not None and run.lost.cause == "deadline"
        # Lost at the local deadline of the last acknowledged renewal, not before: renewals
        # went on being sent (and answered) until then.
        assert cut_at + TTL - INTERVAL - 0.5 < run.ended < cut_at + TTL + 0.5
        assert any("NotReplicated" in e for e in h.errors), h.errors[-3:]
        proxy.heal()


def test_a_replica_promoted_by_hand_takes_no_lease_from_the_primary(
    sentinel: SentinelSetup,
) -> None:
    with holders(sentinel) as h:
        assert h.start(1).error is None
        run = h.running(1)
        assert run is not None
        primary = sentinel.primary_port()
        replica = next(node for node in sentinel.data if node.port != primary)
        with replica.client() as client:
            client.execute_command("REPLICAOF", "NO", "ONE")
        # Clients find the primary through the sentinels, which still name the old one (and
        # turn the rogue primary back into a replica): the holder keeps its lease there, and a
        # rival meets it.
        watched_until = time.monotonic() + TTL
        while time.monotonic() < watched_until:
            assert sentinel.primary_port() == primary
            held = held_on(sentinel, primary, run.key)
            assert _believes(run) and held is not None and held.token == run.token
            time.sleep(0.1)
        with holders(sentinel, lease_store_timeout=0.45) as rival:
            rival.start(1)
            assert rival.running(1) is None


@pytest.mark.parametrize(
    ("conf", "exposed"),
    [
        ({"lease_ttl": 4.0}, True),  # 4 s <= 1 s down-after + 3 s + 2 x 1.33 s
        ({"lease_ttl": 4.0, "lease_min_replicas": 1}, False),  # replicas must acknowledge
        ({"lease_ttl": 8.0, "lease_renew_interval": 0.5}, False),  # 8 s > 1 + 3 + 2 x 0.5
    ],
)
def test_doctor_and_the_worker_start_check_name_a_ttl_a_partitioned_primary_can_outlast(
    sentinel: SentinelSetup,
    caplog: pytest.LogCaptureFixture,
    conf: dict[str, Any],
    exposed: bool,
) -> None:
    from celery_lease import LeasedTask
    from celery_lease.ops.doctor import check_failover
    from celery_lease.ops.worker import check_app

    app = Celery("failover_bound", broker="memory://", set_as_current=False)
    app.conf.update(
        lease_backend=sentinel.sentinel_url,
        lease_backend_options={"master_name": MASTER_NAME},
        **conf,
    )

    @app.task(base=LeasedTask, name="failover_bound.job", shared=False)  # type: ignore[misc]
    def job() -> None:
        pass

    options, url, _ = job.lease_settings()
    (finding,) = check_failover(url, [(job.name, options)], app)
    assert finding.level == ("warn" if exposed else "ok"), finding
    if exposed:
        assert "down-after-milliseconds (1s)" in finding.message
        assert "lease_min_replicas=1" in finding.fix
    with caplog.at_level("WARNING", logger="celery_lease"):
        check_app(app)
    warned = [r.getMessage() for r in caplog.records if "down-after" in r.getMessage()]
    assert bool(warned) == exposed, warned


def test_a_publish_refused_on_an_old_primary_that_stays_writable_is_not_a_dedupe_refusal(
    sentinel: SentinelSetup,
) -> None:
    client = store.client_for(sentinel.sentinel_url, 1.0, {"master_name": MASTER_NAME})
    key, claimer = "lease:{t.job:claimed}", store.holder_json("t.job", "w1", "host", 1)
    assert store.claim(client, key, "w1", 60_000, claimer).claimed  # its pool: the primary
    old = sentinel.primary_port()
    with sentinel.sentinels[0].client() as admin:
        admin.execute_command("SENTINEL FAILOVER", MASTER_NAME)
    new = sentinel.wait_failover(old)
    with sentinel.node_on(new).client() as promoted:  # w1's grant there cleared the claim
        promoted.delete(claim_key(key))
    # The old primary still has the claim: a refusal read from it would fold this publish onto
    # a copy that already runs. The sentinels do not confirm that node, so it is no refusal.
    with pytest.raises(store.PrimaryUnconfirmed):
        store.claim(client, key, "w2", 60_000, claimer)
    # The client looked for the primary again: the next publish claims the free slot there.
    assert store.claim(client, key, "w2", 60_000, claimer).claimed


def test_with_min_replicas_a_dedupe_claim_or_fold_no_replica_acknowledged_does_not_count(
    sentinel: SentinelSetup,
) -> None:
    client = store.client_for(sentinel.sentinel_url, 1.0, {"master_name": MASTER_NAME})
    key, other = "lease:{t.job:replicated}", "lease:{t.job:unreplicated}"

    def claim(key: str, task_id: str, min_replicas: int = 1) -> store.Decision:
        claimer = store.holder_json("t.job", task_id, "host", 1)
        return store.claim(client, key, task_id, 60_000, claimer, min_replicas=min_replicas)

    assert claim(key, "w1").claimed
    folded = claim(key, "w2")
    assert (folded.claimed, folded.task_id) == (False, "w1")  # the replica follows: it counts
    proxy = sentinel.replication_proxy
    assert proxy is not None
    proxy.blackhole()  # the replica hears nothing: a failover now would lose the claim
    with pytest.raises(store.NotReplicated, match="taken back"):
        claim(other, "w3")
    with sentinel.primary().client() as primary:
        assert primary.exists(claim_key(other)) == 0  # taken back: the publish goes unclaimed
    proxy.heal()
    assert claim(other, "w3").claimed
    # More replicas asked for than follow the primary: neither a claim nor a fold counts.
    with pytest.raises(store.NotReplicated):
        claim(key, "w4", 2)
    with pytest.raises(store.NotReplicated):
        claim("lease:{t.job:third}", "w5", 2)
    with sentinel.primary().client() as primary:
        assert primary.get(claim_key(key)) is not None  # w1 still waits; w4 wrote nothing
        assert primary.exists(claim_key("lease:{t.job:third}")) == 0


def test_with_min_replicas_a_publish_whose_dedupe_no_replica_acknowledged_is_published(
    sentinel: SentinelSetup, redis_url: str, worker_factory: WorkerFactory
) -> None:
    from tests.apps import dedupe_app

    conf = {
        "lease_backend": sentinel.sentinel_url,
        "lease_backend_options": {"master_name": MASTER_NAME},
        "lease_on_store_error": "fail",
    }
    dedupe_app.configure(redis_url, worker_factory.queue, lease_min_replicas=1, **conf)
    results = [dedupe_app.sync.delay("m", n) for n in range(2)]
    assert [r.lease_disposition for r in results] == ["published", "deduplicated"]
    # Two replicas asked for, one follows: the claim is taken back and the message still
    # published (lease_on_store_error="fail" notwithstanding), never folded on a claim that
    # a failover could lose.
    dedupe_app.configure(redis_url, worker_factory.queue, lease_min_replicas=2, **conf)
    unconfirmed = [dedupe_app.sync.delay("n", n) for n in range(2)]
    assert [r.lease_disposition for r in unconfirmed] == ["unguarded"] * 2
    assert len({r.id for r in unconfirmed}) == 2
    with redis.Redis.from_url(redis_url) as broker:
        assert broker.llen(worker_factory.queue) == 3
    with sentinel.primary().client() as primary:
        assert primary.exists(claim_key(dedupe_app.sync.lease_key_for(("n",)))) == 0


def test_a_duplicate_parked_on_an_old_primary_that_stays_writable_is_not_parked(
    sentinel: SentinelSetup,
) -> None:
    from celery_lease.store import handoff

    client = store.client_for(sentinel.sentinel_url, 1.0, {"master_name": MASTER_NAME})
    key = "lease:{t.job:parked}"
    assert store.acquire(client, key, "a" * 32, 30_000, "{}").granted  # its pool: the primary
    old = sentinel.primary_port()
    with sentinel.sentinels[0].client() as admin:
        admin.execute_command("SENTINEL FAILOVER", MASTER_NAME)
    sentinel.wait_failover(old)
    # Parked on the old primary, the duplicate would be acknowledged and lost with that node's
    # writes: the sentinels do not confirm it, so the park does not count.
    with pytest.raises(store.PrimaryUnconfirmed):
        handoff.park(client, key, "queue", "dup-1", "{}", 10, 60_000)


def fail_over(setup: SentinelSetup, *replicated: str) -> tuple[int, int]:
    """``SENTINEL FAILOVER`` once every data node has the keys ``replicated``; the ports of the
    old primary (writable on old connections for about ten seconds more) and the new one."""

    def everywhere() -> bool:
        for node in setup.data:
            with node.client() as client:
                if client.exists(*replicated) < len(replicated):
                    return False
        return True

    if replicated:
        wait_for(everywhere, 5, message=f"{replicated} never reached the replica")
    old = setup.primary_port()
    with setup.sentinels[0].client() as admin:
        admin.execute_command("SENTINEL FAILOVER", MASTER_NAME)
    return old, setup.wait_failover(old)


def granted_elsewhere(setup: SentinelSetup, new: int, key: str, successor: str) -> Any:
    """Lose ``key``'s grant on the ``new`` primary (as one that never replicated before a
    forced failover) and grant it there to ``successor``; the client that took it (another
    worker's: its own pool, which finds the new primary)."""
    with setup.node_on(new).client() as promoted:
        promoted.delete(key)
    other = store.client_for(setup.sentinel_url, 0.9, {"master_name": MASTER_NAME})
    assert store.acquire(other, key, successor, 30_000, "{}").granted
    return other


def holding(setup: SentinelSetup, key: str, token: str, info: str = "{}") -> Any:
    """A Sentinel-managed client whose ``token`` holds ``key`` (its pool: the primary now)."""
    client = store.client_for(setup.sentinel_url, 1.0, {"master_name": MASTER_NAME})
    assert store.acquire(client, key, token, 30_000, info).granted
    return client


def test_a_release_answered_by_an_old_primary_that_stays_writable_does_not_count(
    sentinel: SentinelSetup,
) -> None:
    key, token, successor = "lease:{t.job:released}", "a" * 32, "b" * 32
    client = holding(sentinel, key, token)
    old, new = fail_over(sentinel)
    # The grant never reached the new primary (as one lost in a forced failover), which
    # granted the key to the next execution; the old primary still has the first token.
    granted_elsewhere(sentinel, new, key, successor)
    assert held_on(sentinel, old, key) is not None
    # The old primary would answer "released": the sentinels do not confirm it, and the
    # primary they name does not have the token: the holder learns it had lost its lease.
    assert store.release(client, key, token) is False
    holder = held_on(sentinel, new, key)
    assert holder is not None and holder.token == successor


def test_a_hand_over_answered_by_an_old_primary_that_stays_writable_hands_nothing_over(
    sentinel: SentinelSetup,
) -> None:
    from celery_lease.base.keys import line_key
    from celery_lease.store import handoff

    key, token, successor = "lease:{t.job:handed}", "a" * 32, "b" * 32
    client = holding(sentinel, key, token)
    assert handoff.park(client, key, "queue", "dup-1", "{}", 10, 60_000).outcome == "parked"
    _, new = fail_over(sentinel, line_key(key))
    other = granted_elsewhere(sentinel, new, key, successor)  # the grant never replicated
    # The old primary would release and hand dup-1 over, to be published while the successor
    # holds the key: the sentinels do not confirm it, and the new primary has not the token.
    got = handoff.release_handing_over(client, key, token, 30_000, 60_000, 0)
    assert got.released is False and got.handed is None and got.expired == ()
    # dup-1 still waits on the new primary, handed over at the successor's release.
    after = handoff.release_handing_over(other, key, successor, 30_000, 60_000, 0)
    assert after.released and after.handed is not None and after.handed.task_id == "dup-1"


def test_a_hand_over_answered_by_an_old_primary_is_made_once_on_the_new_one(
    sentinel: SentinelSetup,
) -> None:
    from celery_lease.base.keys import line_key, reservation_key
    from celery_lease.store import handoff

    key, token = "lease:{t.job:handed_once}", "a" * 32
    client = holding(sentinel, key, token)
    assert handoff.park(client, key, "queue", "dup-1", "{}", 10, 60_000).outcome == "parked"
    _, new = fail_over(sentinel, key, line_key(key))
    with sentinel.node_on(new).client() as promoted:
        # The lines differ: the new primary lost dup-1's park, and dup-2 was parked there since.
        promoted.delete(line_key(key))
        assert handoff.park(promoted, key, "queue", "dup-2", "{}", 10, 60_000).outcome == "parked"
        # The old primary's answer (dup-1 handed over there) does not count: the release is sent
        # to the new primary, which hands the key over to its own line's head, once.
        got = handoff.release_handing_over(client, key, token, 30_000, 60_000, 0)
        assert got.released and got.handed is not None and got.handed.task_id == "dup-2"
        assert promoted.get(key) is None
        assert promoted.hget(reservation_key(key), "id") == b"dup-2"
        assert promoted.llen(line_key(key)) == 0
        again = handoff.release_handing_over(client, key, token, 30_000, 60_000, 0)
        assert again.released and again.handed is None  # a repeat hands nothing over again


def test_a_cooldown_release_answered_by_an_old_primary_that_stays_writable_does_not_count(
    sentinel: SentinelSetup,
) -> None:
    key, token, successor = "lease:{t.job:cooled}", "a" * 32, "b" * 32
    info = store.holder_json("t.job", "w1", "host", 1)
    client = holding(sentinel, key, token, info)  # a cooldown extends the holder JSON
    _, new = fail_over(sentinel)
    granted_elsewhere(sentinel, new, key, successor)  # the grant never replicated
    # The old primary would write the cooldown and answer "released": not confirmed, and the
    # new primary has not the token: the holder learns it had lost its lease.
    assert store.release_into_cooldown(client, key, token, 60_000) is False
    holder = held_on(sentinel, new, key)
    assert holder is not None and holder.token == successor and holder.cooldown_until == 0.0


def test_a_cooldown_written_on_an_old_primary_is_written_on_the_new_one(
    sentinel: SentinelSetup,
) -> None:
    key, token = "lease:{t.job:cooled_once}", "a" * 32
    info = store.holder_json("t.job", "w1", "host", 1)
    client = holding(sentinel, key, token, info)  # a cooldown extends the holder JSON
    _, new = fail_over(sentinel, key)
    # Written on the old primary alone, the cooldown would vanish with that node's writes and
    # a copy could start at once on the new one: the release is sent there too.
    assert store.release_into_cooldown(client, key, token, 60_000) is True
    holder = held_on(sentinel, new, key)
    assert holder is not None and holder.token == token and holder.cooldown_until > 0.0


def waiting_on(setup: SentinelSetup, port: int, key: str, seconds: float) -> Future[bool]:
    """A hold waiting for ``key``'s release on the node on ``port`` (blocked in BLPOP there
    once this returns); ``.result()`` is whether a release woke it within ``seconds``."""
    waiter = redis.Redis(port=port, socket_timeout=seconds + 5)
    with setup.node_on(port).client() as watcher:
        before = int(watcher.info("clients")["blocked_clients"])
        pool = ThreadPoolExecutor(1)
        woken = pool.submit(store.wait_for_release, waiter, key, seconds)
        pool.shutdown(wait=False)
        wait_for(
            lambda: (
                int(watcher.info("clients")["blocked_clients"]) > before
                and not watcher.exists(wake_key(key))
            ),
            10,
            message="the waiter never blocked",
        )
    return woken


def test_a_hold_release_answered_by_an_old_primary_that_stays_writable_wakes_nobody(
    sentinel: SentinelSetup,
) -> None:
    key, token, successor = "lease:{hold:released}", "a" * 32, "b" * 32
    client = holding(sentinel, key, token)
    _, new = fail_over(sentinel)
    granted_elsewhere(sentinel, new, key, successor)  # the grant never replicated
    woken = waiting_on(sentinel, new, key, 3.0)
    # The old primary would release and wake a waiter while the successor holds the key on
    # the new one: not confirmed, and the new primary has not the token.
    assert store.release_and_wake(client, key, token) is False
    assert woken.result(timeout=15) is False
    holder = held_on(sentinel, new, key)
    assert holder is not None and holder.token == successor


def test_a_hold_release_answered_by_an_old_primary_wakes_a_waiter_of_the_new_one(
    sentinel: SentinelSetup,
) -> None:
    key, token = "lease:{hold:woken}", "a" * 32
    client = holding(sentinel, key, token)
    _, new = fail_over(sentinel, key)
    woken = waiting_on(sentinel, new, key, 20.0)
    # Released on the old primary alone, the key would stay held on the new one until its
    # lifetime ends, and its waiters asleep: the release is sent there too, and wakes one.
    assert store.release_and_wake(client, key, token) is True
    assert woken.result(timeout=25) is True
    assert held_on(sentinel, new, key) is None


def test_a_take_over_on_an_old_primary_that_stays_writable_does_not_count(
    sentinel: SentinelSetup,
) -> None:
    key, token, newcomer = "lease:{t.job:preempted}", "a" * 32, "b" * 32
    client = holding(sentinel, key, token)
    _, new = fail_over(sentinel, key)
    # Taken over on the old primary alone, the newcomer's body would run while the new
    # primary still names the old holder (who renews there): the sentinels do not confirm it.
    with pytest.raises(store.PrimaryUnconfirmed):
        store.take_over(client, key, newcomer, 30_000, "{}", from_token=token)
    holder = held_on(sentinel, new, key)
    assert holder is not None and holder.token == token


def test_a_beat_leader_whose_grant_the_new_primary_lost_steps_down_as_lost(
    sentinel: SentinelSetup, caplog: pytest.LogCaptureFixture
) -> None:
    from celery import Celery

    app = Celery("beat", set_as_current=False)
    app.conf.update(
        lease_backend=sentinel.sentinel_url,
        lease_backend_options={"master_name": MASTER_NAME},
        lease_beat_ttl=60.0,  # no renewal during the test: the release alone decides
        lease_beat_renew_interval=20.0,
    )
    options, url, _ = beat_settings(app.conf)
    leader = BeatLeader(app, "lease:{celery.beat:failover}", options, url)
    assert leader.poll()[0]
    _, new = fail_over(sentinel)
    granted_elsewhere(sentinel, new, leader.key, "b" * 32)  # the grant never replicated
    woken = waiting_on(sentinel, new, leader.key, 3.0)  # a standby beat on the new primary
    with caplog.at_level(logging.INFO, logger="celery_lease"):
        leader.step_down()
    # Its "released" came from the demoted primary: it learns it had lost the lead, and the
    # standby is not woken while another leader holds the key.
    assert "beat: lost leadership" in caplog.text, caplog.text
    assert woken.result(timeout=15) is False
