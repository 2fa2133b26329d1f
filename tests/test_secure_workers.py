"""Real workers against a TLS store and a store whose user has exactly the documented ACL.

The broker is a plain server; only the lease store is secured, so the tests can pause and
empty it (as the admin) without touching the broker or the journal the tasks write to.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_lease import store
from celery_lease.store import permissions
from harness.topologies import MASTER_NAME
from tests.support.holders import Holders
from tests.support.redis_server import HOST, RedisServer
from tests.support.rig import MODE, POOLS, Rig
from tests.support.secure import (
    AclRedisServer,
    Certificates,
    TlsRedisServer,
    TlsSentinelSetup,
    certificates,
    lease_acl,
)
from tests.support.waiting import wait_for
from tests.support.workers import CeleryWorker

certs = pytest.fixture(scope="module", name="certs")(certificates)

#: The documented rule and the hand-over's commands: the test app has a task with
#: lease_on_conflict="retry", whose copies wait in the key's line.
APP_FEATURES = (*permissions.DEFAULT_FEATURES, "handoff")


class SecureRig(Rig):
    """A :class:`Rig` whose lease store is ``server``, reached as ``url`` with ``options``."""

    def __init__(
        self,
        broker: RedisServer,
        pool: str,
        log_dir: Path,
        server: RedisServer,
        url: str,
        options: dict[str, str] | None = None,
    ) -> None:
        super().__init__(broker, pool, log_dir)
        self.store.close()
        self.store = server.start()
        self.leases = self.store.client()
        self.url, self.options = url if "://" in url else "", options

    def env(self, **extra: str) -> dict[str, str]:
        env = super().env(
            LEASE_BACKEND=self.url or self.store.url(),
            LEASE_BACKEND_OPTIONS=json.dumps(self.options),
        )
        return {**env, **extra}


def hold_and_finish(rig: Rig, tag: str) -> None:
    rig.send("hold", tag, 0.3, "sleep")
    rig.wait_event(tag, "end", timeout=30)
    wait_for(lambda: rig.lease_keys() == [], 5, message="lease left after the run")


def paused_store_raises_by_the_deadline(rig: Rig, tag: str) -> None:
    rig.send("hold", tag, 30.0, MODE.get(rig.pool, "sleep"))
    rig.wait_event(tag, "start", timeout=30)
    rig.store.pause()
    try:
        lost = rig.wait_event(tag, "lost", timeout=15)[0]
    finally:
        rig.store.resume()
    assert lost["cause"] == "deadline"
    assert 0 <= lost["at"] - lost["deadline"] < 0.25


# Under the minimal ACL every pool runs the fault tests whose store commands differ: acquire
# (with the scripts flushed), renewal refused, a lost lease's release that must leave another
# holder's key alone, renewals failing to the deadline. The rest of tests/test_faults.py
# (killed holder, stray signals, duplicates) sends no command the ACL could deny.
@pytest.fixture(scope="module", params=POOLS)
def acl_rig(
    request: pytest.FixtureRequest, broker: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rig]:
    server = AclRedisServer(features=APP_FEATURES)
    rig = SecureRig(
        broker, request.param, tmp_path_factory.mktemp(f"acl-{request.param}"), server, ""
    )
    rig.url = server.lease_url()
    rig.worker()
    yield rig
    rig.close()


def test_minimal_acl_user_runs_a_leased_task(acl_rig: Rig) -> None:
    acl_rig.reset()
    acl_rig.leases.script_flush()  # as after a restart: the scripts come back by EVAL alone
    hold_and_finish(acl_rig, "acl-run")


def test_minimal_acl_user_learns_of_a_refused_renewal(acl_rig: Rig) -> None:
    acl_rig.reset()
    acl_rig.send("hold", "acl-refused", 30.0, MODE.get(acl_rig.pool, "sleep"))
    start = acl_rig.wait_event("acl-refused", "start", timeout=30)[0]
    acl_rig.leases.delete(str(start["key"]))
    assert acl_rig.wait_event("acl-refused", "lost")[0]["cause"] == "refused"


def test_minimal_acl_user_leaves_an_overwritten_key_alone(acl_rig: Rig) -> None:
    acl_rig.reset()
    acl_rig.send("hold", "acl-overwritten", 30.0, MODE.get(acl_rig.pool, "sleep"))
    key = str(acl_rig.wait_event("acl-overwritten", "start", timeout=30)[0]["key"])
    acl_rig.leases.set(key, "someone-else:1:{}", px=60_000)
    assert acl_rig.wait_event("acl-overwritten", "lost")[0]["cause"] == "refused"
    wait_for(
        lambda: (
            acl_rig.journal("acl-overwritten", "end") == []
            and acl_rig.leases.get(key) == b"someone-else:1:{}"
        ),
        5,
    )
    assert 50_000 < acl_rig.leases.pttl(key) <= 60_000  # not renewed, not deleted


def test_minimal_acl_user_paused_store_raises_by_the_local_deadline(acl_rig: Rig) -> None:
    acl_rig.reset()
    paused_store_raises_by_the_deadline(acl_rig, "acl-paused")


def test_a_worker_whose_user_lacks_one_command_of_the_rule_refuses_to_start_naming_it(
    acl_rig: Rig,
) -> None:
    if acl_rig.pool != "solo":
        pytest.skip("the start check runs before any pool: one pool shows it")
    with acl_rig.store.client() as admin:
        admin.execute_command(
            "ACL",
            "SETUSER",
            *[r for r in lease_acl("noset", "pw", features=APP_FEATURES) if r != "+set"],
        )
    line = refusal(acl_rig, "no-set", f"redis://noset:pw@{HOST}:{acl_rig.store.port}/0", {})
    assert "may not run +set" in line and "celery lease acl" in line and ":pw@" not in line


@pytest.fixture(scope="module")
def tls_rig(
    broker: RedisServer, certs: Certificates, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rig]:
    server = TlsRedisServer(certs, mutual=True)
    options = {
        "ssl_ca_certs": certs.ca_file,
        "ssl_certfile": certs.client_cert,
        "ssl_keyfile": certs.client_key,
    }
    rig = SecureRig(broker, "solo", tmp_path_factory.mktemp("tls"), server, "", options)
    # Options the lease client overrides: neither may delay LeaseLost past the deadline.
    rig.url = f"{server.url()}?retry_on_timeout=true&health_check_interval=30"
    rig.worker()
    yield rig
    rig.close()


def test_mutual_tls_worker_runs_a_leased_task(tls_rig: Rig) -> None:
    tls_rig.reset()
    hold_and_finish(tls_rig, "tls-run")


def test_mutual_tls_paused_store_raises_by_the_deadline_despite_url_options(tls_rig: Rig) -> None:
    tls_rig.reset()
    paused_store_raises_by_the_deadline(tls_rig, "tls-paused")


def refusal(rig: Rig, name: str, url: str, options: dict[str, str]) -> str:
    """The one line a worker given ``url`` and ``options`` exits with, refusing to start."""
    env = rig.env(LEASE_BACKEND=url, LEASE_BACKEND_OPTIONS=json.dumps(options))
    refused = CeleryWorker(
        "tests.apps.lease_app",
        pool="solo",
        concurrency=1,
        queue=f"{rig.queue}-{name}",
        env=env,
        log_dir=rig.log_dir,
    ).start()
    try:
        assert refused.wait(60) is not None, f"the worker started ({name})"
        lines = [
            line
            for line in refused.log_text().splitlines()
            if line.startswith("Error: celery-lease refused to start this worker")
        ]
        assert len(lines) == 1, refused.log_text()
        return lines[0]
    finally:
        refused.kill()


def test_worker_with_the_wrong_ca_refuses_to_start_naming_the_setting(
    tls_rig: Rig, certs: Certificates
) -> None:
    line = refusal(tls_rig, "wrong-ca", tls_rig.url, {"ssl_ca_certs": certs.other_ca_file})
    assert "ssl_ca_certs" in line and "certificate verify failed" in line
    assert "unreachable" not in line


def test_worker_facing_an_expired_server_certificate_refuses_to_start_naming_it(
    tls_rig: Rig, certs: Certificates
) -> None:
    with TlsRedisServer(certs, expired=True) as expired:
        line = refusal(tls_rig, "expired-server", expired.url(), {"ssl_ca_certs": certs.ca_file})
    assert "certificate has expired" in line
    assert "renew the certificate the server presents (its tls-cert-file)" in line


def test_worker_with_an_expired_client_certificate_refuses_to_start_naming_the_setting(
    tls_rig: Rig, certs: Certificates
) -> None:
    line = refusal(
        tls_rig,
        "expired-client",
        tls_rig.url,
        {
            "ssl_ca_certs": certs.ca_file,
            "ssl_certfile": certs.expired_client_cert,
            "ssl_keyfile": certs.expired_client_key,
        },
    )
    # The server's refusal reaches the client as an "alert certificate expired" (named as such)
    # or, when it closes first, as an EOF during the handshake: both name ssl_certfile.
    assert "ssl_certfile" in line and "client certificate" in line


def test_a_lease_is_taken_through_a_sentinel_reached_over_tls(certs: Certificates) -> None:
    with TlsSentinelSetup(certs) as setup:
        setup.start()
        tls = {"ssl_ca_certs": certs.ca_file}
        with Holders(
            lease_backend=setup.sentinel_url,
            lease_backend_options={"master_name": MASTER_NAME, **tls, "sentinel_kwargs": tls},
            lease_ttl=3.0,
            lease_renew_interval=0.5,
        ) as h:
            outcome = h.start(1)
            assert outcome.error is None, outcome.error
            run = h.running(1)
            assert run is not None
            with setup.admin() as admin:
                raw = admin.get(run.key)
            assert raw is not None and store.parse_value(raw).token == run.token
            wait_for(
                lambda: h.renewals_of(run.key, run.started) >= 1,
                5,
                message=lambda: f"no renewal over TLS: {h.errors[-3:]}",
            )
            h.stop()
            assert outcome.error is None and run.lost is None
        with setup.admin() as admin:
            assert admin.get(run.key) is None  # released through the same TLS path
