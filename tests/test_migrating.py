"""docs/howto/migrating.md: the before and after code of the migration guide.

The "before" modules use celery-once and celery-singleton (both in the bench extra, which the
test extra includes): the options they set must be ones those libraries read. The "after"
modules must resolve to the lease settings the tables promise, answer a duplicate at
``delay()`` (``lease_dedupe``), and a worker of one, which has no result backend, must not
claim to store the skip marker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from celery_lease import store
from harness.workers import CeleryWorker
from tests.support.waiting import wait_for
from tests.test_testing_plugin import titled_blocks, write_project

CHECK = """\
import json
import celery_once.tasks, celery_singleton.config, celery_singleton.singleton
from before import once_tasks as once_before, singleton_tasks as singleton_before
from after import once_tasks as once_after, singleton_tasks as singleton_after

def lease(task):
    options, url, _ = task.lease_settings()
    return {"url": url, "ttl": options.ttl, "on_conflict": options.on_conflict,
            "dedupe": options.dedupe,
            "key": task.lease_key_for((42,), {"since": "x"}),
            "key_43": task.lease_key_for((43,))}

singleton_task = singleton_before.sync_account
config = celery_singleton.config.Config(singleton_before.app)
print(json.dumps({
    "once": once_before.sync_account.once,
    "once_timeout": once_before.sync_account.default_timeout,
    "singleton": [singleton_task.unique_on, singleton_task.raise_on_duplicate,
                  config.backend_url, config.key_prefix, config.lock_expiry],
    "once_after": lease(once_after.sync_account),
    "singleton_after": lease(singleton_after.sync_account),
    "key_42_again": once_after.sync_account.lease_key_for((42,)),
}))
"""


def test_the_migration_examples_set_real_options_and_map_to_lease_settings(
    tmp_path: Path,
) -> None:
    files = titled_blocks("howto/migrating.md")
    assert set(files) == {
        "before/once_tasks.py",
        "after/once_tasks.py",
        "before/singleton_tasks.py",
        "after/singleton_tasks.py",
    }
    files["check.py"] = CHECK
    write_project(tmp_path, files)
    run = subprocess.run(
        [sys.executable, "check.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    # celery-once reads exactly these task options (celery_once/tasks.py)
    assert set(seen["once"]) <= {"keys", "graceful", "timeout", "unlock_before_run"}
    assert seen["once_timeout"] == 3600
    assert seen["singleton"] == [
        ["account_id"],
        False,
        "redis://localhost:6379/1",
        "SINGLETONLOCK_",
        600,
    ]
    # celery-once refuses a duplicate; celery-singleton's caller is served by a later run.
    conflicts = {"once_after": "skip", "singleton_after": "retry"}
    for name, conflict in conflicts.items():
        after = seen[name]
        assert after["url"] == "redis://localhost:6379/1"
        assert after["ttl"] == 30.0 and after["on_conflict"] == conflict
        assert after["dedupe"] is True  # the answer at delay() time, as both libraries give
        assert after["key"] != after["key_43"]  # one lease per account, whatever `since` is
    assert seen["once_after"]["key"] == seen["key_42_again"]


PUBLISH = """\
import json, sys
from after import once_tasks
queued, again = once_tasks.sync_account.delay(42), once_tasks.sync_account.delay(42)
print(json.dumps([queued.id, again.id, queued.lease_disposition, again.lease_disposition]))
"""


def test_the_once_after_app_answers_at_delay_and_its_worker_says_it_stores_no_skip_marker(
    tmp_path: Path, redis_url: str
) -> None:
    files = {
        name: body.replace("redis://localhost:6379/0", redis_url).replace(
            "redis://localhost:6379/1", redis_url
        )
        for name, body in titled_blocks("howto/migrating.md").items()
    }
    write_project(tmp_path, {**files, "publish.py": PUBLISH})
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "publish.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    queued, again, *dispositions = json.loads(run.stdout)
    assert again == queued and dispositions == ["published", "deduplicated"]
    # Another execution holds account 42's lease: the worker skips the waiting copy.
    key = _key_of_account_42(tmp_path, env)
    client = store.client_for(redis_url, 2.0)
    assert store.acquire(client, key, "b" * 32, 30_000, "{}").granted
    with CeleryWorker("after.once_tasks", env=env, cwd=tmp_path, log_dir=tmp_path) as worker:
        wait_for(
            lambda: "skipped: task" in worker.log_text(), 30, message=lambda: worker.log_tail()
        )
    assert "no result stored (no result backend, or ignore_result)" in worker.log_text()
    assert "result stored as SUCCESS" not in worker.log_text()


def _key_of_account_42(tmp_path: Path, env: dict[str, str]) -> str:
    """Account 42's lease key, as the app computes it."""
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "from after import once_tasks as m; print(m.sync_account.lease_key_for((42,)))",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()
