"""The documented path of the pytest plugin: :mod:`celery_lease.ops.testing`."""

from .ops.testing import *  # noqa: F403
from .ops.testing import __all__ as __all__
