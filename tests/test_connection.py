"""Building the lease store client: every URL spelling, TLS, ACL users, and URL safety.

Real servers throughout: throwaway ``redis-server`` processes on loopback ports, a TLS server
with trustme certificates, and a server whose lease user has exactly the documented ACL.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from celery_lease import LeaseConfigError, LeasedTask, store
from celery_lease.ops.worker import check_app
from celery_lease.settings.config import resolve_backend, resolve_options
from celery_lease.store import connection, topology
from celery_lease.store import errors as store_errors
from celery_lease.store import url as store_url
from tests.support.fixtures import RedisFactory
from tests.support.secure import (
    AclRedisServer,
    Certificates,
    SystemRedisServer,
    TlsRedisServer,
    certificates,
)
from tests.support.workers import BROKER_URL_ENV, QUEUE_ENV, RESULT_BACKEND_ENV
from tests.test_cli import celery_lease

certs = pytest.fixture(scope="module", name="certs")(certificates)

HOLDER = store.holder_json("t.job", "task-1", "host", 42)


def make_app(**conf: object) -> Celery:
    """An app with ``conf``, not finalized yet: finalizing binds every shared task (those of
    other test modules too) and validates their settings against ``conf``, which
    :func:`register` does inside the test's ``pytest.raises``."""
    app = Celery("conn", broker="memory://", set_as_current=False)
    app.conf.update(**conf)
    return app


def register(app: Celery, **options: object) -> LeasedTask:
    name = f"job-{uuid.uuid4().hex[:6]}"

    @app.task(base=LeasedTask, shared=False, name=name, **options)  # type: ignore[misc]
    def job() -> int:
        return 1

    app.finalize()
    return app.tasks[name]  # type: ignore[no-any-return]


def works(client: redis.Redis) -> bool:
    """A full lease cycle on ``client``: acquire, renew, release."""
    key, token = f"lease:{{{uuid.uuid4().hex}}}", uuid.uuid4().hex
    granted = store.acquire(client, key, token, 5000, HOLDER).granted
    return (
        granted
        and store.renew_many(client, [(key, token, 5000)]) == [1]
        and store.release(client, key, token)
    )


def assert_library_settings(client: redis.Redis, timeout: float) -> None:
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == timeout
    assert kwargs["socket_connect_timeout"] == timeout
    assert kwargs["decode_responses"] is False
    assert kwargs["health_check_interval"] == 0
    assert connection.retries_of(kwargs["retry"]) == 0


@pytest.fixture(scope="module")
def unix_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SystemRedisServer, str]]:
    sock = str(tmp_path_factory.mktemp("sock") / "redis.sock")
    server = SystemRedisServer(
        config={"unixsocket": sock, "unixsocketperm": "700", "requirepass": "sockpw"}
    ).start()
    yield server, sock
    server.close()


# -- URL spellings -------------------------------------------------------------------------


def test_unix_url_with_password_and_db_gives_a_working_client(unix_server: tuple) -> None:
    _, sock = unix_server
    client = store.client_for(f"unix://:sockpw@{sock}?db=0", 0.4)
    assert works(client)
    assert_library_settings(client, 0.4)
    assert "socket_keepalive" not in client.connection_pool.connection_kwargs


def test_kombu_redis_socket_spelling_is_translated(unix_server: tuple) -> None:
    _, sock = unix_server
    client = store.client_for(f"redis+socket://:sockpw@{sock}?virtual_host=3", 0.4)
    assert works(client)
    assert client.connection_pool.connection_kwargs["db"] == 3


def test_redis_socket_broker_url_is_the_fallback(unix_server: tuple) -> None:
    _, sock = unix_server
    app = make_app(broker_url=f"redis+socket://:sockpw@{sock}")
    task = register(app)
    options, url, _ = task.lease_settings()
    assert works(store.client_for(url, options.store_timeout))


def test_acl_credentials_in_the_url_reach_the_server(redis_url: str) -> None:
    server = AclRedisServer().start()
    try:
        assert works(store.client_for(server.lease_url(), 0.5))
    finally:
        server.close()


@pytest.mark.parametrize(
    "query",
    [
        "decode_responses=true",
        "retry_on_timeout=true",
        "health_check_interval=30",
        "socket_keepalive=false",
        "decode_responses=true&retry_on_timeout=yes&health_check_interval=5",
    ],
)
def test_query_options_that_would_weaken_the_client_are_overridden(
    redis_url: str, query: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "celery_lease"):
        client = store.client_for(f"{redis_url}?{query}", 0.3)
    assert works(client)  # decode_responses=true used to break every acquire with a TypeError
    assert_library_settings(client, 0.3)


@pytest.mark.parametrize("option", ["socket_timeout=30", "socket_connect_timeout=30"])
def test_timeouts_in_the_url_are_refused_at_registration(option: str) -> None:
    app = make_app(lease_backend=f"redis://127.0.0.1:6379/1?{option}")
    with pytest.raises(LeaseConfigError, match=r"lease_backend=.*lease_store_timeout"):
        register(app)


def test_timeouts_in_the_broker_fallback_are_refused_naming_lease_backend() -> None:
    app = make_app(broker_url="redis://127.0.0.1:6379/0?socket_timeout=30")
    with pytest.raises(LeaseConfigError, match=r"lease_backend \(unset, so broker_url\)"):
        register(app)


@pytest.mark.parametrize(
    ("url", "options", "match"),
    [
        ("redis://h:6379/0?ssl_cert_reqs=required", None, "use rediss://"),
        ("redis://h:6379/0", {"ssl_ca_certs": "/ca.pem"}, "use a rediss:// URL"),
        ("rediss://h:6379/0?ssl_cert_reqs=sometimes", None, "CERT_REQUIRED"),
        ("redis://h:6379/0?frobnicate=1", None, "unknown option 'frobnicate'"),
        ("redis://h:6379/x", None, "database '/x' is not a number"),
        ("sentinel://h:26379/0", None, "master_name"),
        ("redis://h:6379/0", {"master_name": "m"}, "only apply to sentinel"),
        ("redis+cluster://h:7000", None, r"\{'cluster': True\}"),
        ("redis://h:7000/2", {"cluster": True}, "only database 0"),
        ("unix:///tmp/r.sock", {"cluster": True}, "unix socket"),
        ("redis://h:6379/0", {"cluster": "yes"}, "True or False"),
        ("redis://h:6379/0", {"socket_timeout": 30}, "lease_store_timeout"),
        ("redis://h:6379/0", "ssl=1", "must be a dict"),
        ("redis://h:1;redis://h:2", None, "only for Sentinel"),
    ],
)
def test_unusable_configuration_is_refused_at_registration(
    url: str, options: object, match: str
) -> None:
    app = make_app(lease_backend=url, lease_backend_options=options)
    with pytest.raises(LeaseConfigError, match=match):
        register(app)


def test_lease_backend_options_is_also_a_task_option() -> None:
    app = make_app(lease_backend="rediss://127.0.0.1:6380/0")
    task = register(app, lease_backend_options={"ssl_ca_certs": "/etc/ca.pem"})
    options, _, _ = task.lease_settings()
    assert options.backend_options == {"ssl_ca_certs": "/etc/ca.pem"}


@pytest.mark.parametrize("value", [-1, 1.5, "1", True])
def test_lease_min_replicas_must_be_a_whole_number(value: object) -> None:
    with pytest.raises(LeaseConfigError, match="lease_min_replicas"):
        register(make_app(lease_backend="redis://h:6379/0", lease_min_replicas=value))


def test_sentinel_url_in_celerys_spelling_is_parsed() -> None:
    spec = store_url.parse_store(
        "sentinel://:pw@h1:26379/2;sentinel://h2:26380/2",
        {"master_name": "mymaster", "sentinel_kwargs": {"password": "spw"}},
    )
    assert spec.kind == "sentinel" and spec.master_name == "mymaster"
    assert spec.sentinels == (("h1", 26379), ("h2", 26380))
    assert spec.params["db"] == 2 and spec.params["password"] == "pw"
    assert spec.sentinel_kwargs == {"password": "spw"}


def test_cluster_is_an_option_on_a_plain_seed_url() -> None:
    spec = store_url.parse_store(
        "rediss://u:p@h:7000", {"cluster": True, "ssl_ca_certs": "/ca.pem"}
    )
    assert spec.kind == "cluster" and spec.tls and "db" not in spec.params
    assert spec.params["ssl_cert_reqs"] == ssl.CERT_REQUIRED


# -- credentials never printed ----------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis://user:hunter2@h:6379/0",
        "unix://:hunter2@/tmp/r.sock?db=0",
        "unix:///tmp/r.sock?password=hunter2",
        "sentinel://:hunter2@h1:1/0;sentinel://:hunter2@h2:2/0",
        "amqp://guest:hunter2@h:5672//",
        "redis://:hunter2@h:63 79/0",
    ],
)
def test_safe_url_masks_every_password(url: str) -> None:
    assert "hunter2" not in store_url.safe_url(url)


def test_configuration_errors_never_show_the_password() -> None:
    with pytest.raises(LeaseConfigError) as refused:
        register(make_app(lease_backend="redis://u:hunter2@h:6379/0?socket_timeout=9"))
    assert "hunter2" not in str(refused.value)
    app = make_app(broker_url="amqp://guest:hunter2@h:5672//")
    with pytest.raises(LeaseConfigError) as no_backend:
        resolve_backend(resolve_options(app.conf, {}, "t"), app.conf, "t")
    assert "hunter2" not in str(no_backend.value) and "lease_backend" in str(no_backend.value)


# -- TLS -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(certs: Certificates) -> Iterator[TlsRedisServer]:
    server = TlsRedisServer(certs).start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def mtls_server(certs: Certificates) -> Iterator[TlsRedisServer]:
    server = TlsRedisServer(certs, mutual=True).start()
    yield server
    server.close()


@pytest.mark.parametrize("reqs", ["CERT_REQUIRED", "required"])
def test_tls_with_the_ca_in_the_url_query(
    tls_server: TlsRedisServer, certs: Certificates, reqs: str
) -> None:
    client = store.client_for(
        f"{tls_server.url()}?ssl_cert_reqs={reqs}&ssl_ca_certs={certs.ca_file}", 0.5
    )
    assert works(client)
    assert_library_settings(client, 0.5)
    assert topology.describe_topology(client).tls is True


def test_tls_with_the_ca_in_lease_backend_options(
    tls_server: TlsRedisServer, certs: Certificates
) -> None:
    assert works(store.client_for(tls_server.url(), 0.5, {"ssl_ca_certs": certs.ca_file}))


def test_mutual_tls_with_a_client_certificate(
    mtls_server: TlsRedisServer, certs: Certificates
) -> None:
    options = {
        "ssl_ca_certs": certs.ca_file,
        "ssl_certfile": certs.client_cert,
        "ssl_keyfile": certs.client_key,
    }
    assert works(store.client_for(mtls_server.url(), 0.5, options))
    with pytest.raises(redis.ConnectionError) as refused:
        store.client_for(mtls_server.url(), 0.5, {"ssl_ca_certs": certs.ca_file}).ping()
    assert store_errors.permanent_error(refused.value) is not None


def test_wrong_ca_refuses_the_worker_start_naming_the_setting(
    tls_server: TlsRedisServer, certs: Certificates
) -> None:
    app = make_app(
        lease_backend=tls_server.url(), lease_backend_options={"ssl_ca_certs": certs.other_ca_file}
    )
    register(app)
    with pytest.raises(LeaseConfigError, match=r"certificate verify failed.*ssl_ca_certs") as err:
        check_app(app)
    assert "unreachable" not in str(err.value)


# -- ACL -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def acl_server() -> Iterator[AclRedisServer]:
    server = AclRedisServer().start()
    yield server
    server.close()


def test_minimal_acl_user_cannot_run_keys_config_or_flush(acl_server: AclRedisServer) -> None:
    client = store.client_for(acl_server.lease_url(), 0.5)
    for command in (
        ("KEYS", "*"),
        ("CONFIG", "GET", "maxmemory"),
        ("FLUSHALL",),
        ("GET", "not-a-lease-key"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command(*command)


def test_store_check_under_acl_reads_the_eviction_policy_from_info(
    acl_server: AclRedisServer,
) -> None:
    client = store.client_for(acl_server.lease_url(), 0.5)
    assert topology.check_store(client).eviction_policy == "noeviction"
    layout = topology.describe_topology(client)
    assert (layout.kind, layout.eviction_policy, layout.policy_source) == (
        "standalone",
        "noeviction",
        "INFO",
    )
    assert layout.primaries == (f"127.0.0.1:{acl_server.port}",) and not layout.tls


def test_eviction_policy_is_unreadable_when_info_is_denied_too(acl_server: AclRedisServer) -> None:
    with acl_server.client() as admin:
        admin.execute_command("ACL", "SETUSER", "bare", "reset", "on", ">pw", "~lease:*", "+get")
    client = store.client_for(f"redis://bare:pw@127.0.0.1:{acl_server.port}/0", 0.5)
    assert topology.describe_topology(client).eviction_policy == "unreadable under ACL"


def test_wrong_password_refuses_the_worker_start_as_permanent(acl_server: AclRedisServer) -> None:
    app = make_app(lease_backend=acl_server.lease_url(password="wrong"))
    register(app)
    with pytest.raises(LeaseConfigError, match="lease_backend") as err:
        check_app(app)
    assert "unreachable" not in str(err.value) and "wrong" not in str(err.value)


@pytest.mark.parametrize(
    ("user", "rules", "named"),
    [
        (
            "wrongkeys",
            ["reset", "on", ">pw", "~jobs:*", "-@all", "+info", "+evalsha", "+eval", "+get"],
            "key patterns do not cover lease_key_prefix 'lease'; grant '~lease:*'",
        ),
        (
            "noscripts",
            ["reset", "on", ">pw", "~lease:*", "-@all", "+info", "+get", "+set"],
            "may not run +eval",
        ),
    ],
)
def test_a_user_missing_a_permission_refuses_the_worker_start(
    acl_server: AclRedisServer, user: str, rules: list[str], named: str
) -> None:
    with acl_server.client() as admin:
        admin.execute_command("ACL", "SETUSER", user, *rules)
    app = make_app(lease_backend=f"redis://{user}:pw@127.0.0.1:{acl_server.port}/0")
    register(app)
    with pytest.raises(LeaseConfigError, match="refusing to start") as err:
        check_app(app)
    assert named in str(err.value)
    assert "section ACL" in str(err.value) and "unreachable" not in str(err.value)


def test_the_minimal_user_passes_the_worker_start_check(acl_server: AclRedisServer) -> None:
    app = make_app(lease_backend=acl_server.lease_url())
    register(app)
    assert [c.eviction_policy for c in check_app(app)] == ["noeviction"]


def test_scan_over_a_standalone_store_uses_scan_only(acl_server: AclRedisServer) -> None:
    client = store.client_for(acl_server.lease_url(), 0.5)
    keys = [f"lease:{{scan-{i}}}" for i in range(30)]
    for key in keys:
        store.acquire(client, key, uuid.uuid4().hex, 5000, HOLDER)
    found = {k.decode() for k in topology.scan(client, "lease:{scan-*", 7, "STRING")}
    assert found == set(keys) | {k + ":fence" for k in keys}


# -- a frozen store, whatever the URL says ----------------------------------------------------


def test_a_frozen_store_times_out_at_the_library_timeout_with_overrides_in_the_url(
    throwaway_redis: RedisFactory,
) -> None:
    server = throwaway_redis()
    client = store.client_for(f"{server.url()}?retry_on_timeout=true&health_check_interval=1", 0.3)
    key, token = "lease:{frozen}", uuid.uuid4().hex
    store.acquire(client, key, token, 5000, HOLDER)
    server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            store.renew_many(client, [(key, token, 5000)])
        assert time.monotonic() - started < 0.9
    finally:
        server.resume()


# -- the CLI on these stores ---------------------------------------------------------------


def cli_env(redis_url: str, lease_backend: str) -> dict[str, str]:
    return {
        BROKER_URL_ENV: redis_url,
        RESULT_BACKEND_ENV: redis_url,
        QUEUE_ENV: "cli-conn",
        "LEASE_BACKEND": lease_backend,
    }


def test_cli_under_the_minimal_acl_lists_and_describes_the_store(
    acl_server: AclRedisServer, redis_url: str
) -> None:
    client = store.client_for(acl_server.lease_url(), 0.5)
    store.acquire(client, "lease:{cli-acl}", uuid.uuid4().hex, 30_000, HOLDER)
    env = cli_env(redis_url, acl_server.lease_url())
    listed = celery_lease(env, "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "lease:{cli-acl}" in [item["key"] for item in json.loads(listed.stdout)]
    doctor = celery_lease(env, "doctor")
    assert f"standalone, TLS off, primaries 127.0.0.1:{acl_server.port}" in doctor.stdout
    assert "eviction policy noeviction (read via INFO)" in doctor.stdout
    assert AclRedisServer.PASSWORD not in doctor.stdout + doctor.stderr


def test_cli_on_a_unix_url_with_a_password_answers(unix_server: tuple, redis_url: str) -> None:
    _, sock = unix_server
    done = celery_lease(cli_env(redis_url, f"unix://:sockpw@{sock}?db=0"), "doctor")
    assert "Traceback" not in done.stderr, done.stderr
    assert f"standalone, TLS off, primaries {sock}" in done.stdout
    assert "sockpw" not in done.stdout + done.stderr
