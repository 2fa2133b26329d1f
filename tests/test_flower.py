"""Lease outcomes in a real Flower process, read through its HTTP API and pages.

Flower runs with the example project's ``flowerconfig.py``. A refused duplicate and a lost
lease must show on the task (state, lease key, holder, cause) in the API, the task list data
and the task page; renewals must not add events.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_lease import LeaseLost, store
from harness.redis_server import free_port
from harness.waiting import poll, wait_for
from harness.workers import CeleryProcess
from tests.support.fixtures import WorkerFactory
from tests.support.workers import BROKER_URL_ENV, QUEUE_ENV, REPO_ROOT, RESULT_BACKEND_ENV

APP = "tests.apps.ops_app"
FLOWERCONFIG = REPO_ROOT / "example_project" / "flowerconfig.py"
SCREENSHOT = REPO_ROOT / "docs" / "img" / "flower-task.png"


class Flower(CeleryProcess):
    """A ``celery -A <app> flower`` subprocess on a free port, started at once."""

    kind = "flower"

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        super().__init__(
            APP,
            [
                "flower",
                f"--port={self.port}",
                "--address=127.0.0.1",
                f"--conf={FLOWERCONFIG}",
                "--db=" + str(log_dir / "fl"),
            ],
            env={**env, "FLOWER_UNAUTHENTICATED_API": "true"},
            log_dir=log_dir,
            name="flower",
        )
        self.start()

    def log(self) -> str:
        return self.log_text()

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return 0, ""

    def json(self, path: str) -> Any:
        status, body = self.get(path)
        assert status == 200, f"{path}: {status} {body[:300]}"
        return json.loads(body)

    def post(self, path: str, form: dict[str, str]) -> Any:
        data = urllib.parse.urlencode(form).encode()
        with urllib.request.urlopen(self.base + path, data=data, timeout=5) as response:
            return json.loads(response.read().decode())


@pytest.fixture
def flower_setup(
    redis_url: str, worker_factory: WorkerFactory, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    env = {
        BROKER_URL_ENV: redis_url,
        RESULT_BACKEND_ENV: redis_url,
        QUEUE_ENV: worker_factory.queue,
        "LEASE_TTL": "1.5",
    }
    flower = Flower(env, tmp_path)
    try:
        wait_for(
            lambda: flower.get("/healthcheck")[0] == 200, 30, message=lambda: flower.log()[-3000:]
        )
        worker = worker_factory(APP, pool="threads", concurrency=3, env=env, extra_args=["-E"])
        from celery import Celery

        app = Celery("client", broker=redis_url, backend=redis_url)
        app.conf.task_default_queue = worker_factory.queue
        # Flower only sees events sent after it connected: wait until a task shows up.
        probe = app.send_task("ops.tick", kwargs={"tag": "probe"})
        wait_for(
            lambda: flower.get(f"/api/task/info/{probe.id}")[0] == 200,
            20,
            message=lambda: flower.log()[-3000:],
        )
        yield {
            "flower": flower,
            "worker": worker,
            "app": app,
            "client": redis.Redis.from_url(redis_url),
        }
        worker.kill()
    finally:
        flower.stop()


def _skipped_and_lost(setup: dict[str, Any]) -> tuple[Any, Any, Any, str]:
    app, client = setup["app"], setup["client"]
    holder = app.send_task("ops.hold", ("report", 30))
    wait_for(lambda: client.llen("started") >= 1, 15, message=setup["worker"].log_tail)
    duplicate = app.send_task("ops.hold", ("report", 30))
    assert duplicate.get(timeout=15)["lease_skipped"] is True
    key = next(
        k.decode()
        for k in client.scan_iter(match="lease:{ops.hold:*", _type="STRING")
        if not k.endswith(b":fence")
    )
    value = client.get(key)
    assert value is not None
    # Hold it through several renewals, then take the lease away as an operator would.
    renewed = store.parse_value(value)
    held_until = time.monotonic() + 3.5  # over two TTLs of 1.5 s: it must have renewed
    wait_for(lambda: time.monotonic() >= held_until, 5)
    assert client.get(key) == value and client.pttl(key) > 0
    assert store.revoke(client, key, renewed.token)
    with pytest.raises(LeaseLost):
        holder.get(timeout=15)
    return holder, duplicate, renewed, key


def _task_list(flower: Flower) -> dict[str, Any]:
    """The rows of Flower's task list (the data behind its /tasks table), by task id."""
    page = flower.post(
        "/tasks/datatable",
        {
            "draw": "1",
            "start": "0",
            "length": "50",
            "search[value]": "",
            "order[0][column]": "0",
            "order[0][dir]": "desc",
            "columns[0][data]": "received",
        },
    )
    return {row["uuid"]: row for row in page["data"]}


def test_flower_shows_a_skipped_duplicate_and_a_lost_lease(flower_setup: dict[str, Any]) -> None:
    flower = flower_setup["flower"]
    holder, duplicate, held, key = _skipped_and_lost(flower_setup)
    worker_where = f"{flower_setup['worker'].hostname}:{flower_setup['worker'].pid}"

    skipped = wait_for(
        lambda: (t := flower.json(f"/api/task/info/{duplicate.id}")).get("lease_key") and t, 15
    )
    assert skipped["state"] == "LEASE-SKIPPED"
    assert skipped["lease_key"] == key
    assert skipped["lease_holder"] == worker_where
    assert skipped["lease_holder_task_id"] == holder.id
    assert skipped["lease_cause"] == "held by another execution"
    assert skipped["lease"] == "skipped (lease held)"
    # Durations are rounded to the millisecond (the event carries the raw float).
    assert skipped["lease_remaining"] == round(skipped["lease_remaining"], 3)
    assert 0 < skipped["lease_remaining"] <= 1.5

    lost = wait_for(
        lambda: (
            (t := flower.json(f"/api/task/info/{holder.id}")).get("state") == "FAILURE"
            and t.get("lease_key")
            and t
        ),
        15,
    )
    assert lost["lease_key"] == key
    assert lost["lease_cause"] == "refused"
    assert lost["lease_holder"] == worker_where
    assert lost["fencing_token"] == held.fencing_token
    # The error as a sentence, not Celery's repr of its arguments.
    assert re.fullmatch(
        re.escape(
            f"LeaseLost: lease {key!r} lost (refused, fencing token {held.fencing_token}, found "
        )
        + r"\d+\.\d{3}s after its last confirmed renewal\)",
        lost["exception"],
    ), lost["exception"]
    assert lost["lease"] == "lost (refused)"

    # The task list (the data behind Flower's /tasks table) has the lease column.
    rows = _task_list(flower)
    assert rows[duplicate.id]["lease"] == "skipped (lease held)"
    assert rows[holder.id]["lease"] == "lost (refused)"
    assert rows[holder.id]["exception"].startswith(f"LeaseLost: lease {key!r} lost (refused")
    status, tasks_page = flower.get("/tasks")
    assert status == 200 and 'data-column="lease"' in tasks_page

    # The task page lists the fields.
    status, html = flower.get(f"/task/{holder.id}")
    assert status == 200
    text = re.sub(r"\s+", " ", html)
    assert "Lease key" in text and key in text
    assert "Lease cause" in text and "refused" in text
    assert "Lease holder" in text and worker_where in text

    # Renewals send no events: the holder renewed several times, yet its events are just
    # received, started, lease-lost and failed.
    metrics = flower.get("/metrics")[1]
    counts = {
        m.group(1): float(m.group(2))
        for m in re.finditer(
            r'flower_events_total\{task="ops.hold",type="([^"]+)",worker="[^"]+"\} (\S+)', metrics
        )
    }
    assert counts == {
        "task-received": 2.0,
        "task-started": 2.0,
        "task-lease-skipped": 1.0,
        "task-lease-lost": 1.0,
        "task-failed": 1.0,
    }, counts


#: The flags every headless Chromium run gets: no GPU, no sandbox (containers run it as
#: root), and none of the background traffic a first run would start.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


@pytest.fixture
def chromium() -> str:
    """Debian's ``chromium``; CI (``.ci/run``) installs it and sets CELERY_LEASE_NEEDS_CHROMIUM."""
    found = shutil.which("chromium")
    if found is None:
        if os.environ.get("CELERY_LEASE_NEEDS_CHROMIUM") == "1":
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium is not installed")
    return found


def _screenshot(
    chromium: str, url: str, target: Path, width: int, profile: Path, height: int = 1000
) -> None:
    subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "--virtual-time-budget=5000",
            f"--screenshot={target}",
            url,
        ],
        check=True,
        capture_output=True,
        timeout=90,
    )
    assert target.stat().st_size > 10_000, target


def test_the_task_page_and_the_tasks_list_in_a_browser(
    chromium: str, flower_setup: dict[str, Any], tmp_path: Path
) -> None:
    """Both pages render in headless Chromium at 1280 and 1024 pixels wide.

    With CELERY_LEASE_SCREENSHOT=1 the whole task page at 1280 px (down to the lease fields)
    is written to docs/img/ for the docs; the screenshots stay in the test's temporary
    directory otherwise.
    """
    flower = flower_setup["flower"]
    holder, _, _, _ = _skipped_and_lost(flower_setup)
    wait_for(lambda: flower.json(f"/api/task/info/{holder.id}").get("state") == "FAILURE", 15)
    for width in (1280, 1024):
        for page, path in (("task", f"/task/{holder.id}"), ("tasks", "/tasks")):
            target, height = tmp_path / f"flower-{page}-{width}.png", 1000
            if (page, width) == ("task", 1280):
                height = 2000
                if os.environ.get("CELERY_LEASE_SCREENSHOT") == "1":
                    target = SCREENSHOT
            target.parent.mkdir(parents=True, exist_ok=True)
            # A fresh profile each time: nothing cached or remembered between runs.
            _screenshot(
                chromium,
                flower.base + path,
                target,
                width,
                tmp_path / f"profile-{page}-{width}",
                height,
            )


def test_flower_shows_a_coalesced_and_a_queued_duplicate(flower_setup: dict[str, Any]) -> None:
    flower, app, client = flower_setup["flower"], flower_setup["app"], flower_setup["client"]
    coalesce_holder = app.send_task("ops.hold_coalesce", ("c", 30))
    queue_holder = app.send_task("ops.hold_queue", ("q", 30))
    wait_for(lambda: client.llen("started") >= 2, 15, message=flower_setup["worker"].log_tail)
    coalesced = app.send_task("ops.hold_coalesce", ("c", 30))
    queued = app.send_task("ops.hold_queue", ("q", 30))
    marker = coalesced.get(timeout=15)
    assert marker["lease_coalesced"] is True

    shown = wait_for(
        lambda: (t := flower.json(f"/api/task/info/{coalesced.id}")).get("lease_key") and t,
        15,
        message=lambda: flower.log()[-3000:],
    )
    assert shown["state"] == "LEASE-COALESCED"
    assert shown["lease"] == "coalesced (pending run)"
    assert shown["lease_into"] == marker["into"]
    assert shown["lease_holder_task_id"] == coalesce_holder.id
    assert shown["lease_key"].startswith("lease:{ops.hold_coalesce:")

    waiting = wait_for(
        lambda: (t := flower.json(f"/api/task/info/{queued.id}")).get("lease_key") and t,
        15,
        message=lambda: flower.log()[-3000:],
    )
    assert waiting["state"] == "LEASE-QUEUED"
    assert waiting["lease"] == "queued (#1)"
    assert waiting["lease_position"] == 1
    assert waiting["lease_holder_task_id"] == queue_holder.id
    assert waiting["lease_key"].startswith("lease:{ops.hold_queue:")
    assert queued.state == "PENDING"  # its caller's result completes when it has run

    # Both show in the task list's lease column.
    rows = _task_list(flower)
    assert rows[coalesced.id]["lease"] == "coalesced (pending run)"
    assert rows[queued.id]["lease"] == "queued (#1)"


def test_a_lease_event_names_its_task_so_no_flower_metric_has_an_empty_task_label(
    redis_url: str, worker_factory: WorkerFactory, tmp_path: Path
) -> None:
    from celery import Celery

    env = {
        BROKER_URL_ENV: redis_url,
        RESULT_BACKEND_ENV: redis_url,
        QUEUE_ENV: worker_factory.queue,
        "LEASE_TTL": "1.5",
    }
    worker = worker_factory(APP, pool="threads", concurrency=3, env=env, extra_args=["-E"])
    app = Celery("client", broker=redis_url, backend=redis_url)
    app.conf.task_default_queue = worker_factory.queue
    client = redis.Redis.from_url(redis_url)
    holder = app.send_task("ops.hold", ("late", 30))
    wait_for(lambda: client.llen("started") >= 1, 15, message=worker.log_tail)
    # Flower starts after the holder's task-received: the lease's loss is the first event
    # of that task it sees (as after a Flower restart, or events arriving out of order).
    flower = Flower(env, tmp_path)
    try:
        wait_for(lambda: flower.get("/healthcheck")[0] == 200, 30, message=flower.log)

        def probe_seen() -> bool:  # a probe sent before Flower listened is never seen: again
            probe = app.send_task("ops.tick", kwargs={"tag": "probe"})
            return bool(poll(lambda: flower.get(f"/api/task/info/{probe.id}")[0] == 200, 3.0))

        wait_for(probe_seen, 30, message=lambda: flower.log()[-3000:])
        key = next(
            k.decode()
            for k in client.scan_iter(match="lease:{ops.hold:*", _type="STRING")
            if not k.endswith(b":fence")
        )
        value = client.get(key)
        assert value is not None and store.revoke(client, key, store.parse_value(value).token)
        with pytest.raises(LeaseLost):
            holder.get(timeout=15)
        wait_for(lambda: "task-failed" in flower.get("/metrics")[1], 15)
        metrics = flower.get("/metrics")[1]
        samples = [line for line in metrics.splitlines() if line.startswith("flower_")]
        lost = [
            line
            for line in samples
            if line.startswith("flower_events_total{") and 'type="task-lease-lost"' in line
        ]
        assert len(lost) == 1 and 'task="ops.hold"' in lost[0], samples
        assert [line for line in samples if 'task=""' in line] == []
    finally:
        flower.stop()
        worker.kill()
