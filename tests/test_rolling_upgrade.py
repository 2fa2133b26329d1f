"""A rolling upgrade: workers of the previous landed version and of this one share one Redis,
contending for the same keys, and never run two executions of one key at once.

The previous version is :data:`PREVIOUS`, the parent of the commit that gave the stored lease
value its format version (``"v"`` in the holder JSON): what a fleet runs before it upgrades
to a version writing the marker. It is taken from the repository's history (``git archive``)
into a virtualenv of its own under ``.venv-prev/`` (kept between runs), whose dependencies are
this environment's. Its worker's ``PYTHONPATH`` holds only ``tests/apps``, so it imports that
version of ``celery_lease``; each body records which file it imported.

The run: a worker of the previous version takes jobs alone, a worker of this version joins
while jobs keep coming, then the old one leaves (a warm shutdown), as a fleet upgrades one
worker at a time. Every body is recorded (tests/apps/rolling_app.py) and held to the chaos
checker's rules: no body ran while a later holder of its key was granted (silent losers), and
fencing tokens rose with every grant, whichever version issued them.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sysconfig
import tarfile
import time
import venv
from pathlib import Path
from typing import Any

import pytest
import redis

from example_project.chaos.checker import fencing_order, silent_losers
from example_project.chaos.history import Execution, History
from tests.support.fixtures import WorkerFactory
from tests.support.workers import REPO_ROOT, CeleryWorker

#: The previous landed version: main before the stored formats carried a version marker
#: (the parent of the commit that added it). Pinned, so the test keeps meaning "the version a
#: fleet upgrades from"; move it forward when a later change alters what is stored.
#: ``CELERY_LEASE_PREVIOUS=<commit>`` runs it against another one (the last landed main, to
#: check a change that should alter nothing).
PINNED = "c720cc51249a0f0193fd31124f607e17c60edca3"
PREVIOUS = os.environ.get("CELERY_LEASE_PREVIOUS") or PINNED
APPS = REPO_ROOT / "tests" / "apps"
TAGS = ("a", "b", "c")


def previous_python() -> Path:
    """The interpreter of the virtualenv holding :data:`PREVIOUS` (built once, then reused)."""
    home = REPO_ROOT / ".venv-prev" / PREVIOUS[:12]
    python = home / "bin" / "python"
    if python.exists():
        return python
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: the previous version comes from its history")
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", PREVIOUS, "celery_lease"],
        capture_output=True,
        timeout=60,
    )
    if archive.returncode != 0:
        pytest.fail(
            f"commit {PREVIOUS} is not in this clone ({archive.stderr.decode()!r}): "
            f"fetch the history (git fetch --unshallow)"
        )
    building = home.with_name(home.name + f".{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    venv.create(building, with_pip=False, symlinks=True)
    site = Path(
        subprocess.run(
            [
                str(building / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12+: no path leaves ``site``
            tar.extractall(site, filter="data")
        else:
            tar.extractall(site)
    # The dependencies (celery, redis-py...) are this environment's; its .pth files are not
    # read from there, so its editable install of this version stays out.
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    building.rename(home)
    return python


class PreviousWorker(CeleryWorker):
    """A ``celery worker`` run by the previous version's interpreter, on ``tests/apps`` only."""

    python = Path()

    def command(self) -> list[str]:
        """The worker's command line, with the previous version's interpreter."""
        return [str(self.python), *super().command()[1:]]

    def environ(self) -> dict[str, str]:
        """The environment, without the repository (and its ``celery_lease``) on the path."""
        return {**super().environ(), "PYTHONPATH": str(APPS)}


def start(factory: WorkerFactory, kind: type[CeleryWorker], env: dict[str, str]) -> Any:
    worker = kind(
        "rolling_app",
        pool="threads",
        concurrency=4,
        queue=factory.queue,
        env=env,
        log_dir=factory.log_dir,
    )
    factory.workers.append(worker)
    factory._cleanup.callback(worker.stop)
    return worker.start().wait_ready(30)


def execution(entry: dict[str, Any]) -> Execution:
    return Execution(
        token=entry["token"],
        key=entry["key"],
        job=entry["task_id"],
        task_id=entry["task_id"],
        fence=entry["fence"],
        worker=entry["node"],
        pid=entry["pid"],
        grant_lower=entry["prerun"],
        grant_upper=entry["start"],
        body_end=entry["end"],
        outcome="ok",
        released=True,
    )


@pytest.mark.timeout(180)
def test_the_previous_and_the_current_version_share_one_store_and_never_run_a_key_twice(
    redis_url: str, worker_factory: WorkerFactory
) -> None:
    PreviousWorker.python = previous_python()
    env = {
        "TEST_BROKER_URL": redis_url,
        "TEST_RESULT_BACKEND": redis_url,
        "TEST_QUEUE": worker_factory.queue,
        "PYTHONPATH": str(APPS),
    }
    from celery import Celery

    client = Celery("producer", broker=redis_url, backend=redis_url)
    client.conf.task_default_queue = worker_factory.queue
    journal = redis.Redis.from_url(redis_url)
    results = []

    def send(count: int) -> None:
        for i in range(count):
            results.append(client.send_task("rolling.step", (TAGS[i % len(TAGS)],)))
            time.sleep(0.01)

    started = time.time()
    old = start(worker_factory, PreviousWorker, env)
    send(60)
    new = start(worker_factory, CeleryWorker, env)
    send(240)  # both versions take these
    old.stop()
    send(30)
    outcomes = [r.get(timeout=60) for r in results]
    new.stop()

    entries = [json.loads(x) for x in journal.lrange("journal", 0, -1)]
    by_task = {e["task_id"]: e for e in entries}
    previous = {e["task_id"] for e in entries if is_previous(e)}
    current = {e["task_id"] for e in entries if not is_previous(e)}
    assert previous and current
    assert all(
        e["library"].startswith(str(REPO_ROOT / "celery_lease"))
        for e in entries
        if not is_previous(e)
    )
    # What each version stored: the holder JSON with its version marker only from this one
    # (a later previous version, CELERY_LEASE_PREVIOUS, writes it too).
    assert all(('"v":1' in by_task[t]["value"]) is (PREVIOUS != PINNED) for t in previous)
    assert all('"v":1' in by_task[t]["value"] for t in current)

    history = History(
        ttl=2.0,
        started_at=started,
        nemesis_end=started,
        finished_at=time.time(),
        executions=[execution(e) for e in entries],
    )
    assert silent_losers(history) == []  # never two bodies of one key at once
    assert fencing_order(history) == []  # tokens rose across both versions' grants

    # Every other call was a conflict: skipped, naming a holder that ran, as each version
    # parsed it from the other's value; and each version met the other's leases.
    skipped = [o for o in outcomes if isinstance(o, dict) and o.get("lease_skipped")]
    assert len(skipped) + len(entries) == len(results)
    assert all(o["holder_task_id"] in by_task for o in skipped)
    conflicts = [json.loads(x) for x in journal.lrange("conflicts", 0, -1)]
    met = {
        (is_previous(c), c["holder_task_id"] in previous)
        for c in conflicts
        if c["holder_task_id"] in by_task
    }
    assert {(True, False), (False, True)} <= met, met


def is_previous(entry: dict[str, Any]) -> bool:
    """True for a record made under the previous version (its celery_lease file)."""
    return ".venv-prev" in entry["library"]
