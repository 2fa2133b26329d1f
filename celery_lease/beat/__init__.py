"""High-availability ``celery beat``: ``beat_scheduler = "celery_lease.beat:LeasedScheduler"``.

:mod:`.scheduler` wraps the real scheduler and refuses overlapping sends; :mod:`.leader`
elects one leader among the beat processes by a lease.
"""

from .scheduler import LeasedScheduler as LeasedScheduler  # the documented scheduler path
