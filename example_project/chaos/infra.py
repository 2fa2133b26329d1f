"""The process helpers the campaign uses, imported from one place.

The test suite's helpers start real processes exactly as the campaign needs: a private
``redis-server`` that can be paused or restarted empty, a loopback TCP proxy that can
black-hole traffic, and ``celery worker`` subprocesses in their own process groups. They live
in ``tests/support`` (the repository root must be importable, as it is when the campaign runs
from a checkout); this module is the only place the campaign imports them from.
"""

from __future__ import annotations

from tests.support.proxy import TcpProxy
from tests.support.redis_server import RedisServer, free_port
from tests.support.waiting import wait_for
from tests.support.workers import CeleryWorker

__all__ = ["CeleryWorker", "RedisServer", "TcpProxy", "free_port", "wait_for"]
