"""Leases on Redis behind Sentinel, through failovers: real primary, replica and sentinels.

A holder either keeps a lease that the new primary really holds, or gets ``LeaseLost``; a
successor's fencing token is always above the lost holder's; with ``lease_min_replicas`` a
grant no replica acknowledged never runs a body.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_lease import LeaseStoreUnavailable, store
from harness.topologies import MASTER_NAME, SentinelSetup
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
    return Holders(lease_backend=setup.sentinel_url,
                   lease_backend_options={"master_name": MASTER_NAME},
                   lease_ttl=TTL, lease_renew_interval=INTERVAL, lease_store_timeout=0.4, **conf)


def held_on(setup: SentinelSetup, port: int, key: str) -> store.Holder | None:
    with setup.node_on(port).client() as client:
        value = client.get(key)
    return store.parse_value(value) if value else None


@pytest.mark.parametrize("how", ["sigkill", "sentinel_failover"])
def test_a_replicated_lease_is_kept_on_the_new_primary(sentinel: SentinelSetup, how: str) -> None:
    with holders(sentinel, lease_min_replicas=1) as h:
        outcome = h.start(1)
        assert outcome.error is None, outcome.error
        run = h.running(1)
        assert run is not None
        old = sentinel.primary_port()
        moved_at = time.monotonic()
        if how == "sigkill":
            sentinel.node_on(old).kill()
        else:
            with sentinel.sentinels[0].client() as client:
                client.execute_command("SENTINEL FAILOVER", MASTER_NAME)
        new = sentinel.wait_failover(old)
        promoted_at = time.monotonic()
        # The heartbeat finds the new primary and renews there, the lease never lapsed.
        wait_for(lambda: h.renewals_of(run.key, promoted_at) >= 2, 10,
                 message=lambda: f"no renewal on the new primary; errors: {h.errors[-3:]}")
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
    sentinel: SentinelSetup, broker: RedisServer, tmp_path: Path, pool: str,
) -> None:
    proxy = sentinel.replication_proxy
    assert proxy is not None
    rig = Rig(broker, pool, tmp_path, ttl=TTL)
    tag = f"failover-{pool}"  # the journal is the shared broker's: one tag per run
    try:
        rig.worker(LEASE_BACKEND=sentinel.sentinel_url,
                   LEASE_BACKEND_OPTIONS=json.dumps({"master_name": MASTER_NAME}))
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
