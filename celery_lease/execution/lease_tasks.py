"""``app.conf.lease_tasks``: leased executions for tasks you did not write.

::

    app.conf.lease_tasks = {
        "billing.tasks.close_day": {"lease_key": ["day"], "lease_ttl": 120.0},
        "reports.*": {},  # a glob pattern: every matching task, default options
        "mail.tasks.send": {"lease_key": ["tenant"], "lease_limit": 5},  # 5 at once per tenant
    }

Each matching task's executions take a lease exactly as a :class:`~celery_lease.LeasedTask`
would: the same code runs them. For each task a private class ``Leased[<name>]`` derives from
``LeasedTask`` and from the task's own class (so it has the task's retry, queue and other
options) and shares the task's request stack; the task *instance* registered in the app gets
three instance attributes, and its class is left alone (``type(task)``, ``isinstance`` and
everything else anyone who imports the task sees stays as it was):

- ``run``: the original ``run`` (or the autoretry wrapper) inside the private class's
  lease-taking ``__call__``. Celery's tracer calls ``task.run`` (or the task's own ``__call__``,
  which calls ``self.run``), in a worker and in ``apply()``/eager mode alike; a direct call
  ``task(...)`` takes no lease, as with ``LeasedTask``;
- ``apply_async``: marks a message the holder of the same key publishes (a retry) so that it
  runs after the holder ends, as ``LeasedTask.apply_async`` does;
- ``lease``: a view of :func:`celery_lease.current_lease` (attributes of the running
  execution's lease; false outside one), for ``bind=True`` tasks that read ``self.lease``.

When it applies: whatever path first builds a task's tracer, the object through which Celery
runs a task (``apply()``, and so ``delay()``/``apply_async()`` in eager mode, before the app
was finalized or after, the setting given before the task was defined or after); when the app
is finalized (every task known then, so ``app.tasks[name]`` shows it) and again when the
worker's default modules are imported; and at worker start (a bootstep every finalized app
gets), where it is strict: a pattern that matches no task, an unknown option, a ``lease_key``
naming a parameter the task does not take, a task that is already a ``LeasedTask``, or two
patterns for one task stop the worker with a :class:`~celery_lease.errors.LeaseConfigError`
naming the entry; on the other paths an entry that names the task being run raises it there.
:func:`apply_lease_tasks` raises the same errors on demand. Celery's own ``celery.*`` tasks are
never leased. An entry takes every per-task option of ``LeasedTask``, ``lease_key`` and
``lease_limit`` included (an int, or a callable of the task's arguments, as on the task), and
is refused at application for the combinations a ``LeasedTask`` is refused at registration
(:func:`celery_lease.policies.compose.check`). The ``lease_*`` options given to the task
itself (``@app.task(lease_ttl=60.0)``) apply too; the entry may not set one of them a second
time.

At the same moments, a task with ``lease_*`` options that takes no lease (no
``base=LeasedTask``, no entry: Celery keeps unknown task options as class attributes and
nothing would read them) is refused, naming the task and the fix (:func:`check_unleased`):
at worker start the worker does not start, at finalize it is logged as an error, and the
task's first ``apply()`` raises it.
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
import logging
import threading
from collections.abc import Mapping
from typing import Any

from celery import Task, bootsteps
from celery import signals as celery_signals
from celery._state import connect_on_app_finalize

from ..base.keys import validate_lease_key
from ..core.lease import current_lease
from ..errors import LeaseConfigError
from ..policies import compose
from ..settings.config import TASK_OPTIONS, resolve_options
from ..settings.names import check_names
from .task import LeasedTask

__all__ = ["SETTING", "apply_lease_tasks", "check_unleased", "leased_class"]

logger = logging.getLogger("celery_lease")

#: The setting's name.
SETTING = "lease_tasks"
_OPTIONS = (*TASK_OPTIONS, "lease_key", "lease_limit")
_SPECS = ("lease_key", "lease_limit")  # of the task's arguments: not settings to resolve
_MARK = "_lease_tasks_leased"  # instance attribute: the private class applied to this task
_SHADOW = "_lease_tasks_runner"  # instance attribute: the instance of it that runs the task
# Two threads running a task's first apply() at once must not wrap its run twice (the inner
# lease would meet the outer one and be skipped).
_patching = threading.Lock()


class _LeaseView:
    """``self.lease`` of a task leased by ``lease_tasks``: the running execution's lease."""

    def __getattr__(self, name: str) -> Any:
        lease = current_lease()
        if lease is None:
            raise AttributeError(f"no lease is held here (outside a leased execution): {name}")
        return getattr(lease, name)

    def __bool__(self) -> bool:
        return current_lease() is not None

    def __repr__(self) -> str:
        return f"<current lease {current_lease()!r}>"


def _entries(conf: Any) -> dict[str, dict[str, Any]]:
    raw = conf.get(SETTING)
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise LeaseConfigError(
            f"{SETTING}={raw!r} must be a dict of task names or glob patterns to option dicts, "
            f"e.g. {SETTING} = {{'proj.tasks.sync': {{'lease_ttl': 60.0}}}}"
        )
    entries = {}
    for pattern, options in raw.items():
        where = f"app.conf.{SETTING}[{pattern!r}]"
        if not isinstance(pattern, str) or not pattern:
            raise LeaseConfigError(f"{where}: the key must be a task name or a glob pattern")
        options = {} if options is None else options
        if not isinstance(options, Mapping):
            raise LeaseConfigError(
                f"{where}={options!r} must be a dict of LeasedTask options ({{}} for defaults)"
            )
        _check_option_names(options, where)
        entries[pattern] = dict(options)
    return entries


def _check_option_names(options: Mapping[str, Any], where: str) -> None:
    check_names(options, "option", where)
    for name in options:
        if name not in _OPTIONS:
            raise LeaseConfigError(
                f"{where}: {name!r} is not a per-task lease option; use one of "
                f"{', '.join(_OPTIONS)}"
            )


def _own_options(task: Any) -> dict[str, Any]:
    """The ``lease_*`` attributes of ``task``'s own classes, below Celery's ``Task``: the
    options given to ``@app.task(...)``, which Celery makes class attributes."""
    found: dict[str, Any] = {}
    for cls in type(task).__mro__:
        if cls is Task or cls is LeasedTask:
            break
        for name, value in vars(cls).items():
            if name.startswith("lease_"):
                found.setdefault(name, value)
    return found


def check_unleased(task: Any) -> None:
    """Refuse ``lease_*`` task options on a task that takes no lease (neither a
    :class:`~celery_lease.LeasedTask` nor leased by the setting): Celery keeps any option as a
    class attribute and nothing would read them, so the task would run unleased without a word.

    Raises:
        LeaseConfigError: naming the task, its ``lease_*`` options and both fixes.
    """
    if isinstance(task, LeasedTask) or _MARK in vars(task):
        return
    names = sorted(_own_options(task))
    if not names:
        return
    misspelt = ""
    try:  # named now, not after the fix: the first fix must not lead to a second error
        check_names(names, "task option", f"task {task.name}")
    except LeaseConfigError as exc:
        misspelt = f"; and {exc}"
    raise LeaseConfigError(
        f"task {task.name} has lease option(s) {', '.join(names)} but takes no lease "
        f"(they would be ignored and its executions could overlap): give it "
        f"base=LeasedTask (from celery_lease import LeasedTask; @app.task(base=LeasedTask, "
        f"{names[0]}=...)), or name it in app.conf.{SETTING}{misspelt}"
    )


def _matches(entries: Mapping[str, Any], names: list[str]) -> dict[str, str]:
    """Task name -> the entry that covers it (an exact name wins over patterns)."""
    found: dict[str, str] = {}
    for name in names:
        if name.startswith("celery."):
            continue
        if name in entries:
            found[name] = name
            continue
        hits = [p for p in entries if fnmatch.fnmatchcase(name, p)]
        if len(hits) > 1:
            raise LeaseConfigError(
                f"app.conf.{SETTING}: task {name} matches both {hits[0]!r} and {hits[1]!r}; "
                f"name it exactly to say which options apply"
            )
        if hits:
            found[name] = hits[0]
    return found


def _lease(app: Any, task: Any, pattern: str, options: Mapping[str, Any]) -> None:
    """Give the registered ``task`` instance lease-taking executions (see the module doc)."""
    where = f"app.conf.{SETTING}[{pattern!r}] for task {task.name}"
    if isinstance(task, LeasedTask):
        raise LeaseConfigError(
            f"{where}: the task is a LeasedTask already; set its options on it instead"
        )
    own = _own_options(task)  # the task's own lease_* options count, as on a LeasedTask
    both = sorted(set(own) & set(options))
    if both:
        raise LeaseConfigError(
            f"{where}: {', '.join(both)} set both on the task and in the entry; keep one"
        )
    options = {**own, **options}
    _check_option_names(options, where)
    original = task.run
    signature = inspect.signature(original)  # the real one: through autoretry and bind=True
    resolved = resolve_options(
        app.conf, {k: v for k, v in options.items() if k not in _SPECS}, where
    )
    # The combinations a LeasedTask is refused at registration (a limit with preempt or a
    # cooldown), refused here as early: when the entry is applied.
    compose.check(options.get("lease_limit"), resolved, where)
    validate_lease_key(options.get("lease_key"), lambda: list(signature.parameters), where)
    attrs: dict[str, Any] = {
        "run": staticmethod(original),
        "__module__": __name__,
        "__qualname__": f"Leased[{task.name}]",
        "_lease_signature": signature,
        "_lease_spec_cache": None,
        "_lease_resolved": None,
    }
    attrs.update(options)
    # The task's own class after LeasedTask: its options (retries, queue...) and its class-level
    # request stack (it is bound already) are shared; nothing is registered under this class.
    shadow_cls = type(f"Leased[{task.name}]", (LeasedTask, type(task)), attrs)
    shadow = shadow_cls()
    shadow.__dict__.update(
        {k: v for k, v in vars(task).items() if k not in ("run", "apply_async", "lease")}
    )

    @functools.wraps(original)
    def run(*args: Any, **kwargs: Any) -> Any:
        return shadow(*args, **kwargs)

    task.run = run
    task.apply_async = shadow.apply_async
    task.lease = _LeaseView()
    setattr(task, _MARK, shadow_cls)
    setattr(task, _SHADOW, shadow)


def apply_lease_tasks(app: Any, *, strict: bool = True) -> list[str]:
    """Apply ``app.conf.lease_tasks`` to the app's registered tasks (idempotent).

    Args:
        app: the Celery app.
        strict: also refuse a pattern that matches no task (at worker start; a script that
            imports only some task modules may pass False).

    Returns:
        The names of the tasks that take a lease through the setting, sorted.

    Raises:
        LeaseConfigError: an invalid entry, naming it and the fix.
    """
    entries = _entries(app.conf)
    tasks = app.tasks
    if not entries:
        for task in list(tasks.values()):
            check_unleased(task)
        return []
    found = _matches(entries, list(tasks))
    if strict:
        for pattern in entries:
            if pattern not in found.values():
                raise LeaseConfigError(
                    f"app.conf.{SETTING}[{pattern!r}] matches no registered task; check the "
                    f"name, and that its module is imported (imports/include or autodiscover)"
                )
    for name, pattern in found.items():
        task = tasks[name]
        with _patching:
            if _MARK not in vars(task):
                _lease(app, task, pattern, entries[pattern])
    for task in list(tasks.values()):
        check_unleased(task)
    return sorted(found)


def leased_class(task: Any) -> type[LeasedTask] | None:
    """The private ``Leased[<name>]`` class that runs ``task``'s executions when the setting
    leases it (its lease settings are that class's: ``forget_lease_settings()``), else None."""
    found: type[LeasedTask] | None = vars(task).get(_MARK)
    return found


def leased_runner(task: Any) -> LeasedTask | None:
    """The :class:`~celery_lease.LeasedTask` instance that runs ``task``'s executions when the
    setting leases it (its settings are the ones the lease takes: what ``celery lease doctor``
    and the worker's start check judge), else None."""
    found: LeasedTask | None = vars(task).get(_SHADOW)
    return found


def _lease_one(app: Any, task: Any) -> None:
    """Apply the setting to ``task`` alone, if an entry covers it and it is not leased yet."""
    if _MARK in vars(task):
        return
    entries = _entries(app.conf)
    pattern = _matches(entries, [task.name]).get(task.name) if entries else None
    if pattern is not None:
        with _patching:
            if _MARK not in vars(task):
                _lease(app, task, pattern, entries[pattern])
    else:
        check_unleased(task)


def _hook_tracers() -> None:
    """Make Celery's ``build_tracer`` apply the setting to the task it builds a tracer for.

    Every execution but a direct call runs through a tracer built just before (``Task.apply``
    builds one per call, a prefork child one per task) and the tracer keeps the ``run`` it
    found, so this is the one moment that sees every path first, before finalize included.
    A worker's consumer imported its own reference earlier: :class:`LeaseTasksStep` covers it.
    """
    from celery.app import trace

    original = trace.build_tracer
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def build_tracer(name: str, task: Any, *args: Any, **kwargs: Any) -> Any:
        _lease_one(kwargs.get("app") or task._get_app(), task)
        return original(name, task, *args, **kwargs)

    setattr(build_tracer, _MARK, True)
    trace.build_tracer = build_tracer


class LeaseTasksStep(bootsteps.Step):  # type: ignore[misc]
    """Worker bootstep: apply ``lease_tasks`` strictly before the worker consumes anything
    (the consumer builds each task's tracer later, from the patched ``run``)."""

    name = "celery_lease.lease_tasks"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        leased = apply_lease_tasks(worker.app, strict=True)
        if leased:
            logger.info("lease_tasks: %d task(s) leased: %s", len(leased), ", ".join(leased))


def _on_finalize(app: Any) -> None:
    # Every app's worker gets the step: the setting may be given after finalize.
    app.steps["worker"].add(LeaseTasksStep)

    def apply_known(sender: Any = None, **_: Any) -> None:
        try:
            apply_lease_tasks(app, strict=False)
        except LeaseConfigError as exc:  # a signal swallows it: say it loudly
            logger.error("%s", exc)
            raise

    app.on_after_finalize.connect(apply_known, weak=False)
    celery_signals.import_modules.connect(apply_known, sender=app, weak=False)


connect_on_app_finalize(_on_finalize)
_hook_tracers()
