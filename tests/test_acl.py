"""Every feature under exactly the ACL rule generated from the commands the code sends
(:mod:`celery_lease.store.permissions`), and the start check, the doctor and ``celery lease
acl`` against users that lack one command. Private servers with ACL users; the worker-process
runs under the same rule are in tests/test_secure_workers.py."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

import pytest
import redis
from celery import Celery

from celery_lease import LeaseConfigError, LeasedTask, LeaseLost, LeaseStoreUnavailable, hold, store
from celery_lease.base import signals
from celery_lease.base.keys import hold_key, wake_key
from celery_lease.ops import acl
from celery_lease.ops.doctor import check_acl
from celery_lease.ops.worker import check_app
from celery_lease.policies import preempt
from celery_lease.store import permissions
from harness.topologies import cluster_setup
from tests.apps.preempt_app import in_process
from tests.support.redis_server import HOST, RedisServer
from tests.support.secure import AclRedisServer, lease_acl
from tests.support.waiting import wait_for
from tests.test_cli import celery_lease

HOLDER = store.holder_json("t.job", "task-1", "host", 42)
FULL = (*permissions.DEFAULT_FEATURES, "min_replicas")


@pytest.fixture(scope="module")
def server() -> Iterator[AclRedisServer]:
    with AclRedisServer(features=FULL) as started:
        yield started


def user_without(server: RedisServer, command: str, features: Sequence[str] = FULL) -> str:
    """A new user with the generated rule of ``features`` but ``command``; its URL."""
    name = f"no-{command.replace('|', '-')}-{uuid.uuid4().hex[:6]}"
    rule = [r for r in lease_acl(name, "pw", features=features) if r != f"+{command}"]
    with server.client() as admin:
        admin.execute_command("ACL", "SETUSER", *rule)
    return f"redis://{name}:pw@{HOST}:{server.port}/0"


def app_for(url: str, **conf: object) -> Celery:
    app = Celery("acl", broker="memory://", set_as_current=False)
    app.conf.update(lease_backend=url, **conf)

    @app.task(base=LeasedTask, shared=False, name=f"job-{uuid.uuid4().hex[:6]}")  # type: ignore[misc]
    def job() -> None:
        pass

    app.finalize()
    return app


# -- the features under exactly the generated rule -----------------------------------------


def test_a_waiting_hold_is_woken_by_the_release_under_the_generated_rule(
    server: AclRedisServer,
) -> None:
    url = server.lease_url()
    holding, waited = threading.Event(), []

    def holder() -> None:
        with hold("acl-handoff", url=url, ttl=30.0):
            holding.set()
            time.sleep(0.5)  # the waiter is refused once, then blocks in BLPOP

    thread = threading.Thread(target=holder)
    thread.start()
    holding.wait(5)
    started = time.monotonic()
    with hold("acl-handoff", url=url, ttl=30.0, on_conflict="wait", timeout=10.0):
        waited.append(time.monotonic() - started)
    thread.join(5)
    assert 0.2 < waited[0] < 5.0  # woken by the release's RPUSH, not by the expiry 30 s away


def test_a_waiting_hold_without_blpop_fails_with_the_store_error(server: AclRedisServer) -> None:
    url = user_without(server, "blpop")
    with (
        hold("acl-noblpop", url=url, ttl=30.0),
        pytest.raises(LeaseStoreUnavailable, match="blpop"),
    ):
        with hold("acl-noblpop", url=url, ttl=30.0, on_conflict="wait", timeout=2.0):
            pass


def test_a_release_whose_wake_is_refused_still_releases_and_logs_the_fix(
    server: AclRedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = store.client_for(user_without(server, "rpush"), 1.0)
    key, token = hold_key("lease", "acl-norpush"), uuid.uuid4().hex
    assert store.acquire(client, key, token, 30_000, HOLDER).granted
    with caplog.at_level(logging.WARNING, "celery_lease"):
        assert store.release_and_wake(client, key, token) is True
    with server.client() as admin:
        assert admin.exists(key, wake_key(key)) == 0  # released, and no list without lifetime
    (line,) = [r.getMessage() for r in caplog.records if "woke no waiting hold" in r.getMessage()]
    assert "+rpush" in line and "can't run this command" in line
    assert store.release_and_wake(client, key, token) is True  # a repeat: released before


def test_min_replicas_is_acknowledged_by_a_real_replica_under_the_generated_rule(
    server: AclRedisServer,
) -> None:
    # The replica runs the primary's binary: a 6.2 replica cannot read a 7.0 primary's RDB.
    with RedisServer(
        config={"replicaof": [HOST, str(server.port)]}, binary=server.binary
    ) as replica:
        with replica.client() as plain:
            wait_for(lambda: plain.info("replication")["master_link_status"] == "up", 15)
        client = store.client_for(server.lease_url(), 5.0)  # WAIT waits up to 2.5 s
        key, token = "lease:{acl-replicated}", uuid.uuid4().hex
        assert store.acquire(client, key, token, 30_000, HOLDER, min_replicas=1).granted
        with replica.client() as plain:
            assert store.parse_value(plain.get(key)).token == token
        assert store.release(client, key, token)
    assert check_app(app_for(server.lease_url(), lease_min_replicas=1))


# A prefix of its own: this process's listener on its own channel. A process has one listener
# per prefix, on the first store it used: a test on another server takes another prefix.
PREEMPT_PREFIX = "aclpre"


def test_a_preempt_under_the_generated_rule_tells_the_old_body_at_once_on_its_channel(
    server: AclRedisServer,
) -> None:
    prefix = f"{PREEMPT_PREFIX}{server.port}"
    job, _ = in_process("redis://unused@127.0.0.1:1/0", prefix)
    app = job.app
    (need,) = acl.needs(app)
    assert "preempt" in need.features
    (rule,) = acl.rules(app)
    assert f"'~{prefix}:*' resetchannels '&{prefix}:preempt:*' -@all" in rule
    assert "+publish +subscribe" in rule
    with server.client() as admin:  # the user `celery lease acl` prints for this app
        admin.execute_command(
            "ACL",
            "SETUSER",
            *lease_acl("preempter", "pw", prefix, features=sorted(need.features)),
        )
    job, seen = in_process(f"redis://preempter:pw@{HOST}:{server.port}/0", prefix)
    assert check_app(job.app)  # the start check finds nothing missing, channels included
    told: list[int] = []

    def on_preempted(sender: object = None, notified: int = 0, **_: object) -> None:
        told.append(notified)

    signals.lease_preempted.connect(on_preempted, weak=False)
    old: list[object] = []
    thread = threading.Thread(target=lambda: old.append(job.apply(("t", "old"))))
    try:
        thread.start()
        wait_for(lambda: seen, 10, message="the old run never started")
        wait_for(
            lambda: any(
                listener.subscribed.is_set() and listener.channel.startswith(f"{prefix}:preempt:")
                for listener in preempt._listeners.values()
            ),
            10,
            message="the preemption listener never subscribed under the generated rule",
        )
        assert job.apply(("t", "new")).get() == "new"
        thread.join(15)
    finally:
        signals.lease_preempted.disconnect(on_preempted)
    assert told == [1]  # PUBLISH allowed on the channel, and the old process listened
    [result] = old
    with pytest.raises(LeaseLost) as lost:
        result.get()  # type: ignore[attr-defined]
    assert lost.value.cause == "preempted"
    times = {what: at for run, what, at in seen if run == "old"}
    started_new = next(at for run, what, at in seen if (run, what) == ("new", "start"))
    # Told by the notice, not by the renewal 10 s later (lease_ttl=30).
    assert times["lost preempted"] - started_new < 5.0


def test_a_rule_without_the_preempt_channel_refuses_a_worker_with_a_preempt_task(
    server: AclRedisServer,
) -> None:
    job, _ = in_process("redis://unused@127.0.0.1:1/0", PREEMPT_PREFIX)
    (need,) = acl.needs(job.app)
    rule = [
        r
        for r in lease_acl("nochannel", "pw", PREEMPT_PREFIX, features=sorted(need.features))
        if not r.startswith("&")
    ]
    with server.client() as admin:
        admin.execute_command("ACL", "SETUSER", *rule)
    job, _ = in_process(f"redis://nochannel:pw@{HOST}:{server.port}/0", PREEMPT_PREFIX)
    with pytest.raises(LeaseConfigError, match="refusing to start") as err:
        check_app(job.app)
    assert "+publish +subscribe" in str(err.value)
    assert f"'&{PREEMPT_PREFIX}:preempt:*'" in str(err.value) and ":pw@" not in str(err.value)


# -- the start check against a rule missing one command ------------------------------------


@pytest.mark.parametrize("command", permissions.commands(()))
def test_a_rule_missing_a_task_command_refuses_the_worker_start_naming_it(
    server: AclRedisServer, command: str
) -> None:
    with pytest.raises(LeaseConfigError, match="refusing to start") as err:
        check_app(app_for(user_without(server, command)))
    assert f"+{command}" in str(err.value) and "celery lease acl" in str(err.value)
    assert ":pw@" not in str(err.value)  # no password shown


def test_a_rule_without_wait_refuses_a_worker_with_min_replicas_naming_it(
    server: AclRedisServer,
) -> None:
    url = user_without(server, "wait")
    assert check_app(app_for(url))  # without lease_min_replicas, WAIT is never sent
    with pytest.raises(LeaseConfigError, match=r"may not run \+wait .* min_replicas"):
        check_app(app_for(url, lease_min_replicas=1))


@pytest.mark.parametrize("command", ["blpop", "rpush", "hset"])
def test_a_rule_missing_a_hold_or_beat_command_warns_at_start_naming_it(
    server: AclRedisServer, command: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "celery_lease"):
        assert check_app(app_for(user_without(server, command)))
    assert any(f"may not run +{command}" in r.getMessage() for r in caplog.records)


def test_the_generated_rule_passes_the_start_check_without_a_warning(
    server: AclRedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "celery_lease"):
        assert check_app(app_for(server.lease_url(), lease_min_replicas=1))
    # The rule covers WAIT; that no replica is connected is a finding of its own.
    assert [
        r.getMessage() for r in caplog.records if "but 0 replica(s) connected" not in r.getMessage()
    ] == []


# -- the doctor and `celery lease acl` --------------------------------------------------------


def test_the_doctor_names_each_missing_command_of_every_feature(server: AclRedisServer) -> None:
    found = check_acl(app_for(user_without(server, "scan")))
    assert [(f.level, "+scan" in f.message) for f in found] == [("warn", True)]
    ok = check_acl(app_for(server.lease_url()))
    assert [f.level for f in ok] == ["ok"]


def test_the_rule_for_an_app_adds_wait_select_and_a_beat_key_outside_the_prefix() -> None:
    app = app_for(
        "redis://app-user:pw@h:6379/2", lease_min_replicas=1, lease_beat_key="beats:{leader}"
    )
    (rule,) = acl.rules(app)
    assert rule.splitlines()[0] == (
        "# lease store redis://app-user:**@h:6379/2: tasks, hold, "
        "beat, cli, doctor, min_replicas, database"
    )
    assert "ACL SETUSER app-user reset on '><password>' '~lease:*' '~beats:{leader}*'" in rule
    assert "+wait" in rule and "+select" in rule and ":pw@" not in rule


def test_the_rule_for_a_default_app_is_the_documented_one() -> None:
    app = Celery("acl", broker="redis://localhost:6379/0", set_as_current=False)
    (rule,) = acl.rules(app, password="s3cret")
    assert rule.split("\n", 1)[1] == permissions.setuser(
        "lease", "s3cret", permissions.DEFAULT_FEATURES, ["lease:*"]
    )


def test_celery_lease_acl_prints_the_rule_for_the_urls_user_without_its_password() -> None:
    done = celery_lease({"LEASE_BACKEND": "redis://ops:hidden-pw@127.0.0.1:1/0"}, "acl")
    assert done.returncode == 0, done.stderr
    header, rule = done.stdout.strip().split("\n", 1)
    # ops_app has coalesce and queue tasks: the rule grants the hand-over's commands too.
    assert header == (
        "# lease store redis://ops:**@127.0.0.1:1/0: tasks, handoff, hold, beat, cli, doctor"
    )
    assert rule == permissions.setuser(
        "ops", "<password>", ("tasks", "handoff", "hold", "beat", "cli", "doctor"), ["lease:*"]
    )
    assert "hidden-pw" not in done.stdout + done.stderr


def test_every_command_of_every_feature_can_be_asked_about(server: AclRedisServer) -> None:
    with server.client() as admin:  # the default user may run everything
        assert permissions.denied(admin, permissions.FEATURES, ["lease", "other"]) == []
    limited = store.client_for(server.lease_url(), 1.0)
    found = permissions.denied(limited, ["cluster", "database"], ["lease"])
    assert found is not None
    assert {(d.feature, d.commands) for d in found} == {
        ("cluster", ("cluster|slots", "command", "asking")),
        ("database", ("select",)),
    }


def test_a_command_a_script_may_not_run_is_a_permanent_error_naming_the_fix(
    server: AclRedisServer,
) -> None:
    client = store.client_for(user_without(server, "set"), 1.0)
    with pytest.raises(redis.exceptions.ResponseError) as refused:
        store.acquire(client, "lease:{acl-noset}", uuid.uuid4().hex, 5000, HOLDER)
    assert "celery lease acl" in str(store.permanent_error(refused.value))


def test_a_cluster_under_exactly_the_generated_rule_grants_renews_and_releases() -> None:
    features = (*permissions.DEFAULT_FEATURES, "cluster")
    with cluster_setup(replicas=0, binary="system") as cluster:  # the ACL check needs 7.0
        for node in cluster.live():
            with node.client() as admin:
                admin.execute_command(
                    "ACL", "SETUSER", *lease_acl("lease", "pw", features=features)
                )
        url = f"redis://lease:pw@{HOST}:{cluster.live()[0].port}/0"
        client = store.client_for(url, 2.0, {"cluster": True})
        keys = [f"lease:{{acl-cluster-{i}}}" for i in range(6)]  # over every primary
        tokens = [uuid.uuid4().hex for _ in keys]
        for key, token in zip(keys, tokens, strict=True):
            assert store.acquire(client, key, token, 30_000, HOLDER).granted
        assert (
            store.renew_many(client, [(k, t, 30_000) for k, t in zip(keys, tokens, strict=True)])
            == [1] * 6
        )
        assert all(store.release(client, k, t) for k, t in zip(keys, tokens, strict=True))
        assert permissions.denied(client, features, ["lease"]) == []
        app = app_for(url, lease_backend_options={"cluster": True})
        assert check_app(app)
        (rule,) = acl.rules(app)
        assert "+cluster|slots +command +asking" in rule
