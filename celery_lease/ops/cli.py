"""``celery lease``: inspect and manage leases from the command line.

Registered as a ``celery`` subcommand through the ``celery.commands`` entry point, so it runs
with the app given by ``-A``::

    celery -A proj lease ls [--task NAME] [--wide | --json]
    celery -A proj lease show TASK [ARGS...] [--kwargs JSON] [--json]
    celery -A proj lease release KEY [--yes]
    celery -A proj lease doctor [--strict]
    celery -A proj lease acl [--user NAME] [--password TEXT]

The store (``lease_backend``, else a Redis ``broker_url``) and the key prefixes come from the
app's settings and its registered :class:`~celery_lease.LeasedTask` tasks; ``--url`` and
``--prefix`` override them. Listing uses ``SCAN`` (never ``KEYS``), in batches, so it is safe
on a large production Redis.

Exit codes (docs/operations/cli.md, tests/test_cli_exit_codes.py): 0 success; 1 a check failed, a
release was refused or declined, the lease was not found (``show`` of a free key, ``release`` of
a missing one), or a cluster node did not answer ``ls``; 2 bad usage or configuration.
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, ParamSpec

import click
import redis
from celery.bin.base import CeleryCommand, handle_preload_options
from redis.exceptions import RedisError

from .. import store
from ..base.keys import BEAT_TASK_NAME, is_internal
from ..errors import LeaseConfigError, LeaseError
from ..execution.task import LeasedTask
from . import acl, inspection
from .doctor import Finding, diagnose
from .inspection import ClaimInfo, LeaseInfo, read_lease, scan_claims, scan_leases

__all__ = ["LeaseInfo", "lease", "read_lease", "scan_leases"]

P = ParamSpec("P")

# -- helpers --------------------------------------------------------------------------------


def _app(ctx: click.Context) -> Any:
    obj = ctx.find_root().obj
    app = getattr(obj, "app", None)
    if app is None:
        raise click.UsageError("no Celery app: run it as `celery -A proj lease ...`")
    app.loader.import_default_modules()  # register the tasks of `include` / autodiscovery
    return app


def _expiry(ttl: float, verb: str) -> str:
    """``verb`` and the time left (``expires in 4.2s``), or ``never expires`` for a key with no
    lifetime (``ttl`` below 0)."""
    return "never expires" if ttl < 0 else f"{verb} {_human(ttl)}"


def _human(seconds: float) -> str:
    if seconds < 0:
        return "no expiry"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


_MIN_COLUMN = 8  # characters a shortened column keeps


def _shorten(text: str, width: int) -> str:
    """``text`` cut in the middle to ``width`` characters (both ends stay recognisable)."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "~" + text[len(text) - (width - 1 - head) :]


def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int | None = None,
    shrink_first: Sequence[str] = (),
    drop: Sequence[str] = (),
) -> str:
    """Left-aligned columns. With ``width``, the last column (the key that ``celery lease
    release`` takes) is never cut: the others are shortened in the middle (``shrink_first``
    in that order, then the widest), then the ``drop`` columns left out, in that order; if a
    line still does not fit, each row's last cell goes on a line of its own under the row
    (indented by two spaces, as the header's last name is), and the other columns are
    shortened to fit."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    if width is None or _fits(widths, width):
        return "\n".join(_lines(headers, rows, widths))
    kept = list(range(len(headers)))
    for name in (None, *drop):
        if name in headers:
            kept.remove(headers.index(name))
        fitted = _with_last_whole(headers, rows, widths, width, shrink_first, kept)
        if fitted is not None:
            return "\n".join(fitted)
    head, *body = _key_below(headers, rows, widths, width, shrink_first, drop)
    lines = [head, f"  {headers[-1]}"]
    for line, row in zip(body, rows, strict=True):
        lines += [line, f"  {row[-1]}"]
    return "\n".join(lines)


def _key_below(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    widths: Sequence[int],
    width: int,
    shrink_first: Sequence[str],
    drop: Sequence[str],
) -> list[str]:
    """The lines of every column but the last, fitted to ``width`` as :func:`_table` does
    (shortened, then the ``drop`` columns left out until they fit)."""
    kept = list(range(len(headers) - 1))
    for name in (None, *drop):
        if name in headers:
            kept.remove(headers.index(name))
        names = [headers[i] for i in kept]
        cut = _fit(names, [widths[i] for i in kept], width, shrink_first)
        if _fits(cut, width):
            break
    return _lines(names, [[r[i] for i in kept] for r in rows], cut)


def _with_last_whole(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    widths: Sequence[int],
    width: int,
    shrink_first: Sequence[str],
    kept: Sequence[int],
) -> list[str] | None:
    """The lines of the ``kept`` columns with the last one whole and the others fitted to
    ``width``; None if they cannot fit."""
    others = list(kept[:-1])
    room = width - widths[-1] - 2
    names = [headers[i] for i in others]
    cut = _fit(names, [widths[i] for i in others], room, shrink_first)
    if not _fits(cut, room):
        return None
    return _lines(
        [headers[i] for i in kept], [[r[i] for i in kept] for r in rows], [*cut, widths[-1]]
    )


def _fit(
    headers: Sequence[str], widths: Sequence[int], width: int, shrink_first: Sequence[str]
) -> list[int]:
    """``widths`` shortened (never below :data:`_MIN_COLUMN` or the header) until a line of
    these columns fits ``width``: those named in ``shrink_first`` in that order, then the
    widest; as narrow as they go when nothing fits."""
    fitted = list(widths)
    floor = [max(_MIN_COLUMN, len(h)) for h in headers]
    order = [headers.index(h) for h in shrink_first if h in headers]
    while not _fits(fitted, width):
        column = next((i for i in order if fitted[i] > floor[i]), None)
        if column is None:
            column = max(range(len(fitted)), key=lambda i: fitted[i] - floor[i])
            if fitted[column] <= floor[column]:
                break
        fitted[column] -= 1
    return fitted


def _fits(widths: Sequence[int], width: int) -> bool:
    """Whether columns of ``widths``, two spaces apart, fit ``width`` characters."""
    return sum(widths) + 2 * max(len(widths) - 1, 0) <= width


def _lines(
    headers: Sequence[str], rows: Sequence[Sequence[str]], widths: Sequence[int]
) -> list[str]:
    """The header and ``rows``, left-aligned, cells longer than their width cut in the middle."""

    def line(cells: Sequence[str]) -> str:
        return "  ".join(_shorten(c, w).ljust(w) for c, w in zip(cells, widths, strict=True))

    return [line(headers).rstrip(), *(line(row).rstrip() for row in rows)]


def _describe(info: LeaseInfo) -> str:
    if info.foreign:
        return f"an unknown holder ({info.foreign}), {_expiry(info.ttl, 'expires in')}"
    if info.cooldown_until:
        return (
            f"a cooldown after task {info.task or '?'} [{info.task_id or '?'}] on "
            f"{_where(info)} ended, fencing token "
            f"{info.fencing_token}, {_expiry(info.ttl, 'ends in')}"
        )
    return (
        f"task {info.task or '?'} [{info.task_id or '?'}] on {_where(info)}, "
        f"fencing token {info.fencing_token}, {_expiry(info.ttl, 'expires in')}"
    )


def _where(info: LeaseInfo) -> str:
    """Where the holder runs: its worker node (``celery@web1``, what ``celery inspect -d``
    and Flower name) when a worker holds the lease, and its host and pid."""
    if info.node:
        return f"worker {info.node} (host {info.host or '?'}, pid {info.pid})"
    return f"host {info.host or '?'} (pid {info.pid})"


def _no_app_hint() -> str:
    """A hint when ``celery`` was run without ``-A``: the settings seen are Celery's defaults."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or ctx.find_root().params.get("app"):
        return ""
    return (
        "\nhint: no app was given, so these are Celery's default settings: run it as "
        "`celery -A proj lease ...` with the module that defines your Celery app (or set "
        "CELERY_APP)"
    )


def _fail(message: str, code: int = 1) -> None:
    click.echo(message, err=True)
    sys.exit(code)


def _config_guard(fn: Callable[P, None]) -> Callable[P, None]:
    """Turn configuration and store errors into a message and exit code 2 / 1."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            return fn(*args, **kwargs)
        except LeaseConfigError as exc:
            _fail(f"configuration error: {exc}{_no_app_hint()}", 2)
        except LeaseError as exc:
            _fail(f"error: {exc}", 2)
        except RedisError as exc:
            _fail(
                f"lease store error: {store.describe(exc).rstrip('.')}. Check lease_backend / "
                f"--url and that Redis is reachable",
                1,
            )

    return wrapper


# -- commands -------------------------------------------------------------------------------

_URL_HELP = "Redis URL of the lease store (default: lease_backend, else a Redis broker_url)."


@click.group(name="lease")
@click.pass_context
def lease(ctx: click.Context, /, **kwargs: Any) -> None:
    """Inspect and manage task leases (celery-lease)."""


@lease.command(name="ls", cls=CeleryCommand)
@click.option("--task", "task_name", default=None, help="Only leases held by this task name.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per lease, in a list.")
@click.option(
    "--wide",
    is_flag=True,
    help="Every column in full, and the fencing token, whatever the terminal width.",
)
@click.option("--url", default=None, help=_URL_HELP)
@click.option(
    "--prefix",
    "prefixes",
    multiple=True,
    help="Key prefix to scan (repeatable; default: every configured prefix).",
)
@click.pass_context
@handle_preload_options  # type: ignore[untyped-decorator]
@_config_guard
def ls(
    ctx: click.Context,
    task_name: str | None,
    as_json: bool,
    wide: bool,
    url: str | None,
    prefixes: tuple[str, ...],
    **kwargs: Any,
) -> None:
    """List held leases: task, task id, holder host and pid, time left, key and the runs waiting
    for a key (coalesce, queue: WAITING) (--wide: the fencing token as well, nothing shortened;
    --json: everything), then the waiting copies of tasks with lease_dedupe (published, not
    started) with their age (in --json, objects with "kind": "waiting"). Exits 2 when --task
    names no registered task."""
    app = _app(ctx)
    if task_name is not None and task_name != BEAT_TASK_NAME and task_name not in app.tasks:
        _fail(f"no task named {task_name!r} is registered in app {app.main!r}", 2)
    found: list[LeaseInfo] = []
    waiting: list[ClaimInfo] = []
    skipped: list[str] = []  # cluster primaries that did not answer: listed without them
    for store_url, store_prefixes in inspection.stores(app, url, prefixes).items():
        client = inspection.client(store_url, app)
        for prefix in sorted(store_prefixes):
            found += [
                i
                for i in scan_leases(client, prefix, skipped=skipped)
                if task_name is None or i.task == task_name
            ]
            if not skipped:
                waiting += [
                    c
                    for c in scan_claims(client, prefix)
                    if task_name is None or c.task == task_name
                ]
    found.sort(key=lambda i: (i.task, i.key))
    waiting.sort(key=lambda c: (c.task, c.key))
    if as_json:
        click.echo(
            json.dumps(
                [asdict(i) for i in found] + [{"kind": "waiting", **asdict(c)} for c in waiting],
                indent=2,
            )
        )
    elif not found:
        click.echo("no leases held" + (f" by {task_name}" if task_name else ""))
    else:
        _print_leases(found, wide)
    if waiting and not as_json:
        _print_waiting(waiting, wide)
    for node in dict.fromkeys(skipped):
        click.echo(f"warning: cluster node {node}; the leases it holds are not listed", err=True)
    if skipped:
        ctx.exit(1)


def _waiting(info: LeaseInfo) -> str:
    """The WAITING column: the line's length, and the run the key is reserved for."""
    reserved = f" (handed to {info.reserved_for})" if info.reserved_for else ""
    return f"{info.waiting}{reserved}"


def _print_leases(found: list[LeaseInfo], wide: bool) -> None:
    rows: list[tuple[str, ...]]
    task = {
        id(i): "(unknown holder)"
        if i.foreign
        else f"{i.task or '?'} (cooldown)"
        if i.cooldown_until
        else i.task or "?"
        for i in found
    }
    lines = any(i.waiting or i.reserved_for for i in found)  # a column only when it says more
    limited = any(i.limit > 1 for i in found)  # SLOTS: used/N of a lease_limit key
    head: tuple[str, ...] = ("SLOTS",) * limited + ("WAITING",) * lines

    def extra(i: LeaseInfo) -> tuple[str, ...]:
        return (f"{i.used}/{i.limit}",) * limited + (_waiting(i),) * lines

    if wide:
        rows = [
            (
                task[id(i)],
                i.task_id or "?",
                i.host or "?",
                str(i.pid),
                str(i.fencing_token),
                _human(i.ttl),
                *extra(i),
                i.key,
            )
            for i in found
        ]
        click.echo(
            _table(
                ("TASK", "TASK ID", "HOST", "PID", "FENCING TOKEN", "TIME LEFT", *head, "KEY"), rows
            )
        )
    else:
        # The key is what tells two holds apart (both `celery_lease.hold MainThread`).
        rows = [
            (
                task[id(i)],
                i.task_id or "?",
                i.host or "?",
                str(i.pid),
                _human(i.ttl),
                *extra(i),
                i.key,
            )
            for i in found
        ]
        click.echo(
            _table(
                ("TASK", "TASK ID", "HOST", "PID", "TIME LEFT", *head, "KEY"),
                rows,
                width=shutil.get_terminal_size().columns,
                shrink_first=("TASK ID",),
                drop=("PID", "HOST"),
            )
        )
    click.echo(f"{len(found)} lease(s)")
    for info in found:
        if info.foreign:
            click.echo(
                f"unknown holder at {info.key}: {info.foreign}; it holds that lease "
                f"until it expires or is deleted (`celery lease doctor` says more)"
            )


def _print_waiting(waiting: list[ClaimInfo], wide: bool) -> None:
    rows = [
        (c.task or "?", c.task_id, _human(c.age), _human(c.due_in if c.debounced else c.ttl), c.key)
        for c in waiting
    ]  # a debounce burst: until it is due
    headers = ("WAITING TASK", "TASK ID", "AGE", "TIME LEFT", "KEY")
    if wide:
        click.echo(_table(headers, rows))
    else:
        click.echo(
            _table(
                headers,
                rows,
                width=shutil.get_terminal_size().columns,
                shrink_first=("TASK ID",),
                drop=("AGE",),
            )
        )
    click.echo(
        f"{len(waiting)} waiting cop{'y' if len(waiting) == 1 else 'ies'} (lease_dedupe, "
        f"lease_debounce: not started; later publishes of the key return their result)"
    )


def _parse_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


@lease.command(name="show", cls=CeleryCommand)
@click.argument("task_name", metavar="TASK")
@click.argument("args", nargs=-1)
@click.option(
    "--kwargs",
    "kwargs_json",
    default=None,
    help="Keyword arguments as a JSON object, e.g. '{\"account\": 7}'.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@handle_preload_options  # type: ignore[untyped-decorator]
@_config_guard
def show(
    ctx: click.Context,
    task_name: str,
    args: tuple[str, ...],
    kwargs_json: str | None,
    as_json: bool,
    **kwargs: Any,
) -> None:
    """Show the lease key a call would take, and who holds it now. Exits 1 when nobody
    holds it (after printing the key).

    Each ARG is parsed as JSON when it can be (7, "7", [1,2], null), else taken as a string.
    """
    app = _app(ctx)
    task = app.tasks.get(task_name)
    if task is None:
        _fail(f"no task named {task_name!r} is registered in app {app.main!r}", 2)
    if not isinstance(task, LeasedTask):
        _fail(f"task {task_name!r} is not a LeasedTask (declare it with base=LeasedTask)", 2)
    try:
        call_kwargs = json.loads(kwargs_json) if kwargs_json else {}
    except ValueError as exc:
        _fail(f"--kwargs is not valid JSON: {exc}", 2)
    if not isinstance(call_kwargs, dict):
        _fail("--kwargs must be a JSON object, e.g. '{\"account\": 7}'", 2)
    call_args = [_parse_arg(a) for a in args]
    key = task.lease_key_for(call_args, call_kwargs)
    options, url, _ = task.lease_settings()
    info = read_lease(store.client_for(url, inspection.CLI_TIMEOUT, options.backend_options), key)
    if as_json:
        click.echo(json.dumps({"key": key, "holder": asdict(info) if info else None}, indent=2))
    else:
        click.echo(f"key:    {key}")
        click.echo(f"holder: {_describe(info) if info else 'none (free)'}")
    if info is None:
        ctx.exit(1)  # not found, as `release` of a missing key


@lease.command(name="release", cls=CeleryCommand)
@click.argument("key")
@click.option("--yes", "-y", "assume_yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--url", default=None, help=_URL_HELP)
@click.pass_context
@handle_preload_options  # type: ignore[untyped-decorator]
@_config_guard
def release(ctx: click.Context, key: str, assume_yes: bool, url: str | None, **kwargs: Any) -> None:
    """Release a stuck lease KEY, only if its holder is still the one shown.

    The holder's token is read, shown, and the release deletes the key only while that same
    token holds it: if the lease changed in between (renewed by a new holder, released,
    expired), nothing is deleted and the command exits 1.
    """
    app = _app(ctx)
    if is_internal(key):
        _fail(f"{key} is an internal celery-lease key, not a lease", 2)
    current: LeaseInfo | None = None
    client: redis.Redis | None = None
    for store_url in inspection.stores(app, url, ()):
        client = inspection.client(store_url, app)
        current = read_lease(client, key)
        if current is not None:
            break
    if current is None or client is None:
        _fail(f"no lease at {key}", 1)
        return
    click.echo(f"{key} is held by {_describe(current)}")
    if current.foreign:
        _fail(
            f"not released: celery-lease did not write {key}, so it does not delete it; "
            f"if nothing else uses it, delete it with redis-cli, or give celery-lease a "
            f"prefix of its own (lease_key_prefix)",
            1,
        )
    if not assume_yes and not click.confirm("Release it?", default=False):
        _fail("not released", 1)
    if store.key_shape(current.limit).revoke(client, key, current.token):
        click.echo(f"released {key}")
        return
    now = read_lease(client, key)
    _fail(
        f"refused: the lease changed since it was shown; now "
        f"{_describe(now) if now else 'free'}. Nothing was deleted",
        1,
    )


@lease.command(name="acl", cls=CeleryCommand)
@click.option("--user", default=None, help="ACL user name (default: the URL's, else lease).")
@click.option(
    "--password",
    default="<password>",
    show_default=True,
    help="Password the printed command sets (the URL's is never printed).",
)
@click.pass_context
@handle_preload_options  # type: ignore[untyped-decorator]
@_config_guard
def acl_rule(ctx: click.Context, user: str | None, password: str, **kwargs: Any) -> None:
    """Print the ACL SETUSER command that gives the lease store's user exactly the commands
    this app's configuration sends (one per store; docs/deploying.md, section ACL)."""
    click.echo("\n".join(acl.rules(_app(ctx), user, password)))


# -- doctor ---------------------------------------------------------------------------------

_COLORS = {"ok": "green", "warn": "yellow", "fail": "red", "info": "blue"}


def _print_finding(finding: Finding, ctx_obj: Any) -> None:
    tag = f"{finding.level.upper():<4}"
    style = getattr(ctx_obj, "style", None)
    if style is not None and not getattr(ctx_obj, "no_color", True):
        tag = style(tag, fg=_COLORS[finding.level], bold=True)
    click.echo(f"{tag} {finding.subject}: {finding.message}")
    if finding.fix:
        click.echo(f"     fix: {finding.fix}")


@lease.command(name="doctor", cls=CeleryCommand)
@click.option("--strict", is_flag=True, help="Exit non-zero on warnings too.")
@click.option("--url", default=None, help=_URL_HELP)
@click.pass_context
@handle_preload_options  # type: ignore[untyped-decorator]
@_config_guard
def doctor(ctx: click.Context, strict: bool, url: str | None, **kwargs: Any) -> None:
    """Check the lease store and the lease settings, and print what to fix.

    Store: reachable, version, maxmemory-policy, latency, clock. Settings: TTL and renew
    interval of every leased task against its time limits and the broker's
    visibility_timeout (Redis) or consumer_timeout (RabbitMQ), and the beat leader lease.
    Exits 1 when a check fails.
    """
    app = _app(ctx)
    failures = warnings = 0
    for finding in diagnose(app, url):
        failures += finding.level == "fail"
        warnings += finding.level == "warn"
        _print_finding(finding, ctx.find_root().obj)
    click.echo(f"{failures} problem(s), {warnings} warning(s)")
    if failures or (strict and warnings):
        sys.exit(1)
