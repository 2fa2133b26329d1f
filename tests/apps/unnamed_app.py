"""An app created without a name (``Celery()``) with a beat schedule: its beat must refuse to
guess a leader key. Configured from ``TEST_BROKER_URL``."""

from __future__ import annotations

import os

from celery import Celery

from tests.support.workers import BROKER_URL_ENV

app = Celery(broker=os.environ.get(BROKER_URL_ENV, "redis://127.0.0.1:1/0"))
app.conf.update(
    beat_schedule={"report": {"task": "unnamed.report", "schedule": 1.0}},
    beat_scheduler="celery_lease.beat:LeasedScheduler",
)
