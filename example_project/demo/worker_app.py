"""The app as the demo's workers (and the orchestrator, as a client) load it.

It is the example app (:mod:`example_project.celery_app`, on ``REDIS_URL``) with every key of
one demo run under the prefix ``DEMO_PREFIX`` (queues, results and leases), so a demo can run
against a Redis that other applications use and remove exactly what it created.
"""

from __future__ import annotations

import os

from example_project.celery_app import app, redis_url

#: Prefix of every Redis key of this demo run (str ending in ``:``).
PREFIX = os.environ.get("DEMO_PREFIX", "lease-demo:")

app.conf.update(
    # REDIS_URL again: the orchestrator may have imported the app before it chose a Redis.
    broker_url=redis_url(),
    result_backend=redis_url(),
    lease_backend=redis_url(),
    broker_transport_options={"global_keyprefix": PREFIX},
    # One reconnect, not Celery's default twenty: with Celery 5.3.0 each result still referenced
    # at exit reconnects to the embedded Redis the demo has just stopped (~2 min in all).
    result_backend_transport_options={
        "global_keyprefix": PREFIX,
        "retry_policy": {"max_retries": 1},
    },
    lease_key_prefix=PREFIX + "lease",
    # One message at a time per process: a duplicate waits in the queue, not in a prefetch
    # buffer, which keeps the timeline close to what each process is doing.
    worker_prefetch_multiplier=1,
    result_expires=600,
    beat_schedule={},
)

from example_project.demo import jobs  # noqa: E402,F401  (registers the demo's tasks)
