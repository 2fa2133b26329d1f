"""Reusable test infrastructure: private Redis servers, TCP proxies, Celery workers."""
