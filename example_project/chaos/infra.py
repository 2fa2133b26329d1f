"""The process helpers the campaign uses, imported from one place.

The repository's harness (``harness/``, shared with the test suite, the benchmarks and the
demo) starts real processes exactly as the campaign needs: a private ``redis-server`` that can
be paused or restarted empty, a loopback TCP proxy that can black-hole traffic, and
``celery worker`` subprocesses in their own process groups. It exists in a checkout (the
campaign runs from one), not in the wheel; this module is the only place the campaign imports
it from. The Sentinel set-up of ``--sentinel`` (one primary, one replica, three sentinels,
started with mirakuru) is the harness's, the one the test suite uses too.
"""

from __future__ import annotations

from harness.proxy import TcpProxy
from harness.redis_server import RedisServer, free_port
from harness.topologies import MASTER_NAME, SentinelSetup
from harness.waiting import wait_for
from harness.workers import CeleryProcess, CeleryWorker

__all__ = [
    "MASTER_NAME",
    "CeleryProcess",
    "CeleryWorker",
    "RedisServer",
    "SentinelSetup",
    "TcpProxy",
    "free_port",
    "wait_for",
]
