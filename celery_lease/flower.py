"""The documented path of the Flower integration: :mod:`celery_lease.ops.flower`."""

from .ops.flower import *  # noqa: F403
from .ops.flower import __all__ as __all__
