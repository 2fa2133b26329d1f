"""Tiny Celery apps that real worker subprocesses load in tests."""
