"""``celery worker`` refusing to start, as a user sees it: a real worker process whose lease
configuration no task can run with prints one readable refusal (no traceback), exits with
``EX_CONFIG`` and never reports ready; an unreachable store is only refused when
``lease_require_noeviction`` promised a check of its eviction policy. The start runs the
checks of ``celery lease doctor``: what the settings alone make fail refuses the start, what
the store's state explains is logged."""

from __future__ import annotations

from pathlib import Path

import pytest
from celery import Celery

from celery_lease import LeasedTask
from celery_lease.errors import EX_CONFIG
from celery_lease.ops.doctor import check_replicas
from celery_lease.ops.worker import check_app
from celery_lease.store import topology
from harness.redis_server import free_port
from harness.waiting import wait_for
from harness.workers import CeleryWorker
from tests.support.fixtures import RedisFactory, WorkerFactory
from tests.support.secure import AclRedisServer


def _refused(worker: CeleryWorker) -> str:
    worker.start()
    code = worker.wait(60)
    output = worker.log_text()
    assert code == EX_CONFIG, output[-3000:]
    assert "ready." not in output
    assert "Traceback" not in output, output[-3000:]
    return output


def test_a_worker_whose_configuration_cannot_work_refuses_in_one_line_without_credentials(
    tmp_path: Path,
) -> None:
    output = _refused(
        CeleryWorker("tests.apps.no_backend_app", pool="solo", queue="refused", log_dir=tmp_path)
    )
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert errors == [
        "Error: celery-lease refused to start this worker: lease_backend is not set (task "
        "no_backend.job) and broker_url 'amqp://guest:**@127.0.0.1:5672//' is not a Redis URL: "
        "set app.conf.lease_backend = 'redis://host:6379/1' to say where leases live"
    ]
    assert "guest:guest" not in output


def test_require_noeviction_with_an_unreachable_store_refuses_to_start(
    tmp_path: Path,
    redis_url: str,
    worker_factory: WorkerFactory,
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    env = {"TEST_BROKER_URL": redis_url, "TEST_QUEUE": worker_factory.queue, "LEASE_BACKEND": dead}
    output = _refused(
        CeleryWorker(
            "tests.apps.lease_app",
            pool="solo",
            queue=worker_factory.queue,
            log_dir=tmp_path,
            env={**env, "LEASE_REQUIRE_NOEVICTION": "1"},
        )
    )
    assert f"lease store {dead} cannot be reached" in output
    assert "lease_require_noeviction=True refuses to start without that check" in output
    # Without the promise, the worker starts and the tasks follow lease_on_store_error.
    started = worker_factory("tests.apps.lease_app", env=env)
    assert "is unreachable (seen by the worker's start check" in started.log_text()


DJANGO_STYLE_PROJECT = {
    "djsettings.py": (
        "# A Django settings module as a Django project writes it (read without Django).\n"
        "DEBUG = False\n"
        "CELERY_BROKER_URL = 'redis://127.0.0.1:1/0'\n"
        "CELERY_LEASE_BACKEND = 'redis://127.0.0.1:1/0'\n"
        "CELERY_LEASE_TLL = 5.0\n"
        "CELERY_LEASE_ON_CONFICT = 'retry'\n"
    ),
    "djproj.py": (
        "from celery import Celery\n"
        "from celery_lease import LeasedTask\n"
        "app = Celery('djproj')\n"
        "app.config_from_object('djsettings', namespace='CELERY')\n"
        "@app.task(shared=False, base=LeasedTask)\n"
        "def sync(account_id): ...\n"
    ),
}


def _last_line_of_refused(tmp_path: Path, module: str, files: dict[str, str]) -> str:
    """The last line a worker of ``module`` (written from ``files`` into ``tmp_path``) prints
    when it refuses to start."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    output = _refused(
        CeleryWorker(
            module,
            pool="solo",
            queue="refused",
            log_dir=tmp_path,
            env={"PYTHONPATH": str(tmp_path)},
        )
    )
    return output.strip().splitlines()[-1]


def test_misspelt_namespaced_settings_stop_a_real_worker_in_one_line(tmp_path: Path) -> None:
    assert _last_line_of_refused(tmp_path, "djproj", DJANGO_STYLE_PROJECT) == (
        "Error: celery-lease configuration error: 2 unknown settings (app.conf): "
        "CELERY_LEASE_ON_CONFICT (lease_on_confict), did you mean CELERY_LEASE_ON_CONFLICT "
        "(lease_on_conflict)?; CELERY_LEASE_TLL (lease_tll), did you mean CELERY_LEASE_TTL "
        "(lease_ttl)?"
    )


def test_lease_options_on_a_task_that_takes_no_lease_stop_a_real_worker_in_one_line(
    tmp_path: Path,
) -> None:
    # base=LeasedTask forgotten: Celery would keep the options as class attributes, unread.
    module = (
        "from celery import Celery\n"
        "import celery_lease\n"
        "app = Celery('straytasks', broker='redis://127.0.0.1:1/0')\n"
        "@app.task(lease_key=('account_id',), lease_ttl=10.0)\n"
        "def sync(account_id): ...\n"
    )
    assert _last_line_of_refused(tmp_path, "straytasks", {"straytasks.py": module}) == (
        "Error: celery-lease configuration error: task straytasks.sync has lease option(s) "
        "lease_key, lease_ttl but takes no lease (they would be ignored and its executions "
        "could overlap): give it base=LeasedTask (from celery_lease import LeasedTask; "
        "@app.task(base=LeasedTask, lease_key=...)), or name it in app.conf.lease_tasks"
    )


def test_a_retry_fallback_the_broker_would_redeliver_is_warned_at_start_with_the_doctors_fix(
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # "retry" waits in the key's line; only a full line falls back to an ETA message of up to
    # lease_ttl, which this broker would deliver again: the start says so and goes on.
    app = Celery("retrying", broker=redis_url, set_as_current=False)
    app.conf.update(
        lease_backend=redis_url,
        lease_on_conflict="retry",
        lease_ttl=10.0,
        broker_transport_options={"visibility_timeout": 5},
    )

    @app.task(base=LeasedTask, name="retrying.job", shared=False)  # type: ignore[misc]
    def job() -> None:
        pass

    with caplog.at_level("WARNING", logger="celery_lease"):
        assert check_app(app)
    assert "which the broker redelivers after visibility_timeout=5s" in caplog.text
    assert "Fix: broker_transport_options={'visibility_timeout': 40}" in caplog.text


def test_min_replicas_with_no_replica_connected_is_logged_at_start_as_the_doctor_says(
    throwaway_redis: RedisFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary = throwaway_redis()
    app = Celery("replicas", broker="memory://", set_as_current=False)
    app.conf.update(lease_backend=primary.url(), lease_min_replicas=1)

    @app.task(base=LeasedTask, name="replicas.job", shared=False)  # type: ignore[misc]
    def job() -> None:
        pass

    with caplog.at_level("WARNING", logger="celery_lease"):
        assert check_app(app)  # it can work once a replica connects: logged, not refused
    assert (
        "lease_min_replicas=1 but 0 replica(s) connected to the primary: every acquire of "
        "replicas.job waits"
    ) in caplog.text
    assert "(celery lease doctor: FAIL)" in caplog.text
    throwaway_redis({"replicaof": ["127.0.0.1", str(primary.port)]})
    wait_for(lambda: topology.connected_replicas(primary.client()) == 1, 15)
    caplog.clear()
    with caplog.at_level("WARNING", logger="celery_lease"):
        check_app(app)
    assert "replica(s) connected" not in caplog.text
    (finding,) = check_replicas(primary.url(), [(job.name, job.lease_settings().options)], app)
    assert (finding.level, finding.message) == (
        "ok",
        "1 replica(s) connected: enough for lease_min_replicas=1",
    )


def test_a_user_with_only_the_task_commands_starts_without_an_error_from_the_doctors_checks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The doctor's latency and clock checks send PING and TIME, which a worker never needs.
    with AclRedisServer(features=("tasks",)) as server:
        app = Celery("tasks_only", broker="memory://", set_as_current=False)
        app.conf.lease_backend = server.lease_url()

        @app.task(base=LeasedTask, name="tasks_only.job", shared=False)  # type: ignore[misc]
        def job() -> None:
            pass

        with caplog.at_level("ERROR", logger="celery_lease"):
            assert check_app(app)
    assert caplog.records == []


def test_the_worker_banner_names_the_lease_store_with_its_password_masked(
    redis_url: str, throwaway_redis: RedisFactory, worker_factory: WorkerFactory
) -> None:
    lease_store = throwaway_redis(config={"requirepass": "banner-pw"})
    url = f"redis://:banner-pw@127.0.0.1:{lease_store.port}/0"
    worker = worker_factory("tests.apps.lease_app", env={"LEASE_BACKEND": url})
    lines = worker.log_text().splitlines()
    section = lines.index(next(line for line in lines if line.strip() == "[lease]"))
    assert lines[section + 1].split() == [
        ".>",
        "store:",
        f"redis://:**@127.0.0.1:{lease_store.port}/0",
    ]
    assert lines.index(next(line for line in lines if ".> results:" in line)) < section
    assert "banner-pw" not in worker.log_text()
