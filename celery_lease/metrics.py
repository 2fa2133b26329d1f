"""The documented path of the Prometheus metrics: :mod:`celery_lease.ops.metrics`."""

from .ops.metrics import *  # noqa: F403
from .ops.metrics import __all__ as __all__
