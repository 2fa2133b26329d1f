"""Coalesce and queue on Redis Cluster: every key of a line lives under its lease's hash tag
(one slot per lease, leases spread over the primaries); the sweep's index has a slot of its
own, and a sweep pass finds a dead holder's waiting run across nodes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from celery import Celery

from celery_lease import store
from celery_lease.base.keys import handoff_index_key, line_key, reservation_key
from celery_lease.ops import inspection
from celery_lease.ops.sweep import sweep_once
from celery_lease.settings.config import resolve_options
from celery_lease.store import handoff as stored
from harness.topologies import ClusterSetup, cluster_setup

MESSAGE = '{"task": "t", "args": [], "kwargs": {}, "options": {}}'


@pytest.fixture
def cluster() -> Iterator[ClusterSetup]:
    with cluster_setup() as setup:
        yield setup


def test_lines_hand_over_on_every_primary_and_the_sweep_finds_them_from_its_own_slot(
    cluster: ClusterSetup,
) -> None:
    client = store.client_for(
        f"redis://127.0.0.1:{cluster.live()[0].port}/0", 2.0, {"cluster": True}
    )
    keys = [f"lease:{{ho.job:{n}}}" for n in range(12)]
    assert len({client.keyslot(k) for k in keys}) == 12
    assert {client.keyslot(line_key(k)) for k in keys[:1]} == {client.keyslot(keys[0])}
    assert client.keyslot(reservation_key(keys[0])) == client.keyslot(keys[0])
    tokens = {}
    for key in keys:
        tokens[key] = uuid.uuid4().hex
        assert store.acquire(client, key, tokens[key], 5000, "{}").granted
        stored.watch(client, "lease", key, 0)
        assert (
            stored.park(client, key, "queue", f"run-{key}", MESSAGE, 10, 60_000).outcome == "parked"
        )
    listed = {i.key: i.waiting for i in inspection.scan_leases(client, "lease")}
    assert listed == dict.fromkeys(keys, 1)
    # Half the holders release (handing over); the other half die (their leases deleted).
    for key in keys[:6]:
        handed = stored.release_handing_over(client, key, tokens[key], 5000, 60_000, 0).handed
        assert handed is not None and handed.task_id == f"run-{key}"
    for key in keys[6:]:
        client.delete(key)
    app = Celery("cluster-sweep", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = False
    options = resolve_options(
        {"lease_backend": "redis://x"}, {"lease_on_conflict": "queue"}, "test"
    )
    published = sweep_once(app, client, "lease", {"t": options})
    assert published == 6  # the dead holders' waiters; the released ones are reserved
    assert client.exists(handoff_index_key("lease")) == 1
    for key in keys:
        assert client.hget(reservation_key(key), "id") == f"run-{key}".encode()
