"""``python -m example_project demo``: celery-lease on real workers, a real Redis, real faults.

The orchestrator (:mod:`.cli`, :mod:`.scenes`) starts two ``celery worker`` processes, A and B,
that load :mod:`.worker_app` (the example app plus the demo's job, :mod:`.jobs`), sends them
jobs, crashes and pauses them with signals, and prints what happens as a timeline. The workers
report what they do by appending JSON events to a Redis list; the orchestrator also samples
the lease key itself, so the "key in the store" column is measured, not inferred.
"""
