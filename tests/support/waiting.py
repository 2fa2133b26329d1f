"""Re-exports :mod:`harness.waiting`: polling with a deadline instead of bare sleeps."""

from harness.waiting import poll, wait_for

__all__ = ["poll", "wait_for"]
