"""A tiny Celery app for smoke tests; configured from environment variables.

``TEST_BROKER_URL`` (required by a worker), ``TEST_RESULT_BACKEND`` (defaults to
the broker URL) and ``TEST_QUEUE`` (defaults to ``celery``).
"""

from __future__ import annotations

import os

from celery import Celery

from tests.support.workers import BROKER_URL_ENV, QUEUE_ENV, RESULT_BACKEND_ENV


def make_app(broker_url: str, result_backend: str | None = None, queue: str = "celery") -> Celery:
    """Build the smoke app; tests use this to get a client-side twin of the worker's app."""
    app = Celery("smoke_app", broker=broker_url, backend=result_backend or broker_url)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=True,
        result_expires=300,
    )

    @app.task(shared=False, name="smoke.add")  # type: ignore[untyped-decorator]
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(shared=False, name="smoke.pid")  # type: ignore[untyped-decorator]
    def pid() -> int:
        return os.getpid()

    return app


app = make_app(
    os.environ.get(BROKER_URL_ENV, "redis://127.0.0.1:1/0"),
    os.environ.get(RESULT_BACKEND_ENV),
    os.environ.get(QUEUE_ENV, "celery"),
)
