"""Leases on a real Redis Cluster: three primaries, one replica each.

Renewals of leases spread over every slot go in one round trip per primary; a slot migrated
under running holders keeps their leases; a primary killed under running holders (its replica
promoted) leaves each holder either with a lease its new primary really holds or with
``LeaseLost``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner
from redis.connection import Connection
from redis.exceptions import ConnectionError, SlotNotCoveredError

from celery_lease import LeaseStoreUnavailable, hold, store
from celery_lease.base.keys import fence_key
from celery_lease.beat.scheduler import BeatLeader
from celery_lease.ops.cli import lease
from celery_lease.settings.config import resolve_options
from celery_lease.store import connection
from celery_lease.store import url as store_url
from harness.topologies import ClusterSetup, cluster_setup
from tests.support.holders import Holders
from tests.support.redis_server import RedisServer, free_port
from tests.support.rig import MODE, POOLS, Rig
from tests.support.waiting import wait_for

TTL = 8.0  # outlives a primary's failover (cluster-node-timeout 1 s, then the election)
INTERVAL = 0.5
TOKEN = "a" * 32


@pytest.fixture
def cluster() -> Iterator[ClusterSetup]:
    with cluster_setup() as setup:
        yield setup


def seed_url(setup: ClusterSetup) -> str:
    return f"redis://127.0.0.1:{setup.live()[0].port}/0"


def holders(setup: ClusterSetup, ttl: float = TTL) -> Holders:
    return Holders(
        lease_backend=seed_url(setup),
        lease_backend_options={"cluster": True},
        lease_ttl=ttl,
        lease_renew_interval=INTERVAL,
        lease_store_timeout=0.4,
    )


def holder_on_owner(setup: ClusterSetup, client: Any, key: str) -> store.Holder | None:
    with setup.owner(client.keyslot(key)).client() as node:
        value = node.get(key)
    return store.parse_value(value) if value else None


def test_renewals_go_in_one_round_trip_per_primary(
    cluster: ClusterSetup,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = connection.client_for(seed_url(cluster), 1.0, {"cluster": True})
    keys = [f"lease:{{job:{i}}}" for i in range(600)]
    for key in keys:
        assert store.acquire(client, key, TOKEN, 10_000, "{}").granted
    owners = Counter(cluster.owner(client.keyslot(k)).port for k in keys)
    assert len(owners) == 3  # spread over every primary
    store.renew_many(client, [(k, TOKEN, 10_000) for k in keys])  # scripts loaded everywhere

    writes: Counter[int] = Counter()
    send = Connection.send_packed_command

    def counted(self: Connection, command: Any, check_health: bool = True) -> None:
        writes[self.port] += 1
        send(self, command, check_health)

    before = cluster.commandstats()
    monkeypatch.setattr(Connection, "send_packed_command", counted)
    replies = store.renew_many(client, [(k, TOKEN, 10_000) for k in keys])
    monkeypatch.undo()
    after = cluster.commandstats()
    assert replies == [1] * len(keys)
    assert dict(writes) == {port: 1 for port in owners}, (writes, owners)  # one per primary
    for port, count in owners.items():
        sent = {
            cmd: n - before[port].get(cmd, 0)
            for cmd, n in after[port].items()
            if n != before[port].get(cmd, 0) and cmd not in ("info", "hello", "replconf")
        }
        # Each primary ran its own keys' renewals and nothing else (no COMMAND GETKEYS; its
        # replica's REPLCONF ACK, once a second, is replication, not ours).
        assert sent == {"evalsha": count, "get": count, "pexpire": count}, (port, sent)


def test_renewals_reload_their_script_on_every_primary(cluster: ClusterSetup) -> None:
    client = connection.client_for(seed_url(cluster), 1.0, {"cluster": True})
    keys = [f"lease:{{job:{i}}}" for i in range(30)]
    for key in keys:
        store.acquire(client, key, TOKEN, 10_000, "{}")
    for node in cluster.primaries():
        with node.client() as plain:
            plain.script_flush()
    assert store.renew_many(client, [(k, TOKEN, 10_000) for k in keys]) == [1] * len(keys)


def test_a_slot_migrated_under_running_holders_keeps_their_leases(cluster: ClusterSetup) -> None:
    client = connection.client_for(seed_url(cluster), 1.0, {"cluster": True})
    with holders(cluster) as h:
        for n in range(6):
            assert h.start(n).error is None
        moving = h.running(0)
        assert moving is not None
        slot = client.keyslot(moving.key)
        source = cluster.owner(slot)
        target = next(p for p in cluster.primaries() if p is not source)

        def half_moved() -> None:  # renewals meet ASK while the slot's keys are split
            with source.client() as node:  # the lease moved, its fencing counter did not yet
                assert node.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 1
                assert node.execute_command("CLUSTER GETKEYSINSLOT", slot, 2) == [
                    fence_key(moving.key)
                ]
            since = time.monotonic()
            wait_for(
                lambda: h.renewals_of(moving.key, since) >= 1,
                5,
                message=lambda: f"no renewal while half-moved: {h.errors[-3:]}",
            )

        cluster.migrate_slot(slot, target, between=half_moved, first=(moving.key,))
        assert cluster.owner(slot) is target
        since = time.monotonic()
        wait_for(
            lambda: all(h.renewals_of(r.key, since) >= 2 for r in h.runs),
            10,
            message=lambda: f"renewals stopped after the move: {h.errors[-3:]}",
        )
        assert all(r.ended is None and r.lost is None for r in h.runs)
        with target.client() as node:
            value = node.get(moving.key)
            assert value is not None and store.parse_value(value).token == moving.token
            assert node.pttl(moving.key) > (TTL - 2 * INTERVAL) * 1000  # renewed there
        with source.client() as node:  # the old owner answers for the slot no more
            assert node.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0


def test_a_primary_killed_under_running_holders(cluster: ClusterSetup) -> None:
    client = connection.client_for(seed_url(cluster), 1.0, {"cluster": True})
    with holders(cluster) as h:
        for n in range(12):
            assert h.start(n).error is None
        victim = cluster.owner(client.keyslot(h.runs[0].key))
        on_victim = [r for r in h.runs if cluster.owner(client.keyslot(r.key)) is victim]
        victim.kill()
        cluster.wait_ok(timeout=20)  # its replica took over
        since = time.monotonic()

        def settled() -> bool:
            return all(r.ended is not None or h.renewals_of(r.key, since) >= 2 for r in h.runs)

        wait_for(settled, 15, message=lambda: f"holders never settled: {h.errors[-3:]}")
        for run in h.runs:
            if run.ended is not None:  # lost: raised in the body, nothing held in its name
                assert run in on_victim and run.lost is not None
                holder = holder_on_owner(cluster, client, run.key)
                assert holder is None or holder.token != run.token
            else:  # kept: the primary that owns the slot now holds it for this token
                holder = holder_on_owner(cluster, client, run.key)
                assert holder is not None and holder.token == run.token
        # Failed renewals during the failover named the cluster node they went to.
        assert all("cluster" in e for e in h.errors), h.errors[:3]


def test_a_cluster_that_is_down_runs_no_body_and_holders_keep_leases_to_their_deadline() -> None:
    ttl = 3.0
    with cluster_setup(replicas=0) as cluster, holders(cluster, ttl) as h:
        client = connection.client_for(seed_url(cluster), 1.0, {"cluster": True})
        for n in range(6):
            assert h.start(n).error is None
        victim = cluster.owner(client.keyslot(h.runs[0].key))
        victim.kill()  # no replica to promote: after cluster-node-timeout, CLUSTERDOWN everywhere
        down_at = time.monotonic()
        survivor = cluster.live()[0]
        wait_for(lambda: survivor.cluster_info().get("cluster_state") == "fail", 10)
        fresh = next(
            n
            for n in range(100, 200)  # a key a surviving primary would serve
            if cluster.owner(client.keyslot(h.key_of(n))) is not victim
        )
        outcome = h.start(fresh)
        assert outcome.done.wait(5) and outcome.error is not None
        assert "ClusterDown" in str(outcome.error) and "on cluster node" in str(outcome.error)
        assert all(r.n != fresh for r in h.runs)  # no body ran
        wait_for(lambda: all(r.ended is not None for r in h.runs), ttl + 5)
        for run in h.runs:  # held until the local deadline (never refused: nobody answered)
            assert run.lost is not None and run.lost.cause in ("store_error", "deadline")
            assert run.ended is not None and run.ended - down_at > ttl - 2 * INTERVAL - 0.5
        assert any("CLUSTERDOWN" in e or "ClusterDown" in e for e in h.errors), h.errors[:3]


@pytest.mark.parametrize("victim_is", ["the seed node", "another primary"])
def test_a_dead_primary_costs_only_its_own_leases_when_the_cluster_stays_up(
    victim_is: str,
) -> None:
    ttl = 3.0
    partial = {"cluster-require-full-coverage": "no"}  # the other primaries keep serving
    with cluster_setup(replicas=0, options=partial) as cluster, holders(cluster, ttl) as h:
        url = seed_url(cluster)
        client = connection.client_for(url, 1.0, {"cluster": True})
        seed = cluster.live()[0]  # the node in the lease_backend URL
        # Another primary: the first after the seed in the client's order of primaries, so a
        # survivor comes after it (a command sent to every primary in turn stops at it).
        order = [cluster.node_on(n.port) for n in client.get_primaries()]
        victim = seed if victim_is == "the seed node" else next(p for p in order if p is not seed)
        assert order.index(victim) < len(order) - 1
        picked: dict[int, list[int]] = {p.port: [] for p in order}  # three leases per primary
        for n in range(300):
            owned = picked[cluster.owner(client.keyslot(h.key_of(n))).port]
            if len(owned) < 3:
                owned.append(n)
        for n in sorted(n for ns in picked.values() for n in ns):
            assert h.start(n).error is None
        on_victim = set(picked[victim.port])
        for node in order:  # the renewal script is loaded nowhere (fresh or restarted nodes)
            with node.client() as plain:
                plain.script_flush()
        victim.kill()
        wait_for(lambda: all(r.ended is not None for r in h.runs if r.n in on_victim), ttl + 5)
        since = time.monotonic()
        others = [r for r in h.runs if r.n not in on_victim]
        wait_for(
            lambda: all(h.renewals_of(r.key, since) >= 2 for r in others),
            5,
            message=lambda: f"survivors stopped renewing: {h.errors[-3:]}",
        )
        assert all(r.ended is None for r in others)
        assert any(f"Error 111 connecting to {victim.address}" in e for e in h.errors)

        # New leases: granted on a surviving primary's slot, refused with the dead one named.
        def fresh_on(owner: Any) -> int:
            return next(
                n for n in range(300, 600) if cluster.owner(client.keyslot(h.key_of(n))) is owner
            )

        granted = h.start(fresh_on(next(p for p in order if p is not victim)))
        assert granted.error is None and h.running(granted.n) is not None
        refused = h.start(fresh_on(victim))
        assert refused.done.wait(5) and f"on cluster node {victim.address}" in str(refused.error)
        # `celery lease ls` lists what the primaries that answer hold, and names the dead one.
        listed = CliRunner().invoke(lease, ["ls", "--json"], obj=SimpleNamespace(app=h.app))
        assert listed.exit_code == 1, (listed.output, listed.stderr, listed.exception)
        assert {i["key"] for i in json.loads(listed.stdout)} == {
            r.key for r in h.runs if r.ended is None
        }
        assert f"warning: cluster node {victim.address}: Error 111" in listed.stderr
        if victim is seed:  # a client that knows no node but the dead seed: a store error
            with pytest.raises(ConnectionError, match="no Redis Cluster node answered"):
                connection.build_client(store_url.parse_store(url, {"cluster": True}), 0.5)


@pytest.fixture(scope="module")
def resharded_cluster() -> Iterator[ClusterSetup]:
    """One cluster for every pool's slot-move test: each moves the slot of its own keys."""
    with cluster_setup() as setup:
        yield setup


@pytest.mark.parametrize("pool", POOLS)
def test_a_worker_keeps_its_leases_while_their_slot_moves(
    resharded_cluster: ClusterSetup,
    broker: RedisServer,
    tmp_path: Path,
    pool: str,
) -> None:
    cluster = resharded_cluster
    rig = Rig(broker, pool, tmp_path, ttl=3.0)  # renewals every second
    try:
        rig.worker(
            LEASE_BACKEND=seed_url(cluster), LEASE_BACKEND_OPTIONS=json.dumps({"cluster": True})
        )
        # Fresh tags for each run (the journal is the shared broker's); solo runs one at a time.
        tags = [f"slot-a-{pool}", f"slot-b-{pool}"][: 1 if pool == "solo" else 2]
        for tag in tags:
            rig.send("hold", tag, 6.0, MODE.get(pool, "sleep"))
        started = {tag: rig.wait_event(tag, "start")[0] for tag in tags}
        key = str(started[tags[0]]["key"])
        client = connection.client_for(seed_url(cluster), 1.0, {"cluster": True})
        slot = client.keyslot(key)
        target = next(p for p in cluster.primaries() if p is not cluster.owner(slot))

        def renewed_on_target() -> None:  # a renewal lands on the importing node (via ASK)
            with target.client() as node:
                node.execute_command("ASKING")
                low = node.pttl(key)
                wait_for(
                    lambda: (node.execute_command("ASKING"), node.pttl(key))[1] > low,
                    5,
                    message="no renewal reached the importing node",
                )

        cluster.migrate_slot(slot, target, between=renewed_on_target, first=(key,))
        for tag in tags:
            rig.wait_event(tag, "end", timeout=20)
        assert [e for e in rig.journal(event="lost") if e["tag"] in tags] == []
    finally:
        rig.close()


@pytest.mark.parametrize("policy", ["fail", "retry"])
def test_a_cluster_client_that_cannot_be_built_follows_lease_on_store_error(
    policy: str,
    broker: RedisServer,
    tmp_path: Path,
) -> None:
    # Nothing listens on the seed: building the client (it asks the seed for the slot table)
    # is the store call that fails, before any lease command.
    dead_seed = f"redis://127.0.0.1:{free_port()}/0"
    rig = Rig(broker, "solo", tmp_path)
    try:
        worker = rig.worker(
            LEASE_BACKEND=dead_seed,
            LEASE_ON_STORE_ERROR=policy,
            LEASE_BACKEND_OPTIONS=json.dumps({"cluster": True}),
            LEASE_STORE_OUTAGE_MAX="2.0",
        )
        tag = f"dead-seed-{policy}"
        result = rig.send("hold", tag, 0.1)
        with pytest.raises(LeaseStoreUnavailable, match="no Redis Cluster node answered"):
            result.get(timeout=60)
        assert rig.journal(tag) == []  # the body never ran
        retried = f"Task hold[{result.id}] retry"
        if policy == "retry":  # it waits the outage out for lease_store_outage_max, then fails
            assert worker.log_text().count(retried) >= 2, worker.log_text()[-3000:]
            assert "the lease store has not answered for" in worker.log_text()
        else:
            assert retried not in worker.log_text()
    finally:
        rig.close()


def test_hold_and_a_beat_leader_treat_a_cluster_client_that_cannot_be_built_as_a_store_error(
    broker: RedisServer,
) -> None:
    dead_seed = f"redis://127.0.0.1:{free_port()}/0"
    app = Celery("dead_seed", broker=broker.url(), set_as_current=False)
    app.conf.update(lease_backend=dead_seed, lease_backend_options={"cluster": True})
    ran = []
    with pytest.raises(LeaseStoreUnavailable, match="no Redis Cluster node answered"):
        with hold("dead-seed", app=app):
            ran.append(True)
    assert ran == []
    options = resolve_options(app.conf, {}, "beat")
    leader = BeatLeader(app, "lease:{beat:dead-seed}", options, dead_seed)
    leading, wait = leader.poll()
    assert not leading and wait == pytest.approx(options.renew_interval, abs=0.5)  # asks later
    assert not leader.is_leader


@pytest.mark.parametrize("victim_is", ["the seed node", "another primary"])
def test_doctor_reports_a_dead_primary_as_a_failure_and_checks_the_rest(victim_is: str) -> None:
    partial = {"cluster-require-full-coverage": "no"}  # the other primaries keep serving
    with cluster_setup(replicas=0, options=partial) as cluster:
        url = seed_url(cluster)
        app = Celery("doctor_dead_primary", broker=url, set_as_current=False)
        app.conf.update(lease_backend=url, lease_backend_options={"cluster": True})
        seed = cluster.live()[0]
        victim = seed if victim_is == "the seed node" else cluster.primaries()[-1]
        assert victim_is == "the seed node" or victim is not seed
        connection.client_for(url, 1.0, {"cluster": True})  # this process has seen the nodes
        victim.kill()
        done = CliRunner().invoke(lease, ["doctor"], obj=SimpleNamespace(app=app))
        assert done.exception is None or isinstance(done.exception, SystemExit), done.output
        assert done.exit_code == 1, done.output
        lines = done.output.splitlines()
        failed = [line for line in lines if line.startswith("FAIL")]
        assert any(
            f"cluster node {victim.address}" in line and "Error 111" in line for line in failed
        ), done.output
        survivors = sorted(n.address for n in cluster.primaries() if n is not victim)
        assert any(
            line.startswith("INFO")
            and "cluster, TLS off" in line
            and all(s in line for s in survivors)
            for line in lines
        ), done.output
        assert any(line.startswith("OK") and "latency median" in line for line in lines), (
            done.output
        )


def test_a_lease_whose_slot_no_node_serves_fails_its_renewals_alone() -> None:
    ttl = 3.0
    partial = {"cluster-require-full-coverage": "no"}  # the other slots keep being served
    with cluster_setup(replicas=0, options=partial) as cluster, holders(cluster, ttl) as h:
        url = seed_url(cluster)
        for n in (1, 2):
            assert h.start(n).error is None
        client = connection.client_for(url, 0.4, {"cluster": True})  # the holders' client
        orphan, other = h.key_of(1), h.key_of(2)
        slot = client.keyslot(orphan)
        assert client.keyslot(other) != slot
        for node in cluster.live():  # no node serves the slot any more
            with node.client() as plain:
                plain.execute_command("CLUSTER", "DELSLOTS", slot)
        client.nodes_manager.initialize()  # as after any redirection: the slot is left out
        with pytest.raises(SlotNotCoveredError):
            client.nodes_manager.get_node_from_slot(slot)
        since = time.monotonic()
        # The orphan's renewals fail (retried) until its deadline; the other lease renews on.
        wait_for(
            lambda: h.running(1) is None,
            ttl + 5,
            message=lambda: f"the orphaned lease was never lost: {h.errors[-3:]}",
        )
        run = next(r for r in h.runs if r.n == 1)
        assert run.lost is not None and run.lost.cause == "store_error", run.lost
        assert sum(1 for key, _ in h.failed if key == orphan) >= 2  # retried, not given up
        assert any(f"slot {slot} is served by no cluster node" in e for e in h.errors), h.errors
        assert h.renewals_of(other, since) >= 2 and h.running(2) is not None
        # A new lease in that slot is a store error (lease_on_store_error), the body never runs;
        # a new client (another process, another timeout) is built for the slots still served.
        again = h.start(1)
        assert again.done.wait(5) and isinstance(again.error, LeaseStoreUnavailable), again.error
        assert h.running(1) is None
        fresh = connection.client_for(url, 0.7, {"cluster": True})
        served = next(h.key_of(n) for n in range(3, 100) if fresh.keyslot(h.key_of(n)) != slot)
        assert store.acquire(fresh, served, TOKEN, 5_000, "{}").granted


@pytest.mark.parametrize("how", ["FAILOVER", "FAILOVER TAKEOVER"])
def test_a_holder_never_believes_in_a_lease_its_new_primary_does_not_hold(
    cluster: ClusterSetup,
    how: str,
) -> None:
    # A replica promoted with CLUSTER FAILOVER (coordinated with its primary) or TAKEOVER
    # (without it: the old primary learns of it only from the cluster bus).
    ttl = 6.0
    client = connection.client_for(seed_url(cluster), 1.0, {"cluster": True})
    with Holders(
        lease_backend=seed_url(cluster),
        lease_backend_options={"cluster": True},
        lease_ttl=ttl,
        lease_renew_interval=ttl / 3,
        lease_store_timeout=0.4,
    ) as h:
        assert h.start(1).error is None
        run = h.running(1)
        assert run is not None
        slot = client.keyslot(run.key)
        old = cluster.owner(slot)
        replica = next(
            n
            for n in cluster.replica_nodes()
            if n.info("replication").get("master_port") == old.port
        )

        def on_replica() -> bool:
            with replica.client() as node:
                node.execute_command("READONLY")  # a replica answers MOVED otherwise
                return node.get(run.key) is not None

        wait_for(on_replica, 5, message="the grant never reached the replica")
        with replica.client() as node:
            node.execute_command(f"CLUSTER {how}")
        wait_for(lambda: cluster.owner_seen(slot) is replica, 10, message="no failover")
        watched_until = time.monotonic() + 1.5 * ttl
        while time.monotonic() < watched_until:
            believed = run.lost is None and run.ended is None
            holder = holder_on_owner(cluster, client, run.key)
            if believed and run.lost is None and run.ended is None:
                assert holder is not None and holder.token == run.token, (
                    f"holder believes, the slot's owner has {holder}; errors: {h.errors[-3:]}"
                )
            time.sleep(0.05)
        h.stop()
