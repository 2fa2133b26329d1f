"""Greenlets contending for one ``celery_lease.hold`` under gevent (monkey-patched).

``python -m tests.apps.hold_contend URL GREENLETS SECONDS`` prints one JSON line:
``{"entries": n, "overlaps": k, "rising": true}`` (rising: fencing tokens strictly increase
in the order the block was entered).
"""

from gevent import monkey

monkey.patch_all()

import itertools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402

from celery_lease import hold  # noqa: E402

URL, GREENLETS, SECONDS = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
inside = 0
overlaps = 0
fences: list[int] = []
deadline = time.monotonic() + SECONDS


def contend() -> None:
    global inside, overlaps
    while time.monotonic() < deadline:
        with hold("gevent-contended", url=URL, ttl=2.0, on_conflict="wait", timeout=10.0) as lease:
            inside += 1
            overlaps += inside > 1
            fences.append(lease.fencing_token)
            gevent.sleep(0.001)  # yield inside: another greenlet must not get in
            inside -= 1


gevent.joinall([gevent.spawn(contend) for _ in range(GREENLETS)], raise_error=True)
print(
    json.dumps(
        {
            "entries": len(fences),
            "overlaps": overlaps,
            "rising": all(a < b for a, b in itertools.pairwise(fences)),
        }
    )
)
