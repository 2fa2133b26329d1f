"""The example project: its fenced stores, and its tasks on a real worker and a real beat."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from celery_lease import is_skipped
from example_project.celery_app import make_app
from example_project.fencing import RedisFencedStore, SqliteFencedStore
from harness import REPO_ROOT
from harness.waiting import wait_for
from tests.support.fixtures import WorkerFactory

APP = "example_project.celery_app"


# -- the fencing guard --------------------------------------------------------------------------


def _check_guard(store: RedisFencedStore | SqliteFencedStore) -> None:
    assert store.write("ledger:1", "first", 5)
    assert not store.write("ledger:1", "stale", 4)  # lower token: refused
    assert store.write("ledger:1", "again", 5)  # the same holder writes again
    assert store.write("ledger:1", "newer", 6)
    assert not store.write("ledger:1", "stale again", 5)
    # Tokens beyond 2**53 (where a double loses precision) still compare exactly.
    assert store.write("ledger:2", "big", 2**60 + 1)
    assert not store.write("ledger:2", "big-1", 2**60)
    record = store.read("ledger:1")
    assert (record.value, record.fence, record.accepted, record.refused) == ("newer", 6, 3, 2)
    assert store.read("absent").fence == 0


def test_redis_fenced_store_refuses_a_lower_token(redis_url: str) -> None:
    _check_guard(RedisFencedStore(redis.Redis.from_url(redis_url), prefix="t"))


def test_sqlite_fenced_store_refuses_a_lower_token(tmp_path: Path) -> None:
    store = SqliteFencedStore(str(tmp_path / "fenced.db"))
    try:
        _check_guard(store)
    finally:
        store.close()


# -- the tasks on a real worker -----------------------------------------------------------------


def _client_app(redis_url: str) -> Celery:
    app = make_app(redis_url)
    app.conf.lease_ttl = 2.0
    return app


def _worker_env(redis_url: str, **extra: str) -> dict[str, str]:
    return {"REDIS_URL": redis_url, "LEASE_TTL": "2.0", **extra}


def test_sync_account_is_leased_per_account_not_per_call(
    redis_url: str, worker_factory: WorkerFactory
) -> None:
    worker_factory(APP, pool="threads", concurrency=4, env=_worker_env(redis_url))
    app = _client_app(redis_url)
    queue = worker_factory.queue
    calls = [
        app.send_task("example_project.tasks.sync_account", (42,), queue=queue),
        app.send_task(
            "example_project.tasks.sync_account", (42,), {"since": "2024-01-01"}, queue=queue
        ),
        app.send_task("example_project.tasks.sync_account", (43,), queue=queue),
    ]
    results = [call.get(timeout=30) for call in calls]
    skipped = [r for r in results if is_skipped(r)]
    ran = [r for r in results if not is_skipped(r)]
    # The two calls for account 42 share one lease (lease_key=("account_id",)); 43 has its own.
    assert len(skipped) == 1 and sorted(r["account_id"] for r in ran) == [42, 43], results
    assert all(r["pages"] == 3 for r in ran)
    ledger = RedisFencedStore(redis.Redis.from_url(redis_url), prefix="example")
    assert ledger.read("ledger:42").fence == next(
        r["fencing_token"] for r in ran if r["account_id"] == 42
    )


def test_reindex_checkpoints_on_lease_lost_and_the_next_run_resumes(
    redis_url: str, worker_factory: WorkerFactory
) -> None:
    worker = worker_factory(APP, pool="prefork", concurrency=1, env=_worker_env(redis_url))
    app = _client_app(redis_url)
    client = redis.Redis.from_url(redis_url)
    first = app.send_task(
        "example_project.tasks.reindex",
        ("products",),
        {"total_batches": 40},
        queue=worker_factory.queue,
    )
    key = wait_for(
        lambda: next(iter(client.scan_iter(match="lease:{*reindex*}")), None),
        10,
        message=lambda: worker.log_tail(),
    )
    # Let some batches run: wait until the lease has been renewed once (a third of the TTL).
    lifetimes: list[int] = []

    def renewed() -> bool:
        lifetimes.append(int(client.pttl(key)))
        return len(lifetimes) > 1 and lifetimes[-1] > lifetimes[-2]

    wait_for(renewed, 5, message=lambda: f"{lifetimes}\n{worker.log_tail()}")
    client.delete(key)  # the lease disappears (an operator, an eviction): the holder must stop
    wait_for(first.ready, 10, message=lambda: worker.log_tail())
    assert first.failed() and type(first.result).__name__ == "LeaseLost"
    checkpoint = int(RedisFencedStore(client, prefix="example").read("reindex:products").value or 0)
    assert 0 < checkpoint < 40, worker.log_tail()
    assert "checkpoint saved" in worker.log_text()
    second = app.send_task(
        "example_project.tasks.reindex",
        ("products",),
        {"total_batches": 40},
        queue=worker_factory.queue,
    )
    outcome: dict[str, Any] = second.get(timeout=30)
    assert outcome == {"index": "products", "resumed_from": checkpoint, "batches": 40}


def test_beat_ticks_that_arrive_during_a_slow_run_are_skipped(
    redis_url: str, worker_factory: WorkerFactory, tmp_path: Path
) -> None:
    # beat sends refresh_dashboard every 0.5 s; each run takes 1.2 s: ticks overlap runs.
    env = _worker_env(redis_url, DASHBOARD_PERIOD="0.5", DASHBOARD_WORK_SECONDS="1.2")
    worker = worker_factory(
        APP,
        pool="threads",
        concurrency=4,
        queue="celery",
        env=env,
        extra_args=["-B", "-s", str(tmp_path / "beat-schedule")],
    )
    client = redis.Redis.from_url(redis_url)

    def outcomes() -> list[dict[str, Any]]:
        found = []
        for key in client.scan_iter(match="celery-task-meta-*"):
            meta = json.loads(client.get(key) or b"{}")
            if meta.get("status") == "SUCCESS":
                found.append(meta["result"])
        return found

    wait_for(
        lambda: (
            sum(not is_skipped(r) for r in outcomes()) >= 2
            and sum(is_skipped(r) for r in outcomes()) >= 2
        ),
        20,
        message=lambda: f"{outcomes()}\n{worker.log_tail()}",
    )
    runs = [r for r in outcomes() if not is_skipped(r)]
    assert all(r["seconds"] >= 1.2 for r in runs)
    skipped = [r for r in outcomes() if is_skipped(r)]
    assert all(r["key"].endswith("refresh_dashboard}") for r in skipped)


# -- python -m example_project compare ----------------------------------------------------------


def test_compare_deletes_every_key_it_and_the_peers_wrote(redis_url: str, tmp_path: Path) -> None:
    """The crash scene leaves locks with no expiry (celery-singleton's defaults) and outside the
    run's prefix (celery-once's ``qo_`` keys); none of them may outlive the run."""
    figures = tmp_path / "compare.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "example_project",
            "compare",
            "--redis-url",
            redis_url,
            "--lock",
            "1",
            "--scene",
            "crash",
            "--json",
            str(figures),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    crash = json.loads(figures.read_text())["results"]["crash"]
    # The keys existed: the defaults' locks outlived the SIGKILL (none at all for singleton).
    assert crash["celery-singleton"]["lock left after SIGKILL, library defaults (s)"] == "no expiry"
    assert crash["celery-once"]["lock left after SIGKILL, library defaults (s)"] > 3000
    left = redis.Redis.from_url(redis_url).keys("*")
    assert left == [], left
    # Progress says what it waits for, never a bare "...".
    lines = run.stdout.splitlines()
    assert not [line for line in lines if line.strip() == "..."]
    assert any(line.startswith("== [3/3] crash: celery-singleton") for line in lines)
    assert "keys this run wrote" in run.stdout
