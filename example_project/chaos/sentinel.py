"""The lease store of ``--sentinel``: one primary, one replica, three sentinels, and failovers.

:class:`SentinelStore` answers the nemesis and the campaign as the single lease Redis does
(``pause``/``resume``, ``client``, ``close``), always on the primary the sentinels name at
that moment, and adds :meth:`SentinelStore.failover`. The workers reach it as a Celery user
would: ``lease_backend = "sentinel://...;sentinel://.../0"`` with
``lease_backend_options = {"master_name": ...}`` (docs/deploying.md, "Sentinel"), so there is
no proxy in front of it: a client follows the primary the sentinels name.
"""

from __future__ import annotations

import os
import random
import signal
from typing import Any

import redis

from .infra import MASTER_NAME, SentinelSetup

__all__ = ["DOWN_AFTER_MS", "SentinelStore"]

#: ``down-after-milliseconds`` of the sentinels: a failover after a crash takes about this
#: plus one election (1.5 to 2.5 s on loopback), below the campaign's default TTL of 3 s.
DOWN_AFTER_MS = 1000


class SentinelStore:
    """A started Sentinel set-up (:class:`~example_project.chaos.infra.SentinelSetup`).

    Raises:
        AssertionError: the sentinels did not agree on the set-up within 15 s.
    """

    def __init__(self) -> None:
        self.setup = SentinelSetup(down_after_ms=DOWN_AFTER_MS).start()
        self._paused_pid: int | None = None

    @property
    def url(self) -> str:
        """The ``lease_backend`` of the workers: every sentinel, database 0."""
        return self.setup.sentinel_url

    @property
    def options(self) -> dict[str, Any]:
        """The ``lease_backend_options`` of the workers."""
        return {"master_name": MASTER_NAME}

    @property
    def ports(self) -> list[int]:
        """The ports of the data nodes (either may be the primary)."""
        return [node.port for node in self.setup.data]

    @property
    def port(self) -> int:
        """The port of the primary the sentinels name now."""
        return self.setup.primary_port()

    @property
    def paused(self) -> bool:
        """True while :meth:`pause` holds a data node stopped."""
        return self._paused_pid is not None

    def client(self, **kwargs: Any) -> redis.Redis:
        """A client of the primary the sentinels name now (no retries)."""
        return self.setup.primary().client(**kwargs)

    def pause(self) -> None:
        """SIGSTOP the primary. Held past ``down-after-milliseconds``, the sentinels fail
        it over, and on :meth:`resume` it comes back a primary until they demote it."""
        pid = self.setup.primary().pid
        if pid is None:
            raise RuntimeError("the primary is not running")
        os.kill(pid, signal.SIGSTOP)
        self._paused_pid = pid

    def resume(self) -> None:
        """SIGCONT the node :meth:`pause` stopped."""
        pid, self._paused_pid = self._paused_pid, None
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def failover(self, rng: random.Random) -> str:
        """One failover, drawn from ``rng``: ``SENTINEL FAILOVER`` (a planned hand-over), or a
        SIGKILL of the primary, the sentinels' failover, and the old primary restarted empty as
        a replica of the new one. Returns what happened; waits until the set-up is whole again.

        Raises:
            AssertionError: no failover, or the set-up not whole again, within 20 s.
            redis.RedisError: a sentinel refused ``SENTINEL FAILOVER`` (e.g. one in progress).
        """
        old = self.setup.primary_port()
        if rng.random() < 0.5:
            with self.setup.sentinels[0].client(socket_timeout=2) as client:
                client.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
            new = self.setup.wait_failover(old)
            self.setup.wait_ready(new, timeout=20)
            return f"SENTINEL FAILOVER: primary {old} -> {new}"
        node = self.setup.node_on(old)
        node.kill()
        new = self.setup.wait_failover(old)
        node.options["replicaof"] = f"127.0.0.1 {new}"  # comes back as a replica, empty
        node.start()
        self.setup.wait_ready(new, timeout=20)
        return f"SIGKILL of primary {old}; failover to {new}; {old} back as its replica"

    def close(self) -> None:
        """Resume a paused node, then stop every process."""
        self.resume()
        self.setup.close()
