"""The lease store of ``--sentinel``: one primary, one replica, three sentinels, and failovers.

:class:`SentinelStore` answers the nemesis and the campaign as the single lease Redis does
(``pause``/``resume``, ``client``, ``close``), always on the primary the sentinels name at
that moment, and adds :meth:`SentinelStore.failover`. The workers reach it as a Celery user
would: ``lease_backend = "sentinel://...;sentinel://.../0"`` with
``lease_backend_options = {"master_name": ...}`` (docs/deploying/sentinel.md), so there is
no proxy in front of it: a client follows the primary the sentinels name.
"""

from __future__ import annotations

import os
import random
import signal
import time
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
        self._paused_primary: tuple[int, bool, float] | None = None  # port, in sync, since
        self._lossy = False

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
        self._paused_primary = (
            self.setup.primary_port(),
            self._replica_in_sync(),
            time.monotonic(),
        )
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
        paused, self._paused_primary = self._paused_primary, None
        if paused is not None and not paused[1]:  # failed over while held, to a stale node?
            held_ms = (time.monotonic() - paused[2]) * 1000
            try:
                moved = self.setup.primary_port() != paused[0]
            except (AssertionError, redis.RedisError):
                moved = True  # no sentinel could say: assume the worst
            self._lossy |= moved or held_ms >= DOWN_AFTER_MS  # an election may still end
        if paused is not None and pid is not None:
            self._settle(paused[0], (time.monotonic() - paused[2]) * 1000 >= DOWN_AFTER_MS)

    def _settle(self, paused_port: int, long: bool) -> None:
        """After a pause: once the sentinels failed the node over (or were about to: a pause
        ``long`` past ``down-after-milliseconds`` may end during their election), wait until
        the set-up is whole again (the old primary demoted and in sync), as :meth:`failover`
        does, so that the next fault does not promote a node still behind: a cascade no
        Redis replication survives without ``WAIT`` (``lease_min_replicas``)."""
        started = time.monotonic()
        deadline = started + 20
        while time.monotonic() < deadline:
            try:
                primary = self.setup.primary_port()
                electing = long and time.monotonic() - started < 3.0
                if primary == paused_port and self._replica_in_sync() and not electing:
                    return  # no failover: nothing to wait for
                if primary != paused_port:
                    self.setup.wait_ready(primary, timeout=max(deadline - time.monotonic(), 1))
                    return
            except (AssertionError, redis.RedisError):
                pass
            time.sleep(0.1)

    def pop_lossy(self) -> bool:
        """True (once) when a fault since the last call let the sentinels promote a node that
        was not in sync with the primary: the writes the primary answered since are lost."""
        lossy, self._lossy = self._lossy, False
        return lossy

    def _replica_in_sync(self) -> bool:
        """Whether the node a failover would promote now replicates the primary the sentinels
        name, its link up and no sync in progress (an old primary that a failover has not
        demoted yet, or a replica restarted empty still loading, is not)."""
        primary = self.setup.primary_port()
        for node in self.setup.data:
            if node.port == primary or node.pid is None:
                continue
            try:
                info = node.info("replication")
            except redis.RedisError:
                return False
            return (
                info.get("role") == "slave"
                and int(info.get("master_port", 0)) == primary
                and info.get("master_link_status") == "up"
                and int(info.get("master_sync_in_progress", 0)) == 0
            )
        return False

    def failover(self, rng: random.Random) -> str:
        """One failover, drawn from ``rng``: ``SENTINEL FAILOVER`` (a planned hand-over), or a
        SIGKILL of the primary, the sentinels' failover, and the old primary restarted empty as
        a replica of the new one. Returns what happened; waits until the set-up is whole again.

        Raises:
            AssertionError: no failover, or the set-up not whole again, within 20 s.
            redis.RedisError: a sentinel refused ``SENTINEL FAILOVER`` (e.g. one in progress).
        """
        old = self.setup.primary_port()
        self._lossy |= not self._replica_in_sync()
        if rng.random() < 0.5:
            with self.setup.sentinels[0].client(socket_timeout=2) as client:
                client.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
            new = self.setup.wait_failover(old)
            self.setup.wait_ready(new, timeout=20)
            return f"SENTINEL FAILOVER: primary {old} -> {new}"
        node = self.setup.node_on(old)
        node.kill()
        new = self.setup.wait_failover(old)
        node.options["replicaof"] = ["127.0.0.1", str(new)]  # comes back as a replica, empty
        node.start()
        self.setup.wait_ready(new, timeout=20)
        return f"SIGKILL of primary {old}; failover to {new}; {old} back as its replica"

    def close(self) -> None:
        """Resume a paused node, then stop every process."""
        self.resume()
        self.setup.close()
