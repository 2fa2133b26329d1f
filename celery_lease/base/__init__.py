"""The bottom layer: what every other part uses and that uses nothing of the package.

The lease key of a call (:mod:`.keys`, :mod:`.key_encoding`), the clock deadlines are
measured on (:mod:`.clock`), this process's id (:mod:`.process`) and the Celery-style signals
(:mod:`.signals`, importable as ``celery_lease.signals``).
"""
