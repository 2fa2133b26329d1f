"""Flower configuration for the example project: shows lease outcomes on tasks.

Flower executes this file at start-up (``celery -A example_project.celery_app flower
--conf=example_project/flowerconfig.py``; without ``--conf`` Flower reads ``flowerconfig.py``
from the current directory). Module-level names that are Flower options set those options.
"""

from celery_lease.flower import install

# Show the lease fields (key, holder, cause...) on the task page and in the API, and add a
# "lease" column to the tasks list.
install()

# The tasks list columns; "lease" is the column install() adds. Flower's default also has
# "runtime": left out so that the list fits a 1280-pixel window (see docs/operations/flower.md).
tasks_columns = "name,uuid,state,lease,received,worker"
