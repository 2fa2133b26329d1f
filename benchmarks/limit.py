"""``python -m benchmarks.limit [--before PATH] [--rounds R] [--cycles C]``: what ``lease_limit``
costs.

- **N = 1 before and after**: a plain acquire, a plain release, and one eager ``apply()`` of a
  leased task (the whole take and end an execution does), timed by the celery-lease at
  ``--before`` (default ``/work/main``, the code without ``lease_limit``) and by this tree's,
  in alternating child processes against one private redis-server (same run, same machine
  state); each round's median per variant, the spread over rounds;
- **N = 10 with 9 held**: one more slot taken (``acquire_slot``) and released
  (``release_slot``) while nine other slots are held, next to the plain acquire and release of
  the same run.

Latencies are microseconds per call (``perf_counter_ns``), one connection, sequential calls.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import REPO_ROOT
from harness.redis_server import RedisServer

from ._infra import spread

#: The child's timing loop: prints {"variant": median microseconds, ...}. It uses only what
#: both trees have, and the slot calls only when asked (``slots``).
_CHILD = r"""
import json, os, sys, time
from celery import Celery
from celery_lease import LeasedTask, store
url, cycles, slots = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
client = store.client_for(url, 5.0)
holder = store.holder_json("bench.limit", "task-id", "host", 1)
app = Celery("bench", set_as_current=False)
app.conf.update(lease_backend=url, task_always_eager=True, lease_ttl=30.0)
def noop():
    return None
task = app.task(shared=False, base=LeasedTask, name="bench.limit.noop")(noop)
app.finalize()
clock = time.perf_counter_ns
def median(values):
    return sorted(values)[len(values) // 2]
def timed(fn, n):
    out = []
    for i in range(n):
        t = clock(); fn(i); out.append((clock() - t) / 1000.0)
    return median(out)
tokens = [os.urandom(16).hex() for _ in range(cycles)]
def acquire(i):
    assert store.acquire(client, f"bench:limit:{i}", tokens[i], 30000, holder).granted
def release(i):
    assert store.release(client, f"bench:limit:{i}", tokens[i])
for _ in range(2):  # warm-up: scripts, imports, the connection
    acquire(0); release(0); task.apply()
result = {}
for name, fn in (("plain_acquire", acquire), ("plain_release", release)):
    result[name] = timed(fn, cycles)
result["task_apply"] = timed(lambda i: task.apply(), cycles // 4)
if slots:
    key = "bench:limit:{slots}"
    held = [os.urandom(16).hex() for _ in range(9)]
    for t in held:
        assert store.acquire_slot(client, key, t, 600000, holder, limit=10).granted
    take = lambda i: store.acquire_slot(client, key, tokens[i], 30000, holder, limit=10)
    give = lambda i: store.release_slot(client, key, tokens[i])
    for i in range(2):
        assert take(i).granted; give(i)
    a, r = [], []
    for i in range(cycles):
        t = clock(); got = take(i); a.append((clock() - t) / 1000.0)
        assert got.granted
        t = clock(); give(i); r.append((clock() - t) / 1000.0)
    result["slot_acquire_n10_9_held"] = median(a)
    result["slot_release_n10_9_held"] = median(r)
    for t in held:
        store.release_slot(client, key, t)
print(json.dumps(result))
"""


def _child(tree: Path, url: str, cycles: int, slots: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, url, str(cycles), "1" if slots else "0"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tree,
    )
    if done.returncode:
        raise RuntimeError(f"the timing child in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def run(before: Path, rounds: int, cycles: int) -> dict[str, Any]:
    """Alternate the two trees for ``rounds`` rounds of ``cycles`` calls per variant."""
    server = RedisServer().start()
    try:
        url = server.url(0)
        medians: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
        for r in range(rounds):
            order = [("before", before), ("after", REPO_ROOT)]
            for label, tree in order if r % 2 == 0 else order[::-1]:
                got = _child(tree, url, cycles, label == "after")
                for name, value in got.items():
                    medians[label].setdefault(name, []).append(value)
    finally:
        server.close()
    out: dict[str, Any] = {"rounds": rounds, "cycles": cycles, "unit": "us", "before": str(before)}
    for label, found in medians.items():
        out[label] = {name: spread(values) for name, values in found.items()}
    out["after_over_before"] = {
        name: spread(
            a / b for a, b in zip(medians["after"][name], medians["before"][name], strict=True)
        )
        for name in medians["before"]
    }
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print it as JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.limit", description=__doc__)
    parser.add_argument(
        "--before",
        type=Path,
        default=Path("/work/main"),
        help="a checkout of celery-lease without lease_limit",
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    result = run(args.before, args.rounds, args.cycles)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
