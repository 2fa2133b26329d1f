"""One result of a check of ``celery lease doctor`` and of the worker's start check."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Finding"]


@dataclass(frozen=True)
class Finding:
    """One result of a check.

    Attributes:
        level: ``"ok"``, ``"warn"``, ``"fail"`` or ``"info"``.
        subject: what was checked (``"store redis://..."``, ``"task proj.sync"``, ``"beat"``).
        message: what was found.
        fix: what to do about it (empty when nothing).
        check: which check found it, where a worker treats it apart (``"unreachable"``,
            ``"eviction"``); else empty.
        refuses_start: the settings alone make it fail, whatever the store's state: a worker
            refuses to start on it (a ``"fail"`` that the store's state explains is logged).
    """

    level: str
    subject: str
    message: str
    fix: str = ""
    check: str = ""
    refuses_start: bool = False
