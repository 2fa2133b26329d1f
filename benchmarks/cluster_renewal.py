"""``python -m benchmarks.cluster_renewal``: renewal round trips on a 3-primary Redis Cluster,
and the cost of ``lease_min_replicas=1`` per acquire.

1. A cluster of three primaries (no replicas) on loopback; for 1, 100 and 10 000 leases spread
   over every slot, one renewal pass (``store.renew_many``, what the heartbeat sends) is timed,
   and the writes each node's connection gets are counted: one write, then the replies read,
   is one round trip.
2. A primary with one replica (the Sentinel set-up of the tests): fresh grants with
   ``min_replicas=0`` and ``=1`` (the acquire script and ``WAIT 1`` in one pipeline),
   interleaved; the difference of the medians is what ``WAIT`` costs per acquire.

Standalone (about 20 s), not part of ``python -m benchmarks``; prints Markdown tables.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from typing import Any

from redis.connection import Connection

from celery_lease import store
from celery_lease.store import connection
from harness.topologies import cluster_setup, sentinel_setup

TOKEN = "b" * 32


class _WriteCounter:
    """Counts the commands written per server port (a pipeline is written in one call)."""

    def __init__(self) -> None:
        self.writes: Counter[int] = Counter()
        self._send = Connection.send_packed_command

    def __enter__(self) -> _WriteCounter:
        send, writes = self._send, self.writes

        def counted(conn: Connection, command: Any, check_health: bool = True) -> None:
            writes[conn.port] += 1
            send(conn, command, check_health)

        Connection.send_packed_command = counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Connection.send_packed_command = self._send  # type: ignore[method-assign]


def cluster_passes(sizes: tuple[int, ...], passes: int) -> list[dict[str, Any]]:
    rows = []
    with cluster_setup(replicas=0) as cluster:
        url = f"redis://127.0.0.1:{cluster.live()[0].port}/0"
        client = connection.client_for(url, 2.0, {"cluster": True})
        for size in sizes:
            leases = [(f"lease:{{bench:{size}:{i}}}", TOKEN, 60_000) for i in range(size)]
            pipe = client.pipeline(transaction=False)
            for key, token, ttl in leases:  # taken in bulk: the pass is what is measured
                pipe.set(key, f"{token}:1:{{}}", px=ttl)
            pipe.execute()
            store.renew_many(client, leases)  # warm: connections open, script loaded
            times, trips = [], []
            for _ in range(passes):
                with _WriteCounter() as counter:
                    started = time.perf_counter()
                    replies = store.renew_many(client, leases)
                    times.append(time.perf_counter() - started)
                assert replies == [1] * size, "a renewal was refused"
                trips.append(dict(counter.writes))
            nodes = {cluster.owner(client.keyslot(k)).port for k, _, _ in leases}
            rows.append(
                {
                    "leases": size,
                    "primaries_with_leases": len(nodes),
                    "round_trips_per_pass": statistics.median(sum(t.values()) for t in trips),
                    "max_round_trips_per_node": max(max(t.values()) for t in trips),
                    "pass_ms_median": statistics.median(times) * 1000,
                }
            )
    return rows


def wait_cost(cycles: int) -> dict[str, float]:
    with sentinel_setup() as setup:
        url = f"redis://127.0.0.1:{setup.primary_port()}/0"
        client = connection.client_for(url, 2.0)
        samples: dict[int, list[float]] = {0: [], 1: []}
        for i in range(cycles):
            for replicas in (0, 1):  # interleaved: machine noise hits both alike
                key = f"lease:{{wait:{replicas}:{i}}}"  # a fresh grant each time
                started = time.perf_counter()
                found = store.acquire(client, key, TOKEN, 10_000, "{}", min_replicas=replicas)
                samples[replicas].append(time.perf_counter() - started)
                assert found.granted
    plain, waited = (statistics.median(samples[n]) * 1e6 for n in (0, 1))
    return {
        "acquire_us": plain,
        "acquire_min_replicas_1_us": waited,
        "wait_cost_us": waited - plain,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--cycles", type=int, default=2000)
    args = parser.parse_args()
    rows = cluster_passes((1, 100, 10_000), args.passes)
    print(
        "| leases | primaries holding them | round trips per pass | most per node |"
        " pass time, median |"
    )
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['leases']} | {r['primaries_with_leases']} | "
            f"{r['round_trips_per_pass']:g} | {r['max_round_trips_per_node']} | "
            f"{r['pass_ms_median']:.2f} ms |"
        )
    cost = wait_cost(args.cycles)
    print()
    print("| acquire | median |")
    print("|---|---:|")
    print(f"| min_replicas=0 | {cost['acquire_us']:.0f} µs |")
    print(f"| min_replicas=1 (1 replica, loopback) | {cost['acquire_min_replicas_1_us']:.0f} µs |")
    print(f"| cost of WAIT | {cost['wait_cost_us']:.0f} µs |")


if __name__ == "__main__":
    main()
