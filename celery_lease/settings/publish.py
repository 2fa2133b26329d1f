"""App settings a publish reads, looked up once per task class and process.

A Celery setting lookup (``app.conf.get``) walks Celery's layered configuration: about 50 000
instructions, more than the rest of what a leased task adds to ``apply_async``. The settings
a publisher of a :class:`~celery_lease.LeasedTask` consults on every call (``lease_dedupe``,
``lease_debounce``) are read here once per task class, and read again after
:meth:`~celery_lease.LeasedTask.forget_lease_settings` (:func:`forget`), as the other lease
settings are.
"""

from __future__ import annotations

from typing import Any

__all__ = ["app_setting", "forget"]

_ATTR = "_lease_publish_settings"


def app_setting(task: Any, name: str) -> Any:
    """The app's setting ``name`` (``"lease_dedupe"``) as seen by ``task``'s class: read from
    ``task.app.conf`` the first time, then kept on the class (None when it is not set)."""
    cls = type(task)
    found: dict[str, Any] | None = cls.__dict__.get(_ATTR)  # this class's own, not a parent's
    if found is None:
        found = {}
        setattr(cls, _ATTR, found)
    try:
        return found[name]
    except KeyError:
        value = found[name] = task.app.conf.get(name)
        return value


def forget(cls: type) -> None:
    """Make the next :func:`app_setting` of ``cls`` read the app's settings again."""
    setattr(cls, _ATTR, None)
