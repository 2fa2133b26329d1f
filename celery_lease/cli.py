"""``celery lease``: inspect and manage leases from the command line.

Registered as a ``celery`` subcommand through the ``celery.commands`` entry point, so it runs
with the app given by ``-A``::

    celery -A proj lease ls [--task NAME] [--json]
    celery -A proj lease show TASK [ARGS...] [--kwargs JSON] [--json]
    celery -A proj lease release KEY [--yes]
    celery -A proj lease doctor [--strict]

The store (``lease_backend``, else a Redis ``broker_url``) and the key prefixes come from the
app's settings and its registered :class:`~celery_lease.LeasedTask` tasks; ``--url`` and
``--prefix`` override them. Listing uses ``SCAN`` (never ``KEYS``), in batches, so it is safe
on a large production Redis.

Exit codes: 0 success; 1 a check failed, a release was refused or declined, or nothing was
found; 2 bad usage or configuration.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ParamSpec

import click
import redis
from celery.bin.base import CeleryCommand, handle_preload_options
from redis.exceptions import RedisError

from . import clock, connection, store
from .config import LeaseOptions, resolve_backend, resolve_options
from .connection import safe_url as _safe
from .errors import LeaseConfigError, LeaseError

__all__ = ["LeaseInfo", "lease", "read_lease", "scan_leases"]

P = ParamSpec("P")

CLI_TIMEOUT = 5.0  # float seconds for each store call made by the CLI
SCAN_COUNT = 1000  # keys per SCAN step (a hint to Redis, not a limit)
_BATCH = 500  # keys per GET/PTTL pipeline
_INTERNAL_SUFFIXES = (":fence", ":last-run")
MIN_REDIS = (3, 2)  # scripts replicate their effects (TIME inside a writing script)


@dataclass(frozen=True)
class LeaseInfo:
    """One held lease, as stored.

    Attributes:
        key: the Redis key (str).
        task: the holder's task name (str; ``celery.beat`` for a beat leader lease).
        task_id: the holder's task id (str; the beat node for a beat lease).
        host: the holder's hostname (str).
        pid: the holder's process id (int, 0 when unknown).
        fencing_token: int.
        ttl: float seconds left on the server (-1.0 for a key without expiry).
        token: the holder's execution token (str).
    """

    key: str
    task: str
    task_id: str
    host: str
    pid: int
    fencing_token: int
    ttl: float
    token: str


def _info(key: str, value: bytes | str, pttl: int) -> LeaseInfo:
    holder = store.parse_value(value)
    return LeaseInfo(key=key, task=holder.task_name, task_id=holder.task_id,
                     host=holder.hostname, pid=holder.pid, fencing_token=holder.fencing_token,
                     ttl=pttl / 1000 if pttl >= 0 else -1.0, token=holder.token)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def read_lease(client: redis.Redis, key: str) -> LeaseInfo | None:
    """The lease stored at ``key``, or ``None`` when the key is absent.

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    pipe = client.pipeline(transaction=True)  # value and lifetime from the same instant
    pipe.get(key)
    pipe.pttl(key)
    value, pttl = pipe.execute()
    if value is None:
        return None
    return _info(key, value, int(pttl))


def scan_leases(client: redis.Redis, prefix: str, count: int = SCAN_COUNT) -> Iterator[LeaseInfo]:
    """Every lease under ``prefix`` (``"<prefix>:*"``), found with ``SCAN``, never ``KEYS``.

    Keys are read in batches with one pipelined round trip per batch. A key that expires
    between the scan and the read is skipped. Internal keys (fencing counters, beat state)
    are left out.

    Args:
        client: a Redis client.
        prefix: a ``lease_key_prefix``.
        count: the ``COUNT`` hint of each ``SCAN`` step (int).

    Raises:
        redis.exceptions.RedisError: on store errors.
    """
    batch: list[str] = []

    def read(keys: list[str]) -> Iterator[LeaseInfo]:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
            pipe.pttl(key)
        replies = pipe.execute()
        for i, key in enumerate(keys):
            value, pttl = replies[2 * i], replies[2 * i + 1]
            if value is not None:
                yield _info(key, value, int(pttl))

    for raw in connection.scan(client, _glob_escape(prefix) + ":*", count, "STRING"):
        key = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if key.endswith(_INTERNAL_SUFFIXES):
            continue
        batch.append(key)
        if len(batch) >= _BATCH:
            yield from read(batch)
            batch = []
    if batch:
        yield from read(batch)


# -- helpers --------------------------------------------------------------------------------


def _app(ctx: click.Context) -> Any:
    obj = ctx.find_root().obj
    app = getattr(obj, "app", None)
    if app is None:
        raise click.UsageError("no Celery app: run it as `celery -A proj lease ...`")
    app.loader.import_default_modules()  # register the tasks of `include` / autodiscovery
    return app


def _leased_tasks(app: Any) -> list[Any]:
    from .task import LeasedTask

    return sorted((t for t in app.tasks.values() if isinstance(t, LeasedTask)),
                  key=lambda t: str(t.name))


def _app_options(app: Any) -> LeaseOptions:
    return resolve_options(app.conf, {}, "app settings")


def _stores(app: Any, url: str | None, prefixes: Sequence[str]) -> dict[str, set[str]]:
    """Store URL -> key prefixes, from the settings and every leased task."""
    found: dict[str, set[str]] = {}

    def add(options: LeaseOptions, where: str) -> None:
        target = url or resolve_backend(options, app.conf, where)
        found.setdefault(target, set()).update(prefixes or (options.key_prefix,))

    try:
        add(_app_options(app), "app settings")
    except LeaseConfigError:
        if not _leased_tasks(app) and not url:
            raise
    for task in _leased_tasks(app):
        where = f"task {task.name}"
        add(resolve_options(app.conf, task._lease_task_options(), where), where)
    if url and not found:
        found[url] = set(prefixes or ("lease",))
    return found


def _client(url: str, app: Any = None) -> redis.Redis:
    options = app.conf.get("lease_backend_options") if app is not None else None
    return store.client_for(url, CLI_TIMEOUT, options)


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


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _describe(info: LeaseInfo) -> str:
    return (f"task {info.task or '?'} [{info.task_id or '?'}] on {info.host or '?'} "
            f"(pid {info.pid}), fencing token {info.fencing_token}, "
            f"expires in {_human(info.ttl)}")


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
            _fail(f"configuration error: {exc}", 2)
        except LeaseError as exc:
            _fail(f"error: {exc}", 2)
        except RedisError as exc:
            _fail(f"lease store error: {exc!r}. Check lease_backend / --url and that Redis "
                  f"is reachable", 1)

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
@click.option("--url", default=None, help=_URL_HELP)
@click.option("--prefix", "prefixes", multiple=True,
              help="Key prefix to scan (repeatable; default: every configured prefix).")
@click.pass_context
@handle_preload_options  # type: ignore[untyped-decorator]
@_config_guard
def ls(ctx: click.Context, task_name: str | None, as_json: bool, url: str | None,
       prefixes: tuple[str, ...], **kwargs: Any) -> None:
    """List held leases: task, task id, holder host and pid, fencing token, time left."""
    app = _app(ctx)
    found: list[LeaseInfo] = []
    for store_url, store_prefixes in _stores(app, url, prefixes).items():
        client = _client(store_url, app)
        for prefix in sorted(store_prefixes):
            for info in scan_leases(client, prefix):
                if task_name is None or info.task == task_name:
                    found.append(info)
    found.sort(key=lambda i: (i.task, i.key))
    if as_json:
        click.echo(json.dumps([asdict(i) for i in found], indent=2))
        return
    if not found:
        click.echo("no leases held" + (f" by {task_name}" if task_name else ""))
        return
    rows = [(i.task or "?", i.task_id or "?", i.host or "?", str(i.pid), str(i.fencing_token),
             _human(i.ttl), i.key) for i in found]
    click.echo(_table(("TASK", "TASK ID", "HOST", "PID", "FENCING TOKEN", "TIME LEFT", "KEY"),
                      rows))
    click.echo(f"{len(found)} lease(s)")


def _parse_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


@lease.command(name="show", cls=CeleryCommand)
@click.argument("task_name", metavar="TASK")
@click.argument("args", nargs=-1)
@click.option("--kwargs", "kwargs_json", default=None,
              help='Keyword arguments as a JSON object, e.g. \'{"account": 7}\'.')
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@handle_preload_options  # type: ignore[untyped-decorator]
@_config_guard
def show(ctx: click.Context, task_name: str, args: tuple[str, ...], kwargs_json: str | None,
         as_json: bool, **kwargs: Any) -> None:
    """Show the lease key a call would take, and who holds it now.

    Each ARG is parsed as JSON when it can be (7, "7", [1,2], null), else taken as a string.
    """
    app = _app(ctx)
    from .task import LeasedTask

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
    info = read_lease(store.client_for(url, CLI_TIMEOUT, options.backend_options), key)
    if as_json:
        click.echo(json.dumps({"key": key, "holder": asdict(info) if info else None}, indent=2))
        return
    click.echo(f"key:    {key}")
    click.echo(f"holder: {_describe(info) if info else 'none (free)'}")


@lease.command(name="release", cls=CeleryCommand)
@click.argument("key")
@click.option("--yes", "-y", "assume_yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--url", default=None, help=_URL_HELP)
@click.pass_context
@handle_preload_options  # type: ignore[untyped-decorator]
@_config_guard
def release(ctx: click.Context, key: str, assume_yes: bool, url: str | None,
            **kwargs: Any) -> None:
    """Release a stuck lease KEY, only if its holder is still the one shown.

    The holder's token is read, shown, and the release deletes the key only while that same
    token holds it: if the lease changed in between (renewed by a new holder, released,
    expired), nothing is deleted and the command exits 1.
    """
    app = _app(ctx)
    if key.endswith(_INTERNAL_SUFFIXES):
        _fail(f"{key} is an internal celery-lease key, not a lease", 2)
    current: LeaseInfo | None = None
    client: redis.Redis | None = None
    for store_url in _stores(app, url, ()):
        client = _client(store_url, app)
        current = read_lease(client, key)
        if current is not None:
            break
    if current is None or client is None:
        _fail(f"no lease at {key}", 1)
        return
    click.echo(f"{key} is held by {_describe(current)}")
    if not assume_yes and not click.confirm("Release it?", default=False):
        _fail("not released", 1)
    if store.release(client, key, current.token):
        click.echo(f"released {key}")
        return
    now = read_lease(client, key)
    _fail(f"refused: the lease changed since it was shown; now "
          f"{_describe(now) if now else 'free'}. Nothing was deleted", 1)


# -- doctor ---------------------------------------------------------------------------------


class _Report:
    def __init__(self, ctx_obj: Any) -> None:
        self.failures = 0
        self.warnings = 0
        self.obj = ctx_obj

    def line(self, level: str, subject: str, message: str, fix: str = "") -> None:
        colors = {"ok": "green", "warn": "yellow", "fail": "red", "info": "blue"}
        if level == "fail":
            self.failures += 1
        elif level == "warn":
            self.warnings += 1
        tag = f"{level.upper():<4}"
        style = getattr(self.obj, "style", None)
        if style is not None and not getattr(self.obj, "no_color", True):
            tag = style(tag, fg=colors[level], bold=True)
        click.echo(f"{tag} {subject}: {message}")
        if fix:
            click.echo(f"     fix: {fix}")


def _check_store(report: _Report, url: str, timeout: float, app: Any = None) -> None:
    subject = f"store {_safe(url)}"
    client = _client(url, app)
    try:
        check = store.check_store(client)
    except RedisError as exc:
        report.line("fail", subject, f"unreachable: {exc!r}",
                    "start Redis or set lease_backend to a reachable redis:// URL")
        return
    report.line("ok", subject, "reachable")
    topology = connection.describe_topology(client)
    report.line("info", subject, f"{topology.kind}, TLS {'on' if topology.tls else 'off'}, "
                f"primaries {', '.join(topology.primaries)}, replicas "
                f"{', '.join(topology.replicas) or 'none seen'}, eviction policy "
                f"{topology.eviction_policy}"
                f"{f' (read via {topology.policy_source})' if topology.policy_source else ''}")
    version = tuple(int(p) for p in check.version.split(".")[:2] if p.isdigit())
    if version and version < MIN_REDIS:
        report.line("fail", subject, f"Redis {check.version} is too old",
                    "use Redis 3.2 or later (6.2+ recommended)")
    else:
        report.line("ok", subject, f"Redis {check.version}")
    if check.safe:
        report.line("ok", subject, "maxmemory-policy noeviction")
    elif check.eviction_policy == "unknown":
        report.line("warn", subject, "maxmemory-policy could not be read (CONFIG disabled?)",
                    "make sure the server runs with maxmemory-policy noeviction")
    else:
        report.line("fail", subject,
                    f"maxmemory-policy {check.eviction_policy} may evict a live lease",
                    "CONFIG SET maxmemory-policy noeviction (and in redis.conf), or use a "
                    "dedicated Redis for lease_backend")
    samples = []
    try:
        for _ in range(20):
            started = clock.now()
            client.ping()
            samples.append(clock.now() - started)
        before = time.time()
        seconds, micros = client.time()
        after = time.time()
    except RedisError as exc:
        report.line("fail", subject, f"stopped answering during the latency check: {exc!r}")
        return
    worst, median = max(samples), statistics.median(samples)
    detail = f"latency median {median * 1000:.2f} ms, max {worst * 1000:.2f} ms"
    if worst >= timeout:
        report.line("fail", subject, f"{detail}: at or above lease_store_timeout={timeout}s",
                    "move the store closer or raise lease_ttl (the timeout is derived from it)")
    elif worst >= timeout / 2:
        report.line("warn", subject, f"{detail}: above half of lease_store_timeout={timeout}s",
                    "raise lease_ttl / lease_store_timeout, or move the store closer")
    else:
        report.line("ok", subject, detail)
    server = seconds + micros / 1e6
    skew = server - (before + after) / 2
    if abs(skew) > 2.0 + (after - before):
        report.line("warn", subject,
                    f"server clock differs from this host's by {skew:+.3f}s (lease deadlines do "
                    f"not use wall clocks, but fencing tokens are server time and logs will "
                    f"not line up)", "run NTP on both hosts")
    else:
        report.line("ok", subject, f"clock skew {skew:+.3f}s; local deadlines use "
                    f"{clock.CLOCK_NAME}")


def _visibility_timeout(app: Any) -> float | None:
    broker = str(app.conf.get("broker_url") or "")
    if not broker.startswith(("redis://", "rediss://", "redis+socket://", "unix://", "sqs://")):
        return None
    options = app.conf.get("broker_transport_options") or {}
    return float(options.get("visibility_timeout", 3600))


def _check_task(report: _Report, app: Any, task: Any, vt: float | None) -> float | None:
    subject = f"task {task.name}"
    try:
        options = resolve_options(app.conf, task._lease_task_options(), subject)
        resolve_backend(options, app.conf, subject)
    except LeaseConfigError as exc:
        report.line("fail", subject, str(exc))
        return None
    timing = (f"lease_ttl={options.ttl:g}s lease_renew_interval={options.renew_interval:g}s "
              f"lease_store_timeout={options.store_timeout:g}s")
    if options.renew_interval > options.ttl / 3 + 1e-9:
        report.line("warn", subject, f"{timing}: the interval is above a third of the TTL, two "
                    "failed renewals in a row lose the lease",
                    f"lease_renew_interval={options.ttl / 3:.3f} or leave it unset")
    else:
        report.line("ok", subject, timing)
    hard = task.time_limit or app.conf.get("task_time_limit")
    soft = task.soft_time_limit or app.conf.get("task_soft_time_limit")
    limit = hard or soft
    if limit and options.ttl > float(limit):
        report.line("warn", subject,
                    f"lease_ttl={options.ttl:g}s is longer than the task's time limit "
                    f"({float(limit):g}s): after a killed run the key blocks the next run for "
                    f"up to lease_ttl",
                    "lower lease_ttl (it only has to cover the longest pause between "
                    "renewals, not the run)")
    if vt is not None:
        acks_late = bool(task.acks_late if task.acks_late is not None
                         else app.conf.get("task_acks_late"))
        if options.on_conflict == "retry" and options.ttl >= vt:
            report.line("fail", subject,
                        f"lease_on_conflict='retry' waits up to lease_ttl={options.ttl:g}s in "
                        f"an ETA message, which the broker redelivers after visibility_timeout="
                        f"{vt:g}s", f"broker_transport_options={{'visibility_timeout': "
                        f"{max(vt, options.ttl * 4):g}}} or a shorter lease_ttl")
        limit_text = "no hard time limit" if hard is None else f"time_limit={hard}s"
        if acks_late and (hard is None or float(hard) >= vt):
            report.line("warn", subject,
                        f"acks_late with {limit_text} >= visibility_timeout={vt:g}s: a long "
                        f"run is redelivered while it runs (the lease refuses the copy, but it "
                        f"takes a slot)",
                        "set time_limit below visibility_timeout, or raise visibility_timeout "
                        "in broker_transport_options")
    return options.store_timeout


def _check_beat(report: _Report, app: Any) -> None:
    from .beat import beat_lease_key, beat_options

    scheduler = str(app.conf.get("beat_scheduler") or "")
    configured = "LeasedScheduler" in scheduler or any(
        app.conf.get(name) is not None for name in ("lease_beat_ttl", "lease_beat_key"))
    if not configured:
        return
    try:
        options = beat_options(app)
        resolve_backend(options, app.conf, "celery beat leader lease")
    except LeaseConfigError as exc:
        report.line("fail", "beat", str(exc))
        return
    report.line("ok", "beat", f"leader lease {beat_lease_key(app)} ttl={options.ttl:g}s "
                f"renew_interval={options.renew_interval:g}s (a standby takes over within "
                f"{options.ttl:g}s)")


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
    visibility_timeout, and the beat leader lease. Exits 1 when a check fails.
    """
    app = _app(ctx)
    report = _Report(ctx.find_root().obj)
    tasks = _leased_tasks(app)
    if not tasks:
        report.line("warn", "app", f"no LeasedTask is registered in app {app.main!r}",
                    "pass -A with the module that defines the tasks, or add it to include")
    vt = _visibility_timeout(app)
    timeouts: dict[str, float] = {}
    for task in tasks:
        timeout = _check_task(report, app, task, vt)
        if timeout is not None:
            task_url = url or resolve_backend(
                resolve_options(app.conf, task._lease_task_options(), task.name), app.conf,
                task.name)
            timeouts[task_url] = min(timeouts.get(task_url, timeout), timeout)
    _check_beat(report, app)
    if not timeouts:
        try:
            options = _app_options(app)
            timeouts[url or resolve_backend(options, app.conf, "app settings")] = \
                options.store_timeout
        except LeaseConfigError as exc:
            report.line("fail", "app", str(exc))
    for store_url, timeout in timeouts.items():
        _check_store(report, store_url, timeout, app)
    summary = f"{report.failures} problem(s), {report.warnings} warning(s)"
    click.echo(summary)
    if report.failures or (strict and report.warnings):
        sys.exit(1)
