"""Celery workers for the tests: :mod:`harness.workers` plus the test apps' variables."""

from harness import REPO_ROOT
from harness.workers import CeleryProcess, CeleryWorker

#: Environment variables the test apps read (set by the ``worker_factory`` fixture).
BROKER_URL_ENV = "TEST_BROKER_URL"
RESULT_BACKEND_ENV = "TEST_RESULT_BACKEND"
QUEUE_ENV = "TEST_QUEUE"

__all__ = [
    "BROKER_URL_ENV",
    "QUEUE_ENV",
    "REPO_ROOT",
    "RESULT_BACKEND_ENV",
    "CeleryProcess",
    "CeleryWorker",
]
