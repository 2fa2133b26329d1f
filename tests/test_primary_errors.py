"""A primary that answers MASTERDOWN, LOADING or TRYAGAIN follows the rules of any store error.

The body never runs without a lease (the acquire fails as ``LeaseStoreUnavailable`` naming the
error, the topology and the node); a lease already held is kept until its local deadline
while its renewals fail, then lost as ``store_error``. Real servers put in each state:

- MASTERDOWN: a replica with ``replica-serve-stale-data no`` whose primary does not answer;
- LOADING: a server restarted on a dump it loads slowly (``key-load-delay``, a Redis setting
  made for tests, with ``loading-process-events-interval-bytes`` so it answers meanwhile);
- TRYAGAIN: a cluster slot half migrated, the lease key on one node and its fencing counter
  on the other (the acquire script needs both); redis-py's cluster client retries it and
  reports "TTL exhausted", named with the node and slot.

(READONLY is tested in tests/test_inprocess.py, CLUSTERDOWN in tests/test_cluster.py.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from redis.exceptions import TryAgainError

from celery_lease import LeaseStoreUnavailable
from celery_lease.base.keys import fence_key
from celery_lease.store import connection
from harness.topologies import Node, cluster_setup
from tests.support.holders import Holders, Run
from tests.support.redis_server import HOST, free_port
from tests.support.secure import SystemRedisServer
from tests.support.waiting import wait_for

TTL = 2.0
INTERVAL = 0.5


def holders(url: str, **conf: object) -> Holders:
    return Holders(
        lease_backend=url,
        lease_ttl=TTL,
        lease_renew_interval=INTERVAL,
        lease_store_timeout=0.4,
        **conf,
    )


def refused_without_running(h: Holders, n: int, error: str, node: str) -> None:
    """Starting ``n`` fails as a store error naming ``error`` and ``node``; no body ran."""
    outcome = h.start(n)
    assert outcome.done.wait(5)
    assert isinstance(outcome.error, LeaseStoreUnavailable), outcome.error
    assert error in str(outcome.error) and node in str(outcome.error), outcome.error
    assert all(r.n != n for r in h.runs)


def kept_to_its_deadline(
    h: Holders, run: Run, failing_since: float, error: str, node: str, cause: str = "store_error"
) -> None:
    """``run`` held on while its renewals failed with ``error`` on ``node``, and was lost as
    ``cause`` at its local deadline (not before: the store never refused it)."""
    wait_for(lambda: run.ended is not None, TTL + 5, message="the holder never lost its lease")
    assert run.lost is not None and run.lost.cause == cause
    assert run.ended is not None and run.ended - failing_since > TTL - INTERVAL - 0.5
    assert h.errors and all(error in e and node in e for e in h.errors), h.errors[:3]


def test_a_replica_whose_primary_is_down_answers_masterdown_like_any_store_error() -> None:
    with (
        SystemRedisServer(config={"replica-serve-stale-data": "no"}) as server,
        holders(server.url()) as h,
    ):
        assert h.start(1).error is None
        run = h.running(1)
        assert run is not None
        # Demoted to a replica of a primary nobody runs: every lease command gets MASTERDOWN.
        with server.client() as admin:
            admin.replicaof(HOST, free_port())
        failing_since = time.monotonic()
        node = f"redis {HOST}:{server.port}"
        refused_without_running(h, 2, "MasterDownError", node)
        kept_to_its_deadline(h, run, failing_since, "MasterDownError", node)


def test_a_store_loading_its_dataset_answers_loading_like_any_store_error(tmp_path: Path) -> None:
    # 20 000 keys at 200 us each: the restarted server answers LOADING for about 4 s > TTL.
    node = Node(
        tmp_path,
        "loading",
        {"key-load-delay": "200", "loading-process-events-interval-bytes": "1024"},
    )
    try:
        node.start()
        with node.client() as admin:
            admin.mset({f"filler:{i}": "x" for i in range(20_000)})
        with holders(f"redis://{node.address}/0") as h:
            assert h.start(1).error is None
            run = h.running(1)
            assert run is not None
            with node.client() as admin:
                admin.save()  # the lease is in the dump: once loaded, it is there again
            node.stop()
            node.start()  # returns as soon as the port accepts, while the dump loads
            failing_since = time.monotonic()
            with node.client() as admin:
                assert admin.info("persistence")["loading"] == 1
            where = f"redis {node.address}"
            refused_without_running(h, 2, "BusyLoadingError", where)
            # redis-py raises LOADING as a ConnectionError (the server does not serve yet), so
            # the loss reads as a deadline with no answer, as for a store that is down.
            kept_to_its_deadline(h, run, failing_since, "BusyLoadingError", where, "deadline")
    finally:
        node.stop()


def test_an_acquire_whose_keys_a_migration_split_answers_tryagain_like_any_store_error() -> None:
    with cluster_setup(replicas=0) as cluster:
        url = f"redis://{cluster.live()[0].address}/0"
        options = {"lease_backend_options": {"cluster": True}}
        with holders(url, **options) as first:
            assert first.start(1).error is None
            key = first.key_of(1)
        # Released: only its fencing counter is left, which the migration moves first.
        client = connection.client_for(url, 1.0, {"cluster": True})
        slot = client.keyslot(key)
        source = cluster.owner(slot)
        target = next(p for p in cluster.primaries() if p is not source)
        refusals: list[BaseException | None] = []

        def acquire_while_split() -> None:
            # The counter is on the target, the lease key on neither node: the acquire
            # script needs both, so neither node can run it until the slot has moved.
            with target.client() as node, pytest.raises(TryAgainError):
                node.execute_command("ASKING")
                node.mget(key, fence_key(key))
            with holders(url, **options) as h:
                outcome = h.start(1)
                assert outcome.done.wait(5)
                refusals.append(outcome.error)
                assert h.runs == []

        cluster.migrate_slot(slot, target, between=acquire_while_split, first=(fence_key(key),))
        assert len(refusals) == 1
        error = refusals[0]
        assert isinstance(error, LeaseStoreUnavailable), error
        # redis-py's cluster client answers TRYAGAIN itself, retrying (16 tries, ~0.5 s) before
        # it gives up as "TTL exhausted"; the error still names the node and the slot.
        slot_owner = f"on cluster node {source.address} (slot {slot})"
        assert "TTL exhausted" in str(error) and slot_owner in str(error), error
        with holders(url, **options) as after:  # once the slot has moved, it is granted
            assert after.start(1).error is None
            run = after.running(1)
            assert run is not None and run.fencing_token > 1
