"""``python -m example_project compare``: celery-lease, celery-once and celery-singleton measured
side by side on real workers: a SIGKILLed holder, a run longer than the lock's lifetime, and a
pause longer than it. Behaviour, not speed. Needs ``pip install celery-once celery-singleton``.
"""
