"""Tasks written without celery-lease, as a library would ship them (tests lease them only
through ``app.conf.lease_tasks``; nothing here imports celery_lease)."""
