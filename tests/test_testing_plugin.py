"""The pytest plugin celery_lease.ops.testing, and docs/howto/testing.md run exactly as shown."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_lease import LeasedTask
from celery_lease.ops import testing
from celery_lease.ops.testing import LeaseRedis, use_lease_backend

ROOT = Path(__file__).resolve().parent.parent
TITLED_BLOCK = re.compile(r'^```(?:python|toml) title="([^"]+)"\n(.*?)^```$', re.S | re.M)


def titled_blocks(page: str) -> dict[str, str]:
    """The code blocks of a docs page that carry a file name (``title="..."``), by name."""
    text = (ROOT / "docs" / page).read_text()
    return {name: body for name, body in TITLED_BLOCK.findall(text)}


def write_project(tmp_path: Path, files: dict[str, str]) -> None:
    for name, body in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)  # folders without __init__.py import as namespace packages


def test_the_fixture_is_an_empty_real_redis(lease_redis: LeaseRedis) -> None:
    assert lease_redis.url.startswith("redis://127.0.0.1:")
    assert lease_redis.client.dbsize() == 0
    lease_redis.client.set("left-behind", "1")
    assert lease_redis.client.eval("return redis.call('GET', KEYS[1])", 1, "left-behind") == b"1"


def test_the_next_test_starts_empty(lease_redis: LeaseRedis) -> None:
    assert lease_redis.client.dbsize() == 0


def test_the_session_server_is_gone_when_the_session_ends() -> None:
    session = testing.lease_redis_server.__wrapped__()  # the fixture's function, as pytest runs it
    server = next(session)
    assert server.client.set("written", "1") and server.client.get("written") == b"1"
    pid = server.client.info("server")["process_id"]
    for _ in session:  # the teardown
        pass
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(server.url, socket_connect_timeout=1.0).ping()


def test_use_lease_backend_points_the_tasks_at_the_store_and_restores(
    lease_redis: LeaseRedis,
) -> None:
    app = Celery("plugin-check", broker="redis://127.0.0.1:1/0", set_as_current=False)

    @app.task(base=LeasedTask, bind=True, shared=False)
    def job(self: LeasedTask) -> str:
        assert self.lease is not None
        return self.lease.key

    assert job.lease_settings()[1] == "redis://127.0.0.1:1/0"  # resolved once, from the broker
    with use_lease_backend(app, lease_redis.url):
        assert job.lease_settings()[1] == lease_redis.url
        assert job.apply().get() == job.lease_key_for(())
    assert "lease_backend" not in app.conf or app.conf.lease_backend is None
    assert job.lease_settings()[1] == "redis://127.0.0.1:1/0"


def test_the_testing_how_to_runs_as_shown_with_a_plain_pytest_command(tmp_path: Path) -> None:
    files = titled_blocks("howto/testing.md")
    assert set(files) == {
        "pyproject.toml",
        "proj/tasks.py",
        "tests/conftest.py",
        "tests/test_eager.py",
        "tests/test_worker.py",
    }
    write_project(tmp_path, files)
    # `pytest` as the page says: the console script (which, unlike `python -m pytest`, does not
    # put the current directory on sys.path) and no PYTHONPATH, so `proj` must be importable
    # through what the page itself gives.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    run = subprocess.run(
        [
            str(Path(sys.executable).with_name("pytest")),
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-o",
            "timeout=60",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"\b4 passed\b", run.stdout), run.stdout


LIBRARY_APP = """
import pytest
import redis
from celery import Celery

app = Celery("lib", broker="memory://", backend="cache+memory://")


@app.task(name="lib.plain_job")
def plain_job(x):
    from celery_lease import current_lease  # at run time: this module never imports it

    lease = current_lease()
    return lease.key if lease is not None else None
"""

LIBRARY_TEST = """
from lib_app import app, plain_job


def test_the_plugin_leases_a_task_named_by_the_setting_before_anything_finalized_the_app(
        lease_redis):
    app.conf.update(lease_backend=lease_redis.url, task_always_eager=True,
                    lease_tasks={"lib.plain_job": {}})
    assert not app.finalized
    assert plain_job.delay(1).get().startswith("lease:{lib.plain_job:")
    assert plain_job.apply((1,)).get().startswith("lease:{lib.plain_job:")
"""


def test_the_plugin_alone_leases_tasks_named_by_lease_tasks_on_every_path(tmp_path: Path) -> None:
    # Neither the app's module nor the test imports celery_lease before the task runs: the
    # plugin pytest loads by itself is what applies the setting.
    write_project(tmp_path, {"lib_app.py": LIBRARY_APP, "test_lib.py": LIBRARY_TEST})
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-o",
            "timeout=60",
            "test_lib.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"\b1 passed\b", run.stdout), run.stdout
