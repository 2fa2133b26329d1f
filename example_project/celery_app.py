"""The example project's Celery app: Redis as broker, result backend and lease store.

Everything comes from environment variables so the same module runs on a laptop and in a
deployment:

- ``REDIS_URL`` (default ``redis://localhost:6379``): broker, result backend and
  ``lease_backend``. One Redis is enough for an example; in production give leases a Redis
  whose ``maxmemory-policy`` is ``noeviction`` (any other policy can evict a live lease).
- ``LEASE_TTL`` (float seconds, default 30.0): the lease lifetime of every leased task.
- ``DASHBOARD_PERIOD`` (float seconds, default 60.0): how often beat sends
  :func:`example_project.tasks.refresh_dashboard`.

Start a worker with an embedded beat: ``celery -A example_project.celery_app worker -B -l info``.
"""

from __future__ import annotations

import os

from celery import Celery

#: The Redis URL used when ``REDIS_URL`` is not set.
DEFAULT_REDIS_URL = "redis://localhost:6379"


def redis_url() -> str:
    """The Redis URL of this deployment: ``REDIS_URL`` or :data:`DEFAULT_REDIS_URL`."""
    return os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL


def make_app(url: str | None = None) -> Celery:
    """Build the example app on ``url`` (default: :func:`redis_url`).

    Args:
        url: a ``redis://`` URL used as broker, result backend and lease store.
    """
    url = url or redis_url()
    app = Celery("example_project", broker=url, backend=url, include=["example_project.tasks"])
    app.conf.update(
        # Where leases live. Without it celery-lease falls back to a Redis broker_url.
        lease_backend=url,
        # Lifetime of a lease (float seconds). The renew interval defaults to a third of it.
        lease_ttl=float(os.environ.get("LEASE_TTL", "30")),
        # What a duplicate does while another execution holds the lease: "skip" stores a
        # marker result (celery_lease.is_skipped) and runs nothing.
        lease_on_conflict="skip",
        # A worker refuses to start if the lease store may evict keys (set it in production).
        lease_require_noeviction=False,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_expires=3600,
        broker_connection_retry_on_startup=True,
        beat_schedule={
            "refresh-dashboard": {
                "task": "example_project.tasks.refresh_dashboard",
                "schedule": float(os.environ.get("DASHBOARD_PERIOD", "60")),
            },
        },
    )
    return app


#: The app: ``celery -A example_project.celery_app worker``.
app = make_app()
