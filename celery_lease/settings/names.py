"""The ``lease_*`` names a user writes: a misspelt setting or task option is refused, not ignored.

Celery ignores a setting it does not know, so ``lease_tll = 5.0`` would silently leave the TTL
at its default. Every unknown ``lease_*`` name is refused, all of them in one error, with the
closest known name, under every spelling Celery reads: plain (``lease_ttl``) and with the
prefix of ``app.config_from_object(obj, namespace="CELERY")`` (``CELERY_LEASE_TTL``, the
Django way).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import LeaseConfigError
from .config import DEFAULTS, OTHER_NAMES

__all__ = ["check_app_settings", "check_names", "check_task_names"]


def check_names(names: Any, kind: str, where: str, namespace: str | None = None) -> None:
    """Refuse unknown ``lease_*`` names (a typo such as ``lease_tll`` would be ignored), all
    of them in one error.

    Args:
        names: the names to check (task option names, or ``app.conf.keys()``).
        kind: ``"task option"`` or ``"setting"``, for the message.
        where: what to name in the message.
        namespace: the prefix Celery reads settings under (``app.conf.prefix``, e.g.
            ``"CELERY_"`` after ``config_from_object(obj, namespace="CELERY")``): a name
            spelt with it (``CELERY_LEASE_TLL``) is checked as the plain name it stands for.

    Raises:
        LeaseConfigError: naming every unknown name and the closest known one of each.
    """
    known = (*DEFAULTS, *OTHER_NAMES)
    found = []
    for name in names:
        if not isinstance(name, str):
            continue
        prefix = ""
        if namespace and name.lower().startswith(namespace.lower()):
            prefix = name[: len(namespace)]  # Celery reads lease_ttl as <prefix>LEASE_TTL
        plain = name[len(prefix) :].lower() if prefix else name
        if not namespace and plain.lower().startswith("lease_") and plain != plain.lower():
            # LEASE_TTL: without a namespace Celery reads only the lower-case name.
            close = difflib.get_close_matches(plain.lower(), known, n=1)
            found.append(
                (
                    name,
                    f"did you mean {close[0]}? (without config_from_object("
                    f"..., namespace=...) setting names are lower case)"
                    if close
                    else "",
                )
            )
            continue
        if not plain.startswith("lease_") or plain in known:
            continue
        close = difflib.get_close_matches(plain, known, n=1)
        hint = f"did you mean {_spell(close[0], prefix)}?" if close else ""
        found.append((_spell(plain, prefix) if prefix else name, hint))
    found.sort()
    if len(found) == 1:
        shown, hint = found[0]
        raise LeaseConfigError(f"unknown {kind} {shown} ({where})" + (f"; {hint}" if hint else ""))
    if found:
        raise LeaseConfigError(
            f"{len(found)} unknown {kind}s ({where}): "
            + "; ".join(shown + (f", {hint}" if hint else "") for shown, hint in found)
        )


def _spell(name: str, prefix: str) -> str:
    """``name`` as written under a namespace prefix, with the plain name beside it."""
    if not prefix:
        return name
    return f"{prefix}{name.upper() if prefix.isupper() else name} ({name})"


def check_app_settings(conf: Any, where: str = "app.conf") -> None:
    """Refuse unknown ``lease_*`` settings of an app, under every spelling Celery reads
    (plain, and with the ``namespace=`` prefix of ``config_from_object``).

    Raises:
        LeaseConfigError: naming every unknown setting and the closest known one.
    """
    names = list(conf.keys())  # first: this loads a pending configuration, prefix included
    check_names(names, "setting", where, getattr(conf, "prefix", None))


def check_task_names(options: Iterable[str], conf: Any, where: str) -> None:
    """Check a task's option names and its app's setting names, reporting both in one error.

    Raises:
        LeaseConfigError: one line for the unknown task options, one for the unknown settings.
    """
    checks: tuple[Callable[[], None], ...] = (
        lambda: check_names(list(options), "task option", where),
        lambda: check_app_settings(conf),
    )
    problems = []
    for check in checks:
        try:
            check()
        except LeaseConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise LeaseConfigError("\n".join(problems))
