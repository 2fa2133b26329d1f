"""The documented path of the signals: :mod:`celery_lease.base.signals`."""

from .base.signals import *  # noqa: F403
from .base.signals import __all__ as __all__
