"""An app that leases the tasks of ``tests.apps.thirdparty`` through ``app.conf.lease_tasks``.

Configured from the environment like the smoke app; ``TEST_LEASE_TASKS`` (JSON) replaces the
setting, so a test can give a pattern that matches nothing.
"""

from __future__ import annotations

import json
import os

from celery import Celery

import celery_lease  # noqa: F401 - installs the lease_tasks finalize hook
from tests.support.workers import BROKER_URL_ENV, QUEUE_ENV, RESULT_BACKEND_ENV

LEASE_TASKS = {
    "thirdparty.close_day": {"lease_key": ["day"], "lease_ttl": 3.0},
    "thirdparty.sync_*": {"lease_on_conflict": "skip"},
}

broker = os.environ.get(BROKER_URL_ENV, "redis://127.0.0.1:1/0")
app = Celery(
    "lease_tasks_app",
    broker=broker,
    backend=os.environ.get(RESULT_BACKEND_ENV) or broker,
    include=["tests.apps.thirdparty.tasks"],
)
app.conf.update(
    task_default_queue=os.environ.get(QUEUE_ENV, "celery"),
    broker_connection_retry_on_startup=True,
    result_expires=300,
    lease_tasks=json.loads(os.environ["TEST_LEASE_TASKS"])
    if os.environ.get("TEST_LEASE_TASKS")
    else LEASE_TASKS,
)
