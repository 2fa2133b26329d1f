"""``celery lease`` run as a user runs it: a ``celery -A ... lease`` subprocess, against a real
Redis whose leases are held by a real worker."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import redis
from celery.exceptions import TimeoutError as CeleryTimeoutError

from celery_lease import LeaseLost, store
from harness.redis_server import free_port
from harness.waiting import wait_for
from tests.support.fixtures import RedisFactory, WorkerFactory
from tests.support.workers import BROKER_URL_ENV, QUEUE_ENV, REPO_ROOT, RESULT_BACKEND_ENV

APP = "tests.apps.ops_app"


def celery_lease(
    env: Mapping[str, str], *args: str, input: str | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run ``celery -A tests.apps.ops_app lease <args>`` and return the finished process."""
    environ = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), environ.get("PYTHONPATH", "")) if p
    )
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "lease", *args],
        input=input,
        capture_output=True,
        text=True,
        env=environ,
        timeout=timeout,
        cwd=REPO_ROOT,
    )


def _env(url: str, queue: str, **extra: str) -> dict[str, str]:
    return {
        BROKER_URL_ENV: url,
        RESULT_BACKEND_ENV: url,
        QUEUE_ENV: queue,
        "LEASE_TTL": "2.0",
        **extra,
    }


def _app(url: str, queue: str) -> Any:
    from celery import Celery

    app = Celery("client", broker=url, backend=url)
    app.conf.task_default_queue = queue
    return app


def _started(client: redis.Redis, count: int) -> list[dict[str, Any]]:
    items = [json.loads(x) for x in client.lrange("started", 0, -1)]
    return items if len(items) >= count else []


@pytest.fixture
def held(redis_url: str, worker_factory: WorkerFactory) -> Iterator[dict[str, Any]]:
    """A worker (threads pool) holding two ``ops.hold`` leases, and the CLI environment."""
    env = _env(redis_url, worker_factory.queue)
    worker = worker_factory(APP, pool="threads", concurrency=3, env=env)
    app = _app(redis_url, worker_factory.queue)
    client = redis.Redis.from_url(redis_url)
    a = app.send_task("ops.hold", ("alpha", 30))
    b = app.send_task("ops.hold", ("beta", 30))
    wait_for(lambda: _started(client, 2), 15, message=worker.log_tail)
    yield {
        "env": env,
        "worker": worker,
        "app": app,
        "ids": {a.id: "alpha", b.id: "beta"},
        "results": {"alpha": a, "beta": b},
        "client": client,
    }
    worker.kill()  # a warm shutdown would wait for the 30 s holds


def test_lease_is_a_celery_subcommand(redis_url: str) -> None:
    done = celery_lease(_env(redis_url, "q"), "--help")
    assert done.returncode == 0, done.stderr
    for command in ("ls", "show", "release", "doctor"):
        assert command in done.stdout


def test_ls_lists_the_leases_real_workers_hold(held: dict[str, Any]) -> None:
    done = celery_lease(held["env"], "ls", "--json")
    assert done.returncode == 0, done.stderr
    leases = json.loads(done.stdout)
    assert {item["task_id"] for item in leases} == set(held["ids"])
    for item in leases:
        assert item["task"] == "ops.hold"
        assert item["pid"] == held["worker"].pid  # threads pool: the worker process
        assert item["host"] == socket.gethostname()  # the host, as for beat and eager calls
        assert item["node"] == held["worker"].hostname  # the worker's node name
        assert item["fencing_token"] > 0
        assert 0 < item["ttl"] <= 2.0
        assert item["key"].startswith("lease:{ops.hold:")

    # Not a terminal: the table fits 80 columns (COLUMNS says how wide a terminal is), and
    # the key `celery lease release` takes is printed whole: TASK ID is shortened, PID then
    # HOST left out, first.
    table = celery_lease({**held["env"], "COLUMNS": "80"}, "ls")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    header = _cells(lines[0])
    assert header[:2] == ["TASK", "TASK ID"] and header[-2:] == ["TIME LEFT", "KEY"], lines
    assert header[2:-2] in (["HOST", "PID"], ["HOST"], []), lines
    assert max(len(line) for line in lines) <= 80, table.stdout
    for item in leases:
        (row,) = [line for line in lines if line.endswith(f"  {item['key']}")]
        cells = dict(zip(header, _cells(row), strict=True))
        assert cells["TASK"] == "ops.hold" and _cut_of(cells["TASK ID"], item["task_id"])
        assert cells.get("PID", str(held["worker"].pid)) == str(held["worker"].pid)
    assert lines[-1] == "2 lease(s)"
    wide = celery_lease({**held["env"], "COLUMNS": "80"}, "ls", "--wide")
    assert wide.stdout.splitlines()[0].split() == [
        "TASK",
        "TASK",
        "ID",
        "HOST",
        "PID",
        "FENCING",
        "TOKEN",
        "TIME",
        "LEFT",
        "KEY",
    ]
    for item in leases:  # in full, whatever the width
        assert any(
            item["task_id"] in line and item["key"] in line for line in wide.stdout.splitlines()
        )

    other = celery_lease(held["env"], "ls", "--task", "ops.slow")
    assert other.returncode == 0 and "no leases held by ops.slow" in other.stdout
    unknown = celery_lease(held["env"], "ls", "--task", "ops.nope")
    shown = celery_lease(held["env"], "show", "ops.nope")
    assert unknown.returncode == shown.returncode == 2
    assert (
        unknown.stderr
        == shown.stderr
        == "no task named 'ops.nope' is registered in app 'ops_app'\n"
    )
    mine = json.loads(celery_lease(held["env"], "ls", "--task", "ops.hold", "--json").stdout)
    assert len(mine) == 2


def test_ls_too_narrow_for_a_key_beside_its_row_prints_it_whole_under_the_row(
    held: dict[str, Any],
) -> None:
    leases = json.loads(celery_lease(held["env"], "ls", "--json").stdout)
    narrow = celery_lease({**held["env"], "COLUMNS": "40"}, "ls").stdout.splitlines()
    header = _cells(narrow[0])
    assert header[:2] == ["TASK", "TASK ID"] and header[-1] == "TIME LEFT", narrow
    assert header[2:-1] in (["HOST", "PID"], ["HOST"], []) and narrow[1] == "  KEY", narrow
    rows = narrow[2:-1]
    assert [_cells(row)[0] for row in rows[::2]] == ["ops.hold", "ops.hold"], narrow
    assert sorted(rows[1::2]) == sorted(f"  {item['key']}" for item in leases), narrow
    assert max(len(row) for row in rows[::2]) <= 40, narrow


def _cells(line: str) -> list[str]:
    """The cells of a table line: words separated by single spaces."""
    return re.findall(r"\S+(?: \S+)*", line)


def _cut_of(shown: str, full: str) -> bool:
    """``shown`` is ``full``, or ``full`` shortened in the middle with ``~``."""
    head, cut, tail = shown.partition("~")
    return shown == full or (bool(cut) and full.startswith(head) and full.endswith(tail))


def test_show_names_the_key_a_call_takes_and_its_holder(held: dict[str, Any]) -> None:
    listed = json.loads(celery_lease(held["env"], "ls", "--json").stdout)
    alpha = next(i for i in listed if held["ids"][i["task_id"]] == "alpha")
    done = celery_lease(held["env"], "show", "ops.hold", "alpha", "30", "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["key"] == alpha["key"]
    assert shown["holder"]["task_id"] == alpha["task_id"]
    # The same call spelled with keyword arguments takes the same key.
    by_kwargs = celery_lease(
        held["env"], "show", "ops.hold", "--kwargs", '{"seconds": 30, "name": "alpha"}'
    )
    assert by_kwargs.returncode == 0, by_kwargs.stderr
    assert f"key:    {alpha['key']}" in by_kwargs.stdout
    worker = held["worker"]
    assert (
        f"holder: task ops.hold [{alpha['task_id']}] on worker {worker.hostname} "
        f"(host {socket.gethostname()}, pid {worker.pid}), fencing token "
    ) in by_kwargs.stdout, by_kwargs.stdout
    free = celery_lease(held["env"], "show", "ops.hold", "gamma", "30")
    assert "holder: none (free)" in free.stdout and free.returncode == 1  # not found
    plain = celery_lease(held["env"], "show", "ops.tick")
    assert plain.returncode == 2 and "not a LeasedTask" in plain.stderr


def test_release_asks_then_releases_and_the_holder_loses_its_lease(held: dict[str, Any]) -> None:
    listed = json.loads(celery_lease(held["env"], "ls", "--json").stdout)
    beta = next(i for i in listed if held["ids"][i["task_id"]] == "beta")
    declined = celery_lease(held["env"], "release", beta["key"], input="n\n")
    assert declined.returncode == 1
    assert f"is held by task ops.hold [{beta['task_id']}]" in declined.stdout
    assert held["client"].exists(beta["key"])

    done = celery_lease(held["env"], "release", beta["key"], "--yes")
    assert done.returncode == 0, done.stderr
    assert f"released {beta['key']}" in done.stdout
    # The running holder finds out at its next renewal and stops with LeaseLost.
    with pytest.raises(LeaseLost) as lost:
        held["results"]["beta"].get(timeout=10)
    assert lost.value.cause == "refused"
    assert lost.value.key == beta["key"]
    # It was taken away, not ended: a redelivery of its message would run it again.
    assert not store.released_last(held["client"], beta["key"], beta["token"])
    with pytest.raises(CeleryTimeoutError):
        held["results"]["alpha"].get(timeout=0.1)  # the other lease is untouched


def test_release_refuses_when_the_lease_changed_after_it_was_shown(held: dict[str, Any]) -> None:
    listed = json.loads(celery_lease(held["env"], "ls", "--json").stdout)
    alpha = next(i for i in listed if held["ids"][i["task_id"]] == "alpha")
    environ = {**os.environ, **held["env"], "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", APP, "lease", "release", alpha["key"]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
        cwd=REPO_ROOT,
    )
    try:
        assert proc.stdout is not None
        shown = proc.stdout.readline()  # "<key> is held by ...", then the prompt
        assert alpha["task_id"] in shown
        # While the operator reads the prompt, the holder changes: the old execution's lease
        # is released and a new execution of the same call takes the key.
        client = held["client"]
        assert store.release(client, alpha["key"], alpha["token"])
        held["results"]["alpha"].get(timeout=10, propagate=False)
        again = held["app"].send_task("ops.hold", ("alpha", 30))
        wait_for(
            lambda: (v := client.get(alpha["key"])) and store.parse_value(v).task_id == again.id, 15
        )
        out, err = proc.communicate("y\n", timeout=30)
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 1, out + err
    assert "refused: the lease changed since it was shown" in err
    assert again.id in err
    holder = store.parse_value(held["client"].get(alpha["key"]) or b"")
    assert holder.task_id == again.id  # the new holder kept its lease


def test_ls_scans_without_keys_on_a_big_keyspace(
    throwaway_redis: RedisFactory, worker_factory: WorkerFactory
) -> None:
    server = throwaway_redis()
    url = server.url(0)
    client = server.client(socket_timeout=5)
    pipe = client.pipeline(transaction=False)
    for i in range(20000):
        pipe.set(f"cache:item:{i}", "x")
    for i in range(300):
        pipe.set(
            f"lease:{{fake:{i}}}",
            f"{'f' * 32}:{i + 1}:"
            + json.dumps({"task": "fake.task", "id": f"id-{i}", "host": "h", "pid": 1}),
        )
        pipe.set(f"lease:{{fake:{i}}}:fence", str(i + 1))
    pipe.execute()
    client.execute_command("ACL", "SETUSER", "default", "-keys")  # KEYS now fails
    env = _env(url, worker_factory.queue)
    worker = worker_factory(
        APP,
        pool="threads",
        concurrency=2,
        env={**env, BROKER_URL_ENV: url, RESULT_BACKEND_ENV: url},
    )
    app = _app(url, worker_factory.queue)
    app.send_task("ops.hold", ("big", 30))
    wait_for(lambda: _started(client, 1), 15, message=worker.log_tail)
    done = celery_lease(env, "ls", "--json")
    assert done.returncode == 0, done.stderr
    leases = json.loads(done.stdout)
    assert len(leases) == 301  # fencing counters and other keys left out
    assert sum(1 for item in leases if item["task"] == "ops.hold") == 1
    assert all(not item["key"].endswith(":fence") for item in leases)
    worker.kill()


def test_doctor_passes_on_a_healthy_setup_with_leases_held(held: dict[str, Any]) -> None:
    done = celery_lease(held["env"], "doctor")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "OK   store redis://127.0.0.1:" in out
    assert "maxmemory-policy noeviction" in out
    assert "latency median" in out and "clock skew" in out
    assert "OK   task ops.hold: lease_ttl=2s lease_renew_interval=0.666667s" in out
    assert "0 problem(s)" in out


def test_doctor_fails_and_says_what_to_fix(
    throwaway_redis: RedisFactory, worker_factory: WorkerFactory
) -> None:
    server = throwaway_redis({"maxmemory-policy": "allkeys-lru"})
    env = _env(
        server.url(0), worker_factory.queue, LEASE_ON_CONFLICT="retry", VISIBILITY_TIMEOUT="1"
    )
    done = celery_lease(env, "doctor")
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "FAIL store" in out and "maxmemory-policy allkeys-lru may evict a live lease" in out
    assert "fix: CONFIG SET maxmemory-policy noeviction" in out
    assert (
        "WARN task ops.hold: lease_on_conflict='retry' with a full line (lease_queue_max=100)"
        " waits up to lease_ttl=2s"
    ) in out
    assert "visibility_timeout" in out

    server.kill()
    down = celery_lease(env, "doctor")
    assert down.returncode == 1
    assert "unreachable" in down.stdout


def test_doctor_warns_when_a_run_or_a_countdown_can_outlast_rabbitmqs_consumer_timeout(
    redis_url: str,
) -> None:
    # Only the URL's scheme matters: the doctor never connects to the broker.
    rabbitmq = {BROKER_URL_ENV: "amqp://guest:guest@127.0.0.1:5672//", "LEASE_BACKEND": redis_url}
    env = {**_env(redis_url, "doctor-rabbitmq"), **rabbitmq, RESULT_BACKEND_ENV: redis_url}

    default = celery_lease({**env, "ACKS_LATE": "1"}, "doctor").stdout
    assert (
        "WARN task ops.hold: acks_late is on with no time_limit: a run longer than RabbitMQ's "
        "consumer_timeout=1800s (RabbitMQ's default; state the server's in "
        "lease_rabbitmq_consumer_timeout)"
    ) in default
    assert "fix: set time_limit below 1800s, or raise consumer_timeout in rabbitmq.conf" in default
    assert "lease_ttl=2s reaches" not in default

    stated = celery_lease({**env, "LEASE_TTL": "40", "CONSUMER_TIMEOUT": "30"}, "doctor")
    assert (
        "WARN task ops.hold: lease_ttl=40s reaches RabbitMQ's consumer_timeout=30s "
        "(lease_rabbitmq_consumer_timeout)"
    ) in stated.stdout
    assert "fix: keep lease_ttl below 30s, or raise consumer_timeout" in stated.stdout
    assert "acks_late is on" not in stated.stdout
    strict = celery_lease(
        {**env, "LEASE_TTL": "40", "CONSUMER_TIMEOUT": "30"}, "doctor", "--strict"
    )
    assert strict.returncode == 1

    per_queue = {**env, "LEASE_TTL": "40", "CONSUMER_TIMEOUT": "30"}
    raised = celery_lease({**per_queue, "QUEUE_CONSUMER_TIMEOUT": "3600000"}, "doctor", "--strict")
    assert raised.returncode == 0, raised.stdout + raised.stderr  # the queue's 3600 s holds 40 s
    assert "consumer_timeout" not in raised.stdout

    on_redis = celery_lease({**_env(redis_url, "doctor-redis"), "ACKS_LATE": "1"}, "doctor")
    assert "consumer_timeout" not in on_redis.stdout and "visibility_timeout" in on_redis.stdout

    bad = celery_lease({**env, "CONSUMER_TIMEOUT": "-1"}, "doctor")
    assert bad.returncode == 1
    assert (
        "FAIL task ops.hold: lease_rabbitmq_consumer_timeout (float seconds) must be a positive "
        "number, not -1.0"
    ) in bad.stdout


def test_without_an_app_the_cli_says_how_to_give_one(redis_url: str) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_")}
    environ["PYTHONPATH"] = str(REPO_ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "celery", "lease", "ls"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=30,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 2, done.stderr
    assert (
        "lease_backend is not set (app settings) and broker_url is not set either" in done.stderr
    )  # what is wrong...
    assert "hint: no app was given" in done.stderr and "celery -A proj lease" in done.stderr


def test_a_store_error_keeps_its_message_and_no_command_shows_a_credential(
    redis_url: str,
) -> None:
    dead = f"redis://user:s3cr3t@127.0.0.1:{free_port()}/0"
    done = celery_lease(_env(redis_url, "q"), "ls", "--url", dead)
    assert done.returncode == 1
    assert done.stderr.startswith(
        "lease store error: ConnectionError: Error 111 connecting to 127.0.0.1"
    ), done.stderr
    for args in (
        ("ls", "--url", dead),
        ("doctor", "--url", dead),
        ("release", "k", "--url", dead, "--yes"),
    ):
        run = celery_lease(_env(redis_url, "q", LEASE_BACKEND=dead), *args)
        assert run.returncode != 0 and "s3cr3t" not in run.stdout + run.stderr, args
    doctor = celery_lease(_env(redis_url, "q", LEASE_BACKEND=dead), "doctor")
    assert "user:**@127.0.0.1" in doctor.stdout and "s3cr3t" not in doctor.stdout
