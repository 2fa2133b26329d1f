"""An example Celery project that uses celery-lease, and a demo that shows it on real processes.

- :mod:`example_project.celery_app`: the Celery app (Redis as broker, result backend and lease
  store, from ``REDIS_URL``) and its beat schedule;
- :mod:`example_project.tasks`: a task leased per account, a periodic task that can outrun its
  period, and a long task that checkpoints when its lease is lost;
- :mod:`example_project.fencing`: downstream stores that refuse a write carrying a stale
  fencing token (Redis and SQLite);
- ``python -m example_project demo``: the demo (:mod:`example_project.demo`).

Run a worker and beat with ``celery -A example_project.celery_app worker -B -l info``.
"""
