"""The work-shaping policies, one unit each, above the core and below the execution.

No policy imports a sibling policy (tests/test_layout.py); the store half of each lives in
:mod:`celery_lease.store`.
"""
