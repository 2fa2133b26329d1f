"""Celery workers for the tests: :mod:`harness.workers` plus the test apps' variables."""

import os
from typing import Any

from harness import REPO_ROOT
from harness.workers import CeleryProcess, CeleryWorker

#: Environment variables the test apps read (set by the ``worker_factory`` fixture).
BROKER_URL_ENV = "TEST_BROKER_URL"
RESULT_BACKEND_ENV = "TEST_RESULT_BACKEND"
QUEUE_ENV = "TEST_QUEUE"
LEASE_BACKEND_ENV = "LEASE_BACKEND"


def app_urls() -> tuple[str, str, str]:
    """A test app's broker, result backend and lease store, from the environment.

    ``TEST_BROKER_URL`` (a worker's test sets it; a dead Redis URL otherwise),
    ``TEST_RESULT_BACKEND`` (default: the broker) and ``LEASE_BACKEND`` (default: the result
    backend, so with a RabbitMQ broker the results, the leases and what the apps record share
    the test's Redis).
    """
    broker = os.environ.get(BROKER_URL_ENV) or "redis://127.0.0.1:1/0"
    results = os.environ.get(RESULT_BACKEND_ENV) or broker
    return broker, results, os.environ.get(LEASE_BACKEND_ENV) or results


def point_app(app: Any, **conf: Any) -> None:
    """Update the settings of a test app's client-side twin (``broker_url``, ...).

    Celery keeps the connection and producer pools it made for the first broker; after a test
    on RabbitMQ a later test on Redis (or the reverse) would publish to the earlier broker.
    When ``broker_url`` changes, the pools are dropped with Celery's own reset of a forked
    child's (``Celery._after_fork``).
    """
    before = app.conf.broker_url
    app.conf.update(conf)
    if app.conf.broker_url != before:
        app._after_fork()


__all__ = [
    "BROKER_URL_ENV",
    "LEASE_BACKEND_ENV",
    "QUEUE_ENV",
    "REPO_ROOT",
    "RESULT_BACKEND_ENV",
    "CeleryProcess",
    "CeleryWorker",
    "app_urls",
    "point_app",
]
