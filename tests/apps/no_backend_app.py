"""A leased task with an AMQP broker and no ``lease_backend``: the worker must refuse to start."""

from __future__ import annotations

from celery import Celery

from celery_lease import LeasedTask

app = Celery("no_backend_app", broker="amqp://guest:guest@127.0.0.1:5672//")


@app.task(shared=False, base=LeasedTask, name="no_backend.job")
def job() -> None:
    """Never runs."""
