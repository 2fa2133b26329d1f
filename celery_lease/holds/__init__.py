"""A lease around any block of code: ``celery_lease.hold()`` (:mod:`.plain`) and
``celery_lease.hold_async()`` (:mod:`.aio`), sharing :mod:`.core`, :mod:`.options` (whether a
hold waits) and :mod:`.shapes` (which callables a decorator holds, and how).
"""
