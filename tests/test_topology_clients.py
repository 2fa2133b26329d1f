"""The lease client for Sentinel and Cluster, built from Celery-style settings, on real set-ups:
the library's own timeouts, `describe_topology` and a `SCAN` over every primary.

(Failover and resharding behaviour of the leases themselves: tests/test_sentinel.py and
tests/test_cluster.py.)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from celery_lease import store
from celery_lease.store import connection, topology
from harness.topologies import MASTER_NAME, ClusterSetup, SentinelSetup

HOLDER = store.holder_json("t.job", "task-1", "host", 42)


@pytest.fixture(scope="module")
def sentinel_setup() -> Iterator[SentinelSetup]:
    with SentinelSetup().start() as setup:
        yield setup


@pytest.fixture(scope="module")
def cluster_setup() -> Iterator[ClusterSetup]:
    with ClusterSetup(replicas=1).start() as setup:
        yield setup


def test_sentinel_url_and_master_name_give_a_client_of_the_primary(
    sentinel_setup: SentinelSetup,
) -> None:
    client = store.client_for(sentinel_setup.sentinel_url, 0.5, {"master_name": MASTER_NAME})
    key, token = "lease:{sentinel-client}", uuid.uuid4().hex
    assert store.acquire(client, key, token, 5000, HOLDER).granted
    assert sentinel_setup.primary().client().exists(key) == 1
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 0.5 and kwargs["socket_connect_timeout"] == 0.5
    assert connection.retries_of(kwargs["retry"]) == 0
    layout = topology.describe_topology(client)
    assert layout.kind == "sentinel"
    assert layout.primaries == (sentinel_setup.primary().address,)
    assert layout.replicas == tuple(n.address for n in sentinel_setup.data[1:])
    assert store.release(client, key, token)


def test_cluster_option_gives_a_cluster_client_and_scan_covers_every_primary(
    cluster_setup: ClusterSetup,
) -> None:
    seed = cluster_setup.primaries()[0]
    client = store.client_for(f"redis://{seed.address}", 0.5, {"cluster": True})
    keys = [f"lease:{{spread-{i}}}" for i in range(60)]
    for key in keys:
        assert store.acquire(client, key, uuid.uuid4().hex, 5000, HOLDER).granted
    owners = {client.get_node_from_key(key).name for key in keys}
    assert len(owners) == 3  # the keys really are spread over the three primaries
    found = {k.decode() for k in topology.scan(client, "lease:{spread-*", 10, "STRING")}
    assert found == set(keys) | {k + ":fence" for k in keys}
    layout = topology.describe_topology(client)
    assert layout.kind == "cluster"
    assert sorted(layout.primaries) == sorted(n.address for n in cluster_setup.primaries())
    assert sorted(layout.replicas) == sorted(n.address for n in cluster_setup.replica_nodes())
    assert layout.eviction_policy == "noeviction"
    node_kwargs = client.get_redis_connection(
        client.get_primaries()[0]
    ).connection_pool.connection_kwargs
    assert node_kwargs["socket_timeout"] == 0.5 and node_kwargs["decode_responses"] is False
